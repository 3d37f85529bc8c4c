// ReLU on oneDNN: applied by the batch norm before it where that fused it, else our own pass
// that keeps NaN (kernels/onednn/eltwise.hpp), in place when nothing else reads its input, and
// oneDNN's backward.
#include "kernels/onednn/eltwise.hpp"
#include "kernels/onednn/executor_impl.hpp"

namespace gg::kernels::onednn_detail {

void OneDnnExecutor::compile_relu(int id, const Node& n) {
  const int in = n.inputs[0];
  Value& src = values_[in];
  if (src.relu_fused) {  // the batch norm before it applied it already, forward and backward
    Value& out = values_[id];
    out.md = src.md;
    out.mem = src.mem;
    out.diff = diff_of(in);  // what the ReLU's readers write is what the batch norm reads
    return;
  }
  // In place when nothing else reads the input: backward then works from the output.
  const bool in_place = in != 0 && src.consumers == 1;
  const auto alg =
      in_place ? dnnl::algorithm::eltwise_relu_use_dst_for_bwd : dnnl::algorithm::eltwise_relu;
  const api::EltFwd fpd = api::eltwise_fwd(eng_, alg, src.md, 0.f, attr_);
  Value& out = values_[id];
  out.md = fpd.dst_desc();
  out.mem = in_place ? src.mem : fresh(out.md);
  if (in_place) {
    out.diff = diff_of(in);
    out.diff_in_place = true;
    out.relu_in_place = in != 0;
  }
  // Forward is relu_keeping_nan (oneDNN's maps NaN to 0); oneDNN's backward already passes
  // the gradient at a NaN, as PyTorch does.
  // An add that left its sum to this ReLU (compile_add) is computed here, in the same pass.
  const std::vector<memory> terms = src.add_terms;
  std::vector<memory> uses = terms.empty() ? std::vector<memory>{src.mem} : terms;
  uses.push_back(out.mem);
  fwd_.push_back(
      {Action{{},
              {},
              [this, id, terms, x = src.mem, y = out.mem, report = feeds_max_pool(id)]() {
                nan_[id] = terms.empty() ? relu_keeping_nan(x, y, report)
                                         : add_relu_keeping_nan(terms[0], terms[1], y, report);
              },
              std::move(uses)},
       When::Always});
  if (in == 0) return;
  const api::EltBwd bpd = api::eltwise_bwd(eng_, alg, out.md, src.md, 0.f, fpd, attr_);
  Args ba{{DNNL_ARG_DIFF_DST, diff_of(id)}, {DNNL_ARG_DIFF_SRC, in_place ? diff_of(in) : edge(in)}};
  ba[in_place ? DNNL_ARG_DST : DNNL_ARG_SRC] = in_place ? out.mem : src.mem;
  bwd_[id].push_back(Action{dnnl::eltwise_backward(bpd), std::move(ba), {}, {}});
}

}  // namespace gg::kernels::onednn_detail
