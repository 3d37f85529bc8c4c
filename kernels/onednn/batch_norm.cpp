// Batch norm on oneDNN: training by the batch's statistics (with the ReLU that reads it fused
// where it can be, NaN kept as PyTorch keeps it), the running statistics updated on the host,
// eval by them, and the layout oneDNN's JIT kernels take.
#include <cmath>
#include <initializer_list>
#include <string>

#include "kernels/onednn/eltwise.hpp"
#include "kernels/onednn/executor_impl.hpp"

namespace gg::kernels::onednn_detail {
namespace {

bool all_finite(std::initializer_list<memory> ms) {
  for (const memory& m : ms) {
    const float* v = static_cast<const float*>(m.get_data_handle());
    const size_t n = m.get_desc().get_size() / sizeof(float);
    for (size_t i = 0; i < n; ++i)
      if (!std::isfinite(v[i])) return false;
  }
  return true;
}

}  // namespace

// oneDNN's JIT batch norm does not take every layout: bf16 channels-last with a channel count
// that is not a multiple of 16 (what AMX convolutions give narrow layers) falls to a scalar
// implementation (30 steps of resnet8 at width 8: oneDNN's time 9.3 s with it, 1.0 s without;
// bench/results/bf16-narrow-bn-xeon-vm.md). Such a batch norm runs on the 16-channel blocks
// instead, with a reorder in and out.
memory::desc OneDnnExecutor::bn_layout(const memory::desc& md, float eps,
                                       dnnl::normalization_flags flags) {
  const auto jit = [&](const memory::desc& d) {
    const api::BnFwd pd =
        api::bn_fwd(eng_, dnnl::prop_kind::forward_training, d, eps, flags, attr_);
    return std::string(pd.impl_info_str()).find("jit") != std::string::npos;
  };
  if (api::dims_of(md).size() != 4 || jit(md)) return md;
  const memory::desc blocked(api::dims_of(md), api::type_of(md), tag::nChw16c);
  return jit(blocked) ? blocked : md;
}

// The tensors a batch norm's passes share.
struct OneDnnExecutor::BnTensors {
  memory::desc md;  // the layout it runs on
  memory src, dst, scale, shift, mean, var, ws, run_mean, run_var;
  float eps = 0;
};

void OneDnnExecutor::compile_bn(int id, const Node& n) {
  const int in = n.inputs[0];
  const memory::desc c_md({n.out[0]}, dt::f32, tag::x);
  // A ReLU that is the only reader of this batch norm runs inside it (fuse_norm_relu): its
  // forward and backward passes over the tensor disappear; a bit mask (workspace) remembers
  // where it was active.
  const bool fuse = values_[id].consumers == 1 && reader_is_relu(id);
  auto flags = dnnl::normalization_flags::use_scale | dnnl::normalization_flags::use_shift;
  if (fuse) flags |= dnnl::normalization_flags::fuse_norm_relu;
  BnTensors t;
  t.eps = n.bn.eps;
  t.md = in == 0 ? values_[in].md : bn_layout(values_[in].md, t.eps, flags);
  memory diff_src;
  std::vector<Action> diff_tail;
  t.src = in == 0 ? values_[in].mem : conform(in, t.md, &diff_src, &diff_tail);
  const api::BnFwd fpd =
      api::bn_fwd(eng_, dnnl::prop_kind::forward_training, t.md, t.eps, flags, attr_);
  Value& out = values_[id];
  out.md = fpd.dst_desc();
  out.mem = t.dst = fresh(out.md);
  t.scale = param_mem(n.params[0], c_md, false);
  t.shift = param_mem(n.params[1], c_md, false);
  t.mean = fresh(fpd.mean_desc());
  t.var = fresh(fpd.variance_desc());
  out.relu_fused = fuse;
  Args fa{{DNNL_ARG_SRC, t.src},     {DNNL_ARG_DST, t.dst},   {DNNL_ARG_SCALE, t.scale},
          {DNNL_ARG_SHIFT, t.shift}, {DNNL_ARG_MEAN, t.mean}, {DNNL_ARG_VARIANCE, t.var}};
  if (fuse) {
    t.ws = fresh(fpd.workspace_desc());
    fa[DNNL_ARG_WORKSPACE] = t.ws;
  }
  push_fwd(dnnl::batch_normalization_forward(fpd), std::move(fa), When::Train);
  t.run_mean = buffer_mem(n.buffers[0], c_md);
  t.run_var = buffer_mem(n.buffers[1], c_md);
  push_bn_statistics(id, n, t, fuse);
  push_bn_eval(id, t, fuse);

  const api::BnBwd bpd = api::bn_bwd(eng_, out.md, t.md, t.eps, flags, fpd, attr_);
  Args ba{{DNNL_ARG_SRC, t.src},
          {DNNL_ARG_MEAN, t.mean},
          {DNNL_ARG_VARIANCE, t.var},
          {DNNL_ARG_SCALE, t.scale},
          {DNNL_ARG_DIFF_DST, diff_of(id)},
          {DNNL_ARG_DIFF_SCALE, param_mem(n.params[0], c_md, true)},
          {DNNL_ARG_DIFF_SHIFT, param_mem(n.params[1], c_md, true)}};
  // 2.6's bf16 backward fails without the shift; 3.x refuses it (backward does not read it).
  if (!GG_ONEDNN3) ba[DNNL_ARG_SHIFT] = t.shift;
  if (fuse) ba[DNNL_ARG_WORKSPACE] = t.ws;
  ba[DNNL_ARG_DIFF_SRC] = in == 0 ? fresh(t.md) : diff_src;
  bwd_[id].push_back(Action{dnnl::batch_normalization_backward(bpd), std::move(ba), {}, {}});
  for (Action& a : diff_tail) bwd_[id].push_back(std::move(a));
}

// Training's running statistics, updated on the host from the batch's, and the NaN rule of a
// fused ReLU.
//
// NaN, as in PyTorch: relu(NaN) = NaN, but the fused ReLU gives 0. In training the batch's
// statistics decide: with a finite mean, variance, scale and shift every input and output of
// a channel is finite (a NaN or inf input makes its channel's mean or variance non-finite), so
// the fused result is exact. Otherwise (rare: the run is going wrong) the output is computed
// again without the fusion and with relu_keeping_nan. Backward keeps the fused mask, which
// drops the gradient at NaN outputs where PyTorch passes it; the gradients are NaN there
// anyway. Eval has no batch statistics to tell, so it runs batch norm and then
// relu_keeping_nan, one more pass over the tensor, in eval only (push_bn_eval).
void OneDnnExecutor::push_bn_statistics(int id, const Node& n, const BnTensors& t, bool fuse) {
  const int64_t c = n.out[0];
  // oneDNN reports the biased batch variance; PyTorch's running_var tracks the unbiased one.
  const double m = static_cast<double>(batch_) * numel(n.out) / c;
  const float unbias = m > 1 ? static_cast<float>(m / (m - 1)) : 1.f;
  const float mom = n.bn.momentum;
  const memory mean = t.mean, var = t.var, scale = t.scale, shift = t.shift;
  fwd_.push_back({Action{{},
                         {},
                         [=, this, run_mean = t.run_mean, run_var = t.run_var]() {
                           const float* bm = static_cast<const float*>(mean.get_data_handle());
                           const float* bv = static_cast<const float*>(var.get_data_handle());
                           float* rm = static_cast<float*>(run_mean.get_data_handle());
                           float* rv = static_cast<float*>(run_var.get_data_handle());
                           for (int64_t i = 0; i < c; ++i) {
                             rm[i] = (1 - mom) * rm[i] + mom * bm[i];
                             rv[i] = (1 - mom) * rv[i] + mom * bv[i] * unbias;
                           }
                           if (fuse) nan_[id] = !all_finite({mean, var, scale, shift});
                         },
                         {mean, var}},
                  When::Train});
  if (!fuse) return;
  const auto affine = dnnl::normalization_flags::use_scale | dnnl::normalization_flags::use_shift;
  const api::BnFwd rpd = api::bn_fwd(eng_, dnnl::prop_kind::forward_training, t.md, t.eps, affine);
  const Args ra{{DNNL_ARG_SRC, t.src},     {DNNL_ARG_DST, t.dst},   {DNNL_ARG_SCALE, t.scale},
                {DNNL_ARG_SHIFT, t.shift}, {DNNL_ARG_MEAN, t.mean}, {DNNL_ARG_VARIANCE, t.var}};
  fwd_.push_back({Action{{},
                         {},
                         [this, id, rpd, ra, y = t.dst]() {
                           if (!redo_[id]) redo_[id] = dnnl::batch_normalization_forward(rpd);
                           redo_[id]->execute(strm_, ra);
                           strm_.wait();
                           nan_[id] = relu_keeping_nan(y, y, true);
                         },
                         {t.src, t.dst, t.mean, t.var}},
                  When::Train, [this, id]() { return nan_[id] != 0; }});
}

// Eval: batch norm by the running statistics, never with the ReLU fused (the NaN rule in
// push_bn_statistics): a fused ReLU runs after it as relu_keeping_nan.
void OneDnnExecutor::push_bn_eval(int id, const BnTensors& t, bool fuse) {
  const auto flags = dnnl::normalization_flags::use_scale | dnnl::normalization_flags::use_shift |
                     dnnl::normalization_flags::use_global_stats;
  const api::BnFwd ipd =
      api::bn_fwd(eng_, dnnl::prop_kind::forward_inference, t.md, t.eps, flags, attr_);
  push_fwd(dnnl::batch_normalization_forward(ipd),
           {{DNNL_ARG_SRC, t.src},
            {DNNL_ARG_DST, t.dst},
            {DNNL_ARG_SCALE, t.scale},
            {DNNL_ARG_SHIFT, t.shift},
            {DNNL_ARG_MEAN, t.run_mean},
            {DNNL_ARG_VARIANCE, t.run_var}},
           When::Eval);
  if (!fuse) return;
  fwd_.push_back({Action{{},
                         {},
                         [this, id, y = t.dst, report = feeds_max_pool(reader_relu(id))]() {
                           nan_[id] = relu_keeping_nan(y, y, report);
                         },
                         {t.dst}},
                  When::Eval});
}

}  // namespace gg::kernels::onednn_detail
