// Max, average and global average pooling on oneDNN, our own loops (kernels/onednn/max_pool.hpp)
// for f32 max pools over channel blocks, and PyTorch's NaN in a max pool's window (a rare path).
#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "kernels/onednn/executor_impl.hpp"
#include "kernels/onednn/max_pool.hpp"

namespace gg::kernels::onednn_detail {

void OneDnnExecutor::compile_pool(int id, const Node& n) {
  const int in = n.inputs[0];
  const Value& src = values_[in];
  const Dims& xin = g_.node(in).out;
  memory::dims kernel, strides, pad, pad_r;
  dnnl::algorithm alg;
  if (n.op == Op::GlobalAvgPool) {
    kernel = {xin[1], xin[2]};
    strides = kernel;
    pad = {0, 0};
    pad_r = pad;
    alg = dnnl::algorithm::pooling_avg_exclude_padding;
  } else {
    const int64_t k = n.pool.kernel, s = n.pool.stride, p = n.pool.pad;
    kernel = {k, k};
    strides = {s, s};
    pad = {p, p};
    // Ceil mode as right padding: enough for the last window. Max pool never picks padding, and
    // in floor mode this is the left padding again (avg pool, which counts padding, is floor).
    for (int d = 1; d <= 2; ++d) pad_r.push_back(std::max(p, (n.out[d] - 1) * s + k - xin[d] - p));
    alg = n.op == Op::MaxPool ? dnnl::algorithm::pooling_max
                              : dnnl::algorithm::pooling_avg_include_padding;
  }
  // Our own loops over f32 channel blocks (AVX2's 8, AVX-512's 16), where oneDNN 2.6's training
  // max pool is slow (kernels/onednn/max_pool.hpp has the figures).
  for (const auto& [t, block] : {std::pair{tag::nChw8c, 8}, std::pair{tag::nChw16c, 16}})
    if (n.op == Op::MaxPool && n.pool.kernel * n.pool.kernel < 255 &&
        src.md == memory::desc(batched(batch_, xin), dt::f32, t))
      return compile_blocked_max_pool(id, n, t, block);
  const memory::desc dst_any(batched(batch_, n.out), api::type_of(src.md), tag::any);
  const api::PoolFwd fpd =
      api::pool_fwd(eng_, alg, src.md, dst_any, strides, kernel, pad, pad_r, attr_);
  Value& out = values_[id];
  out.md = fpd.dst_desc();
  out.mem = fresh(out.md);
  Args fa{{DNNL_ARG_SRC, src.mem}, {DNNL_ARG_DST, out.mem}};
  memory ws;
  if (alg == dnnl::algorithm::pooling_max) {
    ws = fresh(fpd.workspace_desc());
    fa[DNNL_ARG_WORKSPACE] = ws;
  }
  push_fwd(dnnl::pooling_forward(fpd), std::move(fa));
  if (alg == dnnl::algorithm::pooling_max) push_max_pool_nan(id);
  if (in == 0) return;
  const api::PoolBwd bpd =
      api::pool_bwd(eng_, alg, src.md, out.md, strides, kernel, pad, pad_r, fpd, attr_);
  Args ba{{DNNL_ARG_DIFF_DST, diff_of(id)}, {DNNL_ARG_DIFF_SRC, edge(in)}};
  if (ws) ba[DNNL_ARG_WORKSPACE] = ws;
  bwd_[id].push_back(Action{dnnl::pooling_backward(bpd), std::move(ba), {}, {}});
}

// NaN in a max pool's window: see max_pool_nan (a rare path, only when the input may hold one).
void OneDnnExecutor::push_max_pool_nan(int id) {
  const int in = g_.node(id).inputs[0];
  fwd_.push_back(
      {Action{{},
              {},
              [this, id, x = values_[in].mem, y = values_[id].mem]() { max_pool_nan(id, x, y); },
              {values_[in].mem, values_[id].mem}},
       When::Always, [this, in]() { return may_hold_nan(in); }});
}

// Max pooling of a channel-blocked f32 tensor by kernels/onednn/max_pool.hpp instead of
// oneDNN's pooling (slow on AVX2 for training); the same layout out, the argmax in a byte per
// output kept for backward.
void OneDnnExecutor::compile_blocked_max_pool(int id, const Node& n, tag t, int block) {
  const int in = n.inputs[0];
  const Value& src = values_[in];
  const Dims& xin = g_.node(in).out;
  Value& out = values_[id];
  out.md = memory::desc(batched(batch_, n.out), dt::f32, t);
  out.mem = fresh(out.md);
  const BlockedPool s = blocked_pool(n, xin, batch_, block);
  const memory ws = fresh(memory::desc({s.n * s.blocks * s.oh * s.ow * block}, dt::u8, tag::x));
  fwd_.push_back({Action{{},
                         {},
                         [x = src.mem, y = out.mem, ws, s]() {
                           blocked_max_pool_forward(static_cast<const float*>(x.get_data_handle()),
                                                    static_cast<float*>(y.get_data_handle()),
                                                    static_cast<uint8_t*>(ws.get_data_handle()), s);
                         },
                         {src.mem, out.mem, ws}},
                  When::Always});
  push_max_pool_nan(id);
  if (in == 0) return;
  const memory dy = diff_of(id), dx = edge(in);
  bwd_[id].push_back(Action{{},
                            {},
                            [dy, dx, ws, s]() {
                              blocked_max_pool_backward(
                                  static_cast<const float*>(dy.get_data_handle()),
                                  static_cast<const uint8_t*>(ws.get_data_handle()),
                                  static_cast<float*>(dx.get_data_handle()), s);
                            },
                            {dy, dx, ws}});
}

// Whether the tensor of node t may hold a NaN in this forward, so far as the forward knows
// without another pass: a ReLU's pass and a fused batch norm's statistics tell; a copy, a
// dropout or a max pool holds one only if its inputs do; any other tensor may. Asked only of
// the inputs of max pools: ReLUs that no max pool reads (feeds_max_pool) do not report.
bool OneDnnExecutor::may_hold_nan(int t) const {
  const Node& n = g_.node(t);
  switch (n.op) {
    case Op::Relu:
      return values_[n.inputs[0]].relu_fused ? nan_[n.inputs[0]] != 0 : nan_[t] != 0;
    case Op::BatchNorm:
      return values_[t].relu_fused ? nan_[t] != 0 : true;
    case Op::Dropout:
    case Op::MaxPool:
      return may_hold_nan(n.inputs[0]);
    case Op::Concat:
      return std::any_of(n.inputs.begin(), n.inputs.end(),
                         [&](int in) { return may_hold_nan(in); });
    default:
      return true;
  }
}

// PyTorch's max pool gives NaN for a window that holds a NaN; oneDNN's never picks one. When
// the input may hold a NaN (rare: the run is going wrong), the output is put right in plain
// copies made here; backward keeps oneDNN's choice of maximum.
void OneDnnExecutor::max_pool_nan(int id, memory src, memory dst) {
  const Node& n = g_.node(id);
  const Dims& xin = g_.node(n.inputs[0]).out;
  memory x(plain_md(batch_, xin), eng_), y(plain_md(batch_, n.out), eng_);
  dnnl::reorder(src, x).execute(strm_, src, x);
  dnnl::reorder(dst, y).execute(strm_, dst, y);
  strm_.wait();
  const float* xp = static_cast<const float*>(x.get_data_handle());
  float* yp = static_cast<float*>(y.get_data_handle());
  const int64_t k = n.pool.kernel, st = n.pool.stride, p = n.pool.pad;
  const int64_t ih = xin[1], iw = xin[2], oh = n.out[1], ow = n.out[2];
  bool any = false;
  for (int64_t plane = 0; plane < batch_ * n.out[0]; ++plane)
    for (int64_t r = 0; r < oh; ++r)
      for (int64_t c = 0; c < ow; ++c) {
        bool nan = false;
        for (int64_t a = std::max<int64_t>(0, r * st - p); a < std::min(ih, r * st - p + k); ++a)
          for (int64_t b = std::max<int64_t>(0, c * st - p); b < std::min(iw, c * st - p + k); ++b)
            nan |= std::isnan(xp[(plane * ih + a) * iw + b]);
        if (nan) yp[(plane * oh + r) * ow + c] = std::numeric_limits<float>::quiet_NaN();
        any |= nan;
      }
  if (!any) return;
  dnnl::reorder(y, dst).execute(strm_, y, dst);
  strm_.wait();
}

}  // namespace gg::kernels::onednn_detail
