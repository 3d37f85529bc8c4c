// The fully connected layer on oneDNN (inner product): the primitives of its three passes, its
// weights kept in PyTorch's layout where that costs nothing; the passes' buffers and reorders are
// weighted.cpp's, shared with the convolution.
#include <string>

#include "kernels/onednn/executor_impl.hpp"

namespace gg::kernels::onednn_detail {
namespace {

// A fully connected layer's weights and their gradient stay in PyTorch's layout where oneDNN
// runs the same implementation on it as on the layout it prefers: its gemm (AVX2), which asks
// for a transposed copy, reads the plain weights as fast. The weights are then not reordered
// into that copy before every step, nor their gradient back out of it after. Where the plain
// layout would get another implementation (AVX-512's brgemm wants its own blocks), nothing
// changes. fp32 only (`act`, the activations' type): bf16 runs convert anyway.
template <class Pd, class Make>
Pd prefer_plain(dt act, Pd preferred, Make plain) {
  if (act != dt::f32) return preferred;
  try {
    Pd candidate = plain();
    if (std::string(candidate.impl_info_str()) == preferred.impl_info_str() &&
        candidate.src_desc() == preferred.src_desc())
      return candidate;
  } catch (const dnnl::error&) {  // no implementation takes the plain layout
  }
  return preferred;
}

}  // namespace

void OneDnnExecutor::compile_fc(int id, const Node& n) {
  const Dims& xin = g_.node(n.inputs[0]).out;
  const int64_t o = n.fc.out_features;
  memory::dims w_dims{o};
  w_dims.insert(w_dims.end(), xin.begin(), xin.end());
  Weighted l = weighted(id, n, w_dims, xin.size() == 3 ? tag::oihw : tag::oi, n.fc.bias, o);
  // The output is fp32 in either precision (the logits are); its gradient is taken in the
  // activations' type.
  const memory::desc dst_md({batch_, o}, dt::f32, tag::nc), ddst_md({batch_, o}, act_, tag::nc);

  const auto forward = [&](const memory::desc& w_md) {
    return api::ip_fwd(eng_, l.src_any, w_md, l.b_md, dst_md, attr_);
  };
  const api::IpFwd fpd = prefer_plain(act_, forward(l.w_any), [&] { return forward(l.w_plain); });
  weighted_forward(l, fpd, dnnl::inner_product_forward(fpd), dst_md);

  const auto backward_weights = [&](const memory::desc& dw_md) {
    return api::ip_bwd_weights(eng_, l.src_any, dw_md, l.b_md, ddst_md, fpd, attr_);
  };
  const api::IpBwdW wpd =
      prefer_plain(act_, backward_weights(l.dw_any), [&] { return backward_weights(l.w_plain); });
  weighted_backward_weights(l, wpd, dnnl::inner_product_backward_weights(wpd));
  if (l.in == 0) return;
  const api::IpBwdD dpd = api::ip_bwd_data(eng_, l.src_any, l.w_any, ddst_md, fpd, attr_);
  weighted_backward_data(l, dpd, dnnl::inner_product_backward_data(dpd));
}

}  // namespace gg::kernels::onednn_detail
