// Local response normalisation across channels on oneDNN.
#include "kernels/onednn/executor_impl.hpp"

namespace gg::kernels::onednn_detail {

// oneDNN's LRN across channels on the input's own layout, its workspace kept for backward.
void OneDnnExecutor::compile_lrn(int id, const Node& n) {
  const int in = n.inputs[0];
  const Value& src = values_[in];
  const auto alg = dnnl::algorithm::lrn_across_channels;
  const LrnAttr& a = n.lrn;
  const api::LrnFwd fpd = api::lrn_fwd(eng_, alg, src.md, a.size, a.alpha, a.beta, a.k, attr_);
  Value& out = values_[id];
  out.md = fpd.dst_desc();
  out.mem = fresh(out.md);
  Args fa{{DNNL_ARG_SRC, src.mem}, {DNNL_ARG_DST, out.mem}};
  memory ws;
  if (fpd.workspace_desc().get_size() > 0) {
    ws = fresh(fpd.workspace_desc());
    fa[DNNL_ARG_WORKSPACE] = ws;
  }
  push_fwd(dnnl::lrn_forward(fpd), std::move(fa));
  if (in == 0) return;
  const api::LrnBwd bpd =
      api::lrn_bwd(eng_, alg, src.md, out.md, a.size, a.alpha, a.beta, a.k, fpd, attr_);
  std::vector<Action>& bwd = bwd_[id];
  const memory ddst = as(diff_of(id), bpd.diff_dst_desc(), bwd);
  std::vector<Action> after;
  const memory dsrc = into(edge(in), bpd.diff_src_desc(), after);
  Args ba{{DNNL_ARG_SRC, src.mem}, {DNNL_ARG_DIFF_DST, ddst}, {DNNL_ARG_DIFF_SRC, dsrc}};
  if (ws) ba[DNNL_ARG_WORKSPACE] = ws;
  bwd.push_back(Action{dnnl::lrn_backward(bpd), std::move(ba), {}, {}});
  for (Action& x : after) bwd.push_back(std::move(x));
}

}  // namespace gg::kernels::onednn_detail
