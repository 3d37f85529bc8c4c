// Channel concat on oneDNN: one concat primitive forward, reorders out of views of its gradient
// backward.
#include <algorithm>
#include <stdexcept>

#include "kernels/onednn/executor_impl.hpp"

namespace gg::kernels::onednn_detail {

// Channel slice i of a tensor of layout `md` holding the concatenation of `n`'s inputs, or an
// empty vector when the layout cannot be sliced there (a blocked layout whose block straddles
// a boundary between inputs).
std::vector<memory::desc> OneDnnExecutor::channel_slices(const memory::desc& md,
                                                         const Node& n) const {
  std::vector<memory::desc> slices;
  memory::dim first = 0;
  for (int in : n.inputs) {
    const memory::dims dims = batched(batch_, g_.node(in).out);
    const std::optional<memory::desc> sub = api::submemory(md, dims, {0, first, 0, 0});
    if (!sub) return {};
    slices.push_back(*sub);
    first += dims[1];
  }
  return slices;
}

// The format tag all of n's inputs are laid out in, if they share one of the usual ones.
std::optional<tag> OneDnnExecutor::common_tag(const Node& n) const {
  for (tag t : {tag::nChw16c, tag::nChw8c, tag::nhwc, tag::nchw}) {
    const bool all = std::all_of(n.inputs.begin(), n.inputs.end(), [&](int in) {
      const memory::desc& md = values_[in].md;
      return md == memory::desc(batched(batch_, g_.node(in).out), api::type_of(md), t);
    });
    if (all) return t;
  }
  return std::nullopt;
}

// Forward: one concat primitive, reading every input in its own layout. Backward: each input's
// gradient is a reorder out of a view (submemory) of the concat's gradient, no copy in between.
// The output keeps the inputs' common layout (so that consumers that want it need no reorder),
// else takes oneDNN's choice, else NCHW: the first of these that can be sliced at every input.
void OneDnnExecutor::compile_concat(int id, const Node& n) {
  std::vector<memory::desc> srcs;
  Args fa;
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    srcs.push_back(values_[n.inputs[i]].md);
    fa[DNNL_ARG_MULTIPLE_SRC + static_cast<int>(i)] = values_[n.inputs[i]].mem;
  }
  const memory::dims dims = batched(batch_, n.out);
  const dt type = api::type_of(srcs[0]);
  std::vector<memory::desc> candidates;
  if (const std::optional<tag> t = common_tag(n)) candidates.emplace_back(dims, type, *t);
  candidates.emplace_back(dims, type, tag::any);
  candidates.emplace_back(dims, type, tag::nchw);  // always sliceable
  dnnl::concat::primitive_desc pd;
  std::vector<memory::desc> slices;
  for (const memory::desc& dst : candidates) {
    pd = api::concat(eng_, dst, 1, srcs, attr_);
    slices = channel_slices(pd.dst_desc(), n);
    if (!slices.empty()) break;
  }
  if (slices.empty()) throw std::logic_error(n.name + ": NCHW concat cannot be sliced");
  Value& out = values_[id];
  out.md = pd.dst_desc();
  out.mem = fresh(out.md);
  fa[DNNL_ARG_DST] = out.mem;
  push_fwd(dnnl::concat(pd), std::move(fa));
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    if (n.inputs[i] == 0) continue;
    memory from = alias(slices[i], diff_of(id));
    memory target = edge(n.inputs[i]);
    bwd_[id].push_back(
        Action{reorder(from, target), {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, target}}, {}, {}});
  }
}

}  // namespace gg::kernels::onednn_detail
