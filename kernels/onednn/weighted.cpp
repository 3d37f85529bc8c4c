// What a convolution and a fully connected layer share on oneDNN (compile_conv, compile_fc): the
// descriptors oneDNN picks layouts from, and the three passes around the primitives they choose:
// forward, backward-weights (with the bias's gradient) and backward-data, each with the reorders
// that bridge the store's weight layout and the neighbours' tensor layouts.
#include "kernels/onednn/executor_impl.hpp"

namespace gg::kernels::onednn_detail {

// Layer `id` (node `n`) with weights of `w_dims`, held in the store in `w_tag`, and, with `bias`,
// a bias of `outputs` values.
Weighted OneDnnExecutor::weighted(int id, const Node& n, const memory::dims& w_dims, tag w_tag,
                                  bool bias, int64_t outputs) const {
  Weighted l;
  l.id = id;
  l.in = n.inputs[0];
  l.w_param = n.params[0];
  l.bias = bias;
  if (bias) l.b_param = n.params[1];
  l.src_any = memory::desc(batched(batch_, g_.node(l.in).out), act_, tag::any);
  l.w_any = memory::desc(w_dims, act_, tag::any);
  l.dw_any = memory::desc(w_dims, dt::f32, tag::any);  // gradients stay fp32
  l.w_plain = memory::desc(w_dims, dt::f32, w_tag);
  if (bias) l.b_md = memory::desc({outputs}, dt::f32, tag::x);
  return l;
}

// The forward `fwd` (whose descriptor is `pd`): the input conformed to pd's layout, the weights
// reordered into pd's before each step where the store holds another, the output fresh in
// `dst_md`.
void OneDnnExecutor::weighted_forward(Weighted& l, const dnnl::primitive_desc_base& pd,
                                      dnnl::primitive fwd, const memory::desc& dst_md) {
  l.src = conform(l.in, pd.src_desc(), l.in == 0 ? nullptr : &l.diff_src, &l.tail);
  std::vector<Action> pre;
  l.w_user = param_mem(l.w_param, l.w_plain, false);
  l.w = as(l.w_user, pd.weights_desc(), pre);
  for (Action& a : pre) fwd_.push_back({std::move(a), When::Always});
  Value& out = values_[l.id];
  out.md = dst_md;
  out.mem = fresh(out.md);
  Args fa{{DNNL_ARG_SRC, l.src}, {DNNL_ARG_WEIGHTS, l.w}, {DNNL_ARG_DST, out.mem}};
  if (l.bias) fa[DNNL_ARG_BIAS] = param_mem(l.b_param, l.b_md, false);
  push_fwd(std::move(fwd), std::move(fa));
}

// Backward-weights `bwd` (descriptor `pd`): the output's gradient and the input in pd's layouts,
// the weights' gradient written into the store in place or by a reorder after, the bias's
// gradient straight into it.
void OneDnnExecutor::weighted_backward_weights(Weighted& l, const dnnl::primitive_desc_base& pd,
                                               dnnl::primitive bwd) {
  std::vector<Action>& list = bwd_[l.id];
  l.ddst = as(diff_of(l.id), pd.diff_dst_desc(), list);
  const memory src_w = as(l.src, pd.src_desc(), list);
  const memory dw_user = param_mem(l.w_param, l.w_plain, true);
  std::vector<Action> after_w;
  const memory dw = into(dw_user, pd.diff_weights_desc(), after_w);
  Args wa{{DNNL_ARG_SRC, src_w}, {DNNL_ARG_DIFF_DST, l.ddst}, {DNNL_ARG_DIFF_WEIGHTS, dw}};
  if (l.bias) wa[DNNL_ARG_DIFF_BIAS] = param_mem(l.b_param, l.b_md, true);
  list.push_back(Action{std::move(bwd), std::move(wa), {}, {}});
  for (Action& a : after_w) list.push_back(std::move(a));
}

// Backward-data `bwd` (descriptor `pd`), for an input that is not the data: the output's gradient
// and the weights in pd's layouts (the forward's copy of the weights where it is in that layout),
// the input's gradient reordered into place after where pd writes another layout.
void OneDnnExecutor::weighted_backward_data(Weighted& l, const dnnl::primitive_desc_base& pd,
                                            dnnl::primitive bwd) {
  std::vector<Action>& list = bwd_[l.id];
  const memory ddst_d = as(l.ddst, pd.diff_dst_desc(), list);
  const memory wd =
      pd.weights_desc() == l.w.get_desc() ? l.w : as(l.w_user, pd.weights_desc(), list);
  std::vector<Action> after_d;
  const memory dsrc = into(l.diff_src, pd.diff_src_desc(), after_d);
  list.push_back(
      Action{std::move(bwd),
             {{DNNL_ARG_DIFF_DST, ddst_d}, {DNNL_ARG_WEIGHTS, wd}, {DNNL_ARG_DIFF_SRC, dsrc}},
             {},
             {}});
  for (Action& a : after_d) list.push_back(std::move(a));
  for (Action& a : l.tail) list.push_back(std::move(a));
}

}  // namespace gg::kernels::onednn_detail
