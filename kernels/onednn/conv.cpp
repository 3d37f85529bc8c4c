// Convolution on oneDNN: the algorithm (Winograd where it pays, else direct) and the primitives
// of its three passes; the passes' buffers and reorders are weighted.cpp's, shared with the fully
// connected layer.
#include <stdexcept>
#include <string>

#include "kernels/onednn/executor_impl.hpp"
#include "kernels/onednn/onednn_executor.hpp"

namespace gg::kernels {
namespace onednn_detail {
namespace {

// A convolution's primitive descriptor by Winograd where `prefer` and oneDNN has such a kernel
// for it, else by `alg`.
template <class Make>
auto prefer_winograd(dnnl::algorithm alg, bool prefer, Make make) {
  if (prefer) {
    try {
      return make(dnnl::algorithm::convolution_winograd);
    } catch (const dnnl::error&) {
    }
  }
  return make(alg);
}

// The weights' layout in the flat buffers: plain, or blocks of 16 x 16 or 8 x 8 (ParamLayout).
tag weight_tag(int block) {
  switch (block) {
    case 16:
      return tag::OIhw16i16o;
    case 8:
      return tag::OIhw8i8o;
    case 0:
      return tag::oihw;
    default:
      throw std::invalid_argument("unsupported parameter layout");
  }
}

}  // namespace

void OneDnnExecutor::compile_conv(int id, const Node& n) {
  const int in = n.inputs[0];
  const Dims& xin = g_.node(in).out;
  const ConvAttr& c = n.conv;
  const memory::desc dst_any(batched(batch_, n.out), act_, tag::any);
  const memory::dims strides{c.stride, c.stride}, pad{c.pad, c.pad};
  // The weights (and their gradients) as the flat buffers hold them, which is what the forward
  // and backward-weights kernels want here.
  Weighted l = weighted(id, n, {c.out_channels, xin[0], c.kernel, c.kernel},
                        weight_tag(store_.layout.block_of(n.params[0])), c.bias, c.out_channels);
  // 3x3 stride-1 fp32 convolutions may use Winograd where oneDNN judges it faster (ResNet-50 at
  // 224: about 10% off a training step; the oneDNN-vs-reference and torchvision tests hold),
  // except where winograd_pays says direct is faster in the step.
  const auto alg = c.kernel == 3 && c.stride == 1 && act_ == dt::f32 &&
                           onednn::winograd_pays(xin[0], n.out[0], n.out[1], n.out[2])
                       ? dnnl::algorithm::convolution_auto
                       : dnnl::algorithm::convolution_direct;

  const api::ConvFwd fpd =
      api::conv_fwd(eng_, alg, l.src_any, l.w_any, l.b_md, dst_any, strides, pad, pad, attr_);
  weighted_forward(l, fpd, dnnl::convolution_forward(fpd), fpd.dst_desc());

  // Backward picks its own layouts too; reorders bridge any difference from the forward's.
  // Where oneDNN picked Winograd for the forward, the backward passes use it too if they can
  // (oneDNN's own choice leaves backward-weights direct at 56x56 and 28x28 in ResNet-50, about
  // 3% of a step at 224 px; forcing Winograd on layers whose forward is direct gains nothing).
  const bool wino_fwd = std::string(fpd.impl_info_str()).find("wino") != std::string::npos;
  const api::ConvBwdW wpd = prefer_winograd(alg, wino_fwd, [&](dnnl::algorithm a) {
    return api::conv_bwd_weights(eng_, a, l.src_any, l.dw_any, l.b_md, dst_any, strides, pad, pad,
                                 fpd, attr_);
  });
  weighted_backward_weights(l, wpd, dnnl::convolution_backward_weights(wpd));
  if (in == 0) return;  // no gradient w.r.t. the data
  const api::ConvBwdD dpd = prefer_winograd(alg, wino_fwd, [&](dnnl::algorithm a) {
    return api::conv_bwd_data(eng_, a, l.src_any, l.w_any, dst_any, strides, pad, pad, fpd, attr_);
  });
  weighted_backward_data(l, dpd, dnnl::convolution_backward_data(dpd));
}

}  // namespace onednn_detail

bool onednn::winograd_pays(int64_t in_channels, int64_t out_channels, int64_t height,
                           int64_t width) {
  return in_channels >= 32 && out_channels >= 64 && height >= 7 && width >= 7;
}

}  // namespace gg::kernels
