// The residual add on oneDNN: a sum primitive, or left to the ReLU that is its only reader; its
// gradient passes to both inputs unchanged.
#include "kernels/onednn/executor_impl.hpp"

namespace gg::kernels::onednn_detail {

void OneDnnExecutor::compile_add(int id, const Node& n) {
  const Value& a = values_[n.inputs[0]];
  const Value& b = values_[n.inputs[1]];
  Value& out = values_[id];
  if (a.md == b.md && out.consumers == 1 && reader_is_relu(id)) {
    out.md = a.md;  // the ReLU's forward adds: add_relu_keeping_nan
    out.mem = fresh(out.md);
    out.add_terms = {a.mem, b.mem};
  } else {
    const auto pd = api::sum(eng_, a.md, {1.f, 1.f}, {a.md, b.md}, attr_);
    out.md = pd.dst_desc();
    out.mem = fresh(out.md);
    push_fwd(dnnl::sum(pd), {{DNNL_ARG_MULTIPLE_SRC, a.mem},
                             {DNNL_ARG_MULTIPLE_SRC + 1, b.mem},
                             {DNNL_ARG_DST, out.mem}});
  }
  // d(a + b) passes the gradient unchanged to both inputs: an input in the same layout takes
  // the add's gradient itself (as its gradient, or as one of the edges its sum reads), unless
  // its own backward overwrites its gradient in place while the other input still needs it;
  // else a reorder copies it.
  for (int in : n.inputs) {
    if (in == 0) continue;
    Value& v = values_[in];
    if (v.md == out.md && v.consumers > 1) {
      v.edges.push_back(diff_of(id));
      continue;
    }
    if (v.md == out.md && !v.diff_in_place) {
      merge(diff_of(id), diff_of(in));
      continue;
    }
    memory target = edge(in);
    memory from = diff_of(id);
    bwd_[id].push_back(
        Action{reorder(from, target), {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, target}}, {}, {}});
  }
}

}  // namespace gg::kernels::onednn_detail
