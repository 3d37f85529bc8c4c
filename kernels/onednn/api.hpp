#pragma once
// The oneDNN calls whose form changed between 2.x (Debian bookworm's 2.6.3, the default) and 3.x
// (bench/onednn_env.sh builds 3.7.2): 3.0 dropped the operation descriptors, so a primitive
// descriptor is made from the engine and the shapes directly, and memory descriptors became
// opaque (queried, not read). Everything else in kernels/onednn is the same source for both; each
// function here is one primitive's constructor in either form.

#include <oneapi/dnnl/dnnl.hpp>
#include <optional>
#include <vector>

#if DNNL_VERSION_MAJOR >= 3
#define GG_ONEDNN3 1
#else
#define GG_ONEDNN3 0
#endif

namespace gg::kernels::onednn {

using dnnl::algorithm;
using dnnl::engine;
using dnnl::memory;
using dnnl::normalization_flags;
using dnnl::primitive_attr;
using dnnl::prop_kind;

inline memory::dims dims_of(const memory::desc& md) {
#if GG_ONEDNN3
  return md.get_dims();
#else
  return md.dims();
#endif
}

inline memory::data_type type_of(const memory::desc& md) {
#if GG_ONEDNN3
  return md.get_data_type();
#else
  return md.data_type();
#endif
}

// Whether `md` is a blocked layout with inner blocks (nChw16c, OIhw16i16o...): read with aligned
// vector loads.
inline bool inner_blocked(const memory::desc& md) {
#if GG_ONEDNN3
  return md.get_format_kind() == memory::format_kind::blocked && md.get_inner_nblks() > 0;
#else
  return md.data.format_kind == dnnl_blocked && md.data.format_desc.blocking.inner_nblks > 0;
#endif
}

// The view of `md` at `offsets` of shape `dims`, or nothing where the layout cannot be cut there.
inline std::optional<memory::desc> submemory(const memory::desc& md, const memory::dims& dims,
                                             const memory::dims& offsets) {
  const memory::desc sub = md.submemory_desc(dims, offsets, true);
#if GG_ONEDNN3
  if (!sub) return std::nullopt;  // 3.x: an empty handle
#endif
  if (sub == memory::desc()) return std::nullopt;
  return sub;
}

// The scratchpad a primitive asks for, in bytes.
inline size_t scratchpad_bytes(const dnnl::primitive& p) {
  const auto md = dnnl_primitive_desc_query_md(p.get_primitive_desc(), dnnl_query_scratchpad_md, 0);
  return md ? dnnl_memory_desc_get_size(md) : 0;
}

using ConvFwd = dnnl::convolution_forward::primitive_desc;
using ConvBwdW = dnnl::convolution_backward_weights::primitive_desc;
using ConvBwdD = dnnl::convolution_backward_data::primitive_desc;

inline ConvFwd conv_fwd(const engine& e, algorithm a, const memory::desc& src,
                        const memory::desc& w, const memory::desc& b, const memory::desc& dst,
                        const memory::dims& strides, const memory::dims& pad_l,
                        const memory::dims& pad_r, const primitive_attr& attr = {}) {
#if GG_ONEDNN3
  return ConvFwd(e, prop_kind::forward_training, a, src, w, b, dst, strides, pad_l, pad_r, attr);
#else
  return ConvFwd({prop_kind::forward_training, a, src, w, b, dst, strides, pad_l, pad_r}, attr, e);
#endif
}

inline ConvBwdW conv_bwd_weights(const engine& e, algorithm a, const memory::desc& src,
                                 const memory::desc& dw, const memory::desc& db,
                                 const memory::desc& ddst, const memory::dims& strides,
                                 const memory::dims& pad_l, const memory::dims& pad_r,
                                 const ConvFwd& hint, const primitive_attr& attr = {}) {
#if GG_ONEDNN3
  return ConvBwdW(e, a, src, dw, db, ddst, strides, pad_l, pad_r, hint, attr);
#else
  return ConvBwdW({a, src, dw, db, ddst, strides, pad_l, pad_r}, attr, e, hint);
#endif
}

inline ConvBwdD conv_bwd_data(const engine& e, algorithm a, const memory::desc& dsrc,
                              const memory::desc& w, const memory::desc& ddst,
                              const memory::dims& strides, const memory::dims& pad_l,
                              const memory::dims& pad_r, const ConvFwd& hint,
                              const primitive_attr& attr = {}) {
#if GG_ONEDNN3
  return ConvBwdD(e, a, dsrc, w, ddst, strides, pad_l, pad_r, hint, attr);
#else
  return ConvBwdD({a, dsrc, w, ddst, strides, pad_l, pad_r}, attr, e, hint);
#endif
}

using IpFwd = dnnl::inner_product_forward::primitive_desc;
using IpBwdW = dnnl::inner_product_backward_weights::primitive_desc;
using IpBwdD = dnnl::inner_product_backward_data::primitive_desc;

inline IpFwd ip_fwd(const engine& e, const memory::desc& src, const memory::desc& w,
                    const memory::desc& b, const memory::desc& dst,
                    const primitive_attr& attr = {}) {
#if GG_ONEDNN3
  return IpFwd(e, prop_kind::forward_training, src, w, b, dst, attr);
#else
  return IpFwd({prop_kind::forward_training, src, w, b, dst}, attr, e);
#endif
}

inline IpBwdW ip_bwd_weights(const engine& e, const memory::desc& src, const memory::desc& dw,
                             const memory::desc& db, const memory::desc& ddst, const IpFwd& hint,
                             const primitive_attr& attr = {}) {
#if GG_ONEDNN3
  return IpBwdW(e, src, dw, db, ddst, hint, attr);
#else
  return IpBwdW({src, dw, db, ddst}, attr, e, hint);
#endif
}

inline IpBwdD ip_bwd_data(const engine& e, const memory::desc& dsrc, const memory::desc& w,
                          const memory::desc& ddst, const IpFwd& hint,
                          const primitive_attr& attr = {}) {
#if GG_ONEDNN3
  return IpBwdD(e, dsrc, w, ddst, hint, attr);
#else
  return IpBwdD({dsrc, w, ddst}, attr, e, hint);
#endif
}

using BnFwd = dnnl::batch_normalization_forward::primitive_desc;
using BnBwd = dnnl::batch_normalization_backward::primitive_desc;

// Batch norm keeps the source's layout: its output's descriptor is the source's.
inline BnFwd bn_fwd(const engine& e, prop_kind p, const memory::desc& src, float eps,
                    normalization_flags flags, const primitive_attr& attr = {}) {
#if GG_ONEDNN3
  return BnFwd(e, p, src, src, eps, flags, attr);
#else
  return BnFwd({p, src, eps, flags}, attr, e);
#endif
}

inline BnBwd bn_bwd(const engine& e, const memory::desc& ddst, const memory::desc& src, float eps,
                    normalization_flags flags, const BnFwd& hint, const primitive_attr& attr = {}) {
#if GG_ONEDNN3
  return BnBwd(e, prop_kind::backward, ddst, ddst, src, eps, flags, hint, attr);
#else
  return BnBwd({prop_kind::backward, ddst, src, eps, flags}, attr, e, hint);
#endif
}

using EltFwd = dnnl::eltwise_forward::primitive_desc;
using EltBwd = dnnl::eltwise_backward::primitive_desc;

inline EltFwd eltwise_fwd(const engine& e, algorithm a, const memory::desc& src, float alpha,
                          const primitive_attr& attr = {}) {
#if GG_ONEDNN3
  return EltFwd(e, prop_kind::forward_training, a, src, src, alpha, 0.f, attr);
#else
  return EltFwd({prop_kind::forward_training, a, src, alpha}, attr, e);
#endif
}

// `data` is the forward's source, or its destination for the *_use_dst_for_bwd algorithms.
inline EltBwd eltwise_bwd(const engine& e, algorithm a, const memory::desc& ddst,
                          const memory::desc& data, float alpha, const EltFwd& hint,
                          const primitive_attr& attr = {}) {
#if GG_ONEDNN3
  return EltBwd(e, a, ddst, ddst, data, alpha, 0.f, hint, attr);
#else
  return EltBwd({a, ddst, data, alpha}, attr, e, hint);
#endif
}

using PoolFwd = dnnl::pooling_forward::primitive_desc;
using PoolBwd = dnnl::pooling_backward::primitive_desc;

inline PoolFwd pool_fwd(const engine& e, algorithm a, const memory::desc& src,
                        const memory::desc& dst, const memory::dims& strides,
                        const memory::dims& kernel, const memory::dims& pad_l,
                        const memory::dims& pad_r, const primitive_attr& attr = {}) {
#if GG_ONEDNN3
  const memory::dims no_dilation(kernel.size(), 0);
  return PoolFwd(e, prop_kind::forward_training, a, src, dst, strides, kernel, no_dilation, pad_l,
                 pad_r, attr);
#else
  return PoolFwd({prop_kind::forward_training, a, src, dst, strides, kernel, pad_l, pad_r}, attr,
                 e);
#endif
}

inline PoolBwd pool_bwd(const engine& e, algorithm a, const memory::desc& dsrc,
                        const memory::desc& ddst, const memory::dims& strides,
                        const memory::dims& kernel, const memory::dims& pad_l,
                        const memory::dims& pad_r, const PoolFwd& hint,
                        const primitive_attr& attr = {}) {
#if GG_ONEDNN3
  const memory::dims no_dilation(kernel.size(), 0);
  return PoolBwd(e, a, dsrc, ddst, strides, kernel, no_dilation, pad_l, pad_r, hint, attr);
#else
  return PoolBwd({a, dsrc, ddst, strides, kernel, pad_l, pad_r}, attr, e, hint);
#endif
}

using LrnFwd = dnnl::lrn_forward::primitive_desc;
using LrnBwd = dnnl::lrn_backward::primitive_desc;

inline LrnFwd lrn_fwd(const engine& e, algorithm a, const memory::desc& src, memory::dim size,
                      float alpha, float beta, float k, const primitive_attr& attr = {}) {
#if GG_ONEDNN3
  return LrnFwd(e, prop_kind::forward_training, a, src, src, size, alpha, beta, k, attr);
#else
  return LrnFwd({prop_kind::forward_training, a, src, size, alpha, beta, k}, attr, e);
#endif
}

inline LrnBwd lrn_bwd(const engine& e, algorithm a, const memory::desc& src,
                      const memory::desc& ddst, memory::dim size, float alpha, float beta, float k,
                      const LrnFwd& hint, const primitive_attr& attr = {}) {
#if GG_ONEDNN3
  return LrnBwd(e, a, src, ddst, src, size, alpha, beta, k, hint, attr);
#else
  return LrnBwd({a, src, ddst, size, alpha, beta, k}, attr, e, hint);
#endif
}

inline dnnl::binary::primitive_desc binary(const engine& e, algorithm a, const memory::desc& src0,
                                           const memory::desc& src1, const memory::desc& dst,
                                           const primitive_attr& attr = {}) {
#if GG_ONEDNN3
  return dnnl::binary::primitive_desc(e, a, src0, src1, dst, attr);
#else
  return dnnl::binary::primitive_desc({a, src0, src1, dst}, attr, e);
#endif
}

inline dnnl::matmul::primitive_desc matmul(const engine& e, const memory::desc& src,
                                           const memory::desc& w, const memory::desc& dst,
                                           const primitive_attr& attr = {}) {
#if GG_ONEDNN3
  return dnnl::matmul::primitive_desc(e, src, w, dst, attr);
#else
  return dnnl::matmul::primitive_desc({src, w, dst}, attr, e);
#endif
}

inline dnnl::sum::primitive_desc sum(const engine& e, const memory::desc& dst,
                                     const std::vector<float>& scales,
                                     const std::vector<memory::desc>& srcs,
                                     const primitive_attr& attr = {}) {
#if GG_ONEDNN3
  return dnnl::sum::primitive_desc(e, dst, scales, srcs, attr);
#else
  return dnnl::sum::primitive_desc(dst, scales, srcs, e, attr);
#endif
}

inline dnnl::concat::primitive_desc concat(const engine& e, const memory::desc& dst, int axis,
                                           const std::vector<memory::desc>& srcs,
                                           const primitive_attr& attr = {}) {
#if GG_ONEDNN3
  return dnnl::concat::primitive_desc(e, dst, axis, srcs, attr);
#else
  return dnnl::concat::primitive_desc(dst, axis, srcs, e, attr);
#endif
}

}  // namespace gg::kernels::onednn
