// The small CUDA kernels of the GPU backend: everything cuDNN (convolutions) and cuBLAS (fully
// connected) do not do. Every launcher is asynchronous on `s`. Tensors are plain NCHW in fp32 or
// bf16 (`DType`); parameters, gradients and statistics are always fp32. `acc` selects dx += ...
// (a tensor with several consumers) over dx = ..., so that no gradient needs zeroing first.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace gg::kernels::cuda {

enum class DType { F32, BF16 };
inline int64_t dtype_size(DType t) { return t == DType::F32 ? 4 : 2; }

void cast(void* dst, DType dt, const void* src, DType st, int64_t n, cudaStream_t s);
void relu_forward(void* y, const void* x, int64_t n, DType t, cudaStream_t s);
void relu_backward(void* dx, const void* dy, const void* x, int64_t n, DType t, bool acc,
                   cudaStream_t s);
void add_forward(void* y, const void* a, const void* b, int64_t n, DType t, cudaStream_t s);
void accumulate(void* dx, const void* dy, int64_t n, DType t, bool acc, cudaStream_t s);

// Every function that takes `nhwc` reads and writes channels-last tensors {batch, plane, c} when
// it is true, else {batch, c, plane}.

// {outer, c, plane} <-> {outer, plane, c} (to_last: the first to the second), with a cast: the
// input to channels-last, and a convolution's filters {k, c, r*s} to cuDNN's NHWC filter layout
// and their gradient back.
void transpose_channels(void* dst, DType dt, const void* src, DType st, int64_t outer, int64_t c,
                        int64_t plane, bool to_last, cudaStream_t s);

// Channels [first, first + c) of a {batch, total_c, plane} tensor <-> a {batch, c, plane} one.
void slice_to_concat(void* cat, const void* x, int64_t batch, int64_t c, int64_t plane,
                     int64_t total_c, int64_t first, bool nhwc, DType t, cudaStream_t s);
void concat_to_slice(void* dx, const void* dcat, int64_t batch, int64_t c, int64_t plane,
                     int64_t total_c, int64_t first, bool nhwc, DType t, bool acc, cudaStream_t s);

// y[n, c, i] += bias[c]; db[c] = sum over n, i of dy[n, c, i] (plane = 1 for feature vectors).
void bias_add(void* y, const float* bias, int64_t batch, int64_t c, int64_t plane, bool nhwc,
              DType t, cudaStream_t s);
void bias_grad(float* db, const void* dy, int64_t batch, int64_t c, int64_t plane, bool nhwc,
               DType t, cudaStream_t s);

struct PoolShape {
  int64_t planes = 0;  // batch * channels
  int64_t c = 1;       // channels
  int64_t ih = 0, iw = 0, oh = 0, ow = 0;
  int64_t k = 1, stride = 1, pad = 0;
  bool nhwc = false;
};
// Max pool keeps, per output, the offset of its winner within the input plane (ties: first in
// scan order; padding and the positions ceil mode adds never win).
void max_pool_forward(void* y, int32_t* argmax, const void* x, const PoolShape& p, DType t,
                      cudaStream_t s);
void max_pool_backward(void* dx, const void* dy, const int32_t* argmax, const PoolShape& p, DType t,
                       bool acc, cudaStream_t s);
// Average pool counting padding in the divisor (kernel^2), floor mode.
void avg_pool_forward(void* y, const void* x, const PoolShape& p, DType t, cudaStream_t s);
void avg_pool_backward(void* dx, const void* dy, const PoolShape& p, DType t, bool acc,
                       cudaStream_t s);
// y {batch, c} = the mean over each plane.
void global_avg_pool_forward(void* y, const void* x, int64_t batch, int64_t c, int64_t plane,
                             bool nhwc, DType t, cudaStream_t s);
void global_avg_pool_backward(void* dx, const void* dy, int64_t batch, int64_t c, int64_t plane,
                              bool nhwc, DType t, bool acc, cudaStream_t s);

// Inverted dropout with the masks of kernels::dropout_multiplier, recomputed in backward. The
// step whose masks are drawn is read from device memory (step[0]), so that a replayed CUDA graph
// draws new ones: set_dropout_step writes step[0] = value and step[1] = value + 1 (a step run
// eagerly), advance_dropout_step step[0] = step[1]++ (a step inside a graph).
struct DropoutKey {
  uint64_t seed = 0;
  int node = 0;
  const uint64_t* step = nullptr;
  float p = 0.f;
};
void set_dropout_step(uint64_t* step, uint64_t value, cudaStream_t s);
void advance_dropout_step(uint64_t* step, cudaStream_t s);
void dropout_forward(void* y, const void* x, int64_t n, const DropoutKey& k, DType t,
                     cudaStream_t s);
void dropout_backward(void* dx, const void* dy, int64_t n, const DropoutKey& k, DType t, bool acc,
                      cudaStream_t s);

// LRN across channels (PyTorch's nn.LocalResponseNorm, odd sizes); denom keeps k + alpha/size *
// window sum of squares for backward.
struct LrnShape {
  int64_t batch = 0, c = 0, plane = 0, size = 5;
  float alpha = 1e-4f, beta = 0.75f, k = 1.f;
};
void lrn_forward(void* y, float* denom, const void* x, const LrnShape& l, DType t, cudaStream_t s);
void lrn_backward(void* dx, const void* dy, const void* x, const float* denom, const LrnShape& l,
                  DType t, bool acc, cudaStream_t s);

// Batch norm over {batch, c, plane}. `scratch` holds bn_scratch_floats(...) floats.
// nhwc: the tensors are channels-last, {batch, plane, c}; else {batch, c, plane}.
struct BnShape {
  int64_t batch = 0, c = 0, plane = 1;
  float eps = 1e-5f, momentum = 0.1f;
  bool nhwc = false;
};
int64_t bn_scratch_floats(const BnShape& b);
// Training: batch statistics into mean / inv_std and the running statistics updated as PyTorch
// does (unbiased variance). Eval: mean / inv_std from the running statistics.
void bn_statistics(float* mean, float* inv_std, float* running_mean, float* running_var,
                   const void* x, const BnShape& b, bool train, float* scratch, DType t,
                   cudaStream_t s);
// Training statistics from per-channel sums already made (sum[c], sq[c]: the sum of x and of x^2
// over batch and plane, fp32; a convolution's epilogue writes them, conv_stats.hpp): mean,
// inv_std and the running statistics as bn_statistics gives them, the variance clamped at 0.
void bn_statistics_from_sums(float* mean, float* inv_std, float* running_mean, float* running_var,
                             const float* sum, const float* sq, const BnShape& b, cudaStream_t s);
// y = [relu]((x - mean) * gamma * inv_std + beta [+ res]): the batch norm, and the residual add
// and ReLU that read it when they are fused with it (res: null for none).
void bn_apply(void* y, const void* x, const void* res, bool relu, const float* mean,
              const float* inv_std, const float* gamma, const float* beta, const BnShape& b,
              DType t, cudaStream_t s);
// Backward of bn_apply. g, the gradient of its sum (before the ReLU), is dy where the ReLU lets
// it through; with a ReLU or a residual it is written to dz (the residual's gradient when this
// writes it first: add's gradient is then that buffer itself, no copy; else dy in place) and,
// when another reader wrote the residual's gradient first, added to dres. dgamma, dbeta are
// written; dx (if non-null) written or accumulated (acc_x).
struct BnGrad {
  const void* dy = nullptr;
  const void* relu_y = nullptr;  // a fused ReLU's output (its sign gates dy); null: no ReLU
  void* dz = nullptr;            // where g goes (may be dy); null: g is dy, nothing written
  void* dres = nullptr;          // a residual's gradient to add g to; null: none
  void* dx = nullptr;
  bool acc_x = false;
};
void bn_backward(const BnGrad& g, float* dgamma, float* dbeta, const void* x, const float* mean,
                 const float* inv_std, const float* gamma, const BnShape& b, float* scratch,
                 DType t, cudaStream_t s);

// The mixing rules of gossip/comm/mixing.hpp over n fp32 values on the device, giving the host's
// bits (each operation rounded to nearest, never fused): x = (x + partner) / 2; delta =
// (partner - sent) / 2; x += delta; x += (theirs - mine) / 2.
void mix_pair(float* x, const float* partner, int64_t n, cudaStream_t s);
void mix_correction(const float* sent, const float* partner, float* delta, int64_t n,
                    cudaStream_t s);
void apply_correction(float* x, const float* delta, int64_t n, cudaStream_t s);
void mix_copies(float* x, const float* mine, const float* theirs, int64_t n, cudaStream_t s);

// torch.optim.SGD's update over n fp32 values, kernels::Sgd's bits (its order of operations,
// none fused); `first` seeds v with the gradient.
void sgd_update(float* w, float* v, const float* g, int64_t n, float lr, float momentum,
                float weight_decay, bool nesterov, bool first, cudaStream_t s);

// Mean softmax cross-entropy of fp32 logits {n, classes} against labels (< 0: padding rows),
// dlogits = its gradient; loss_and_count (2 + n floats) receives the summed loss of the valid rows
// (added in row order: the same bits every run) and their count, then each row's loss.
void softmax_xent(float* dlogits, float* loss_and_count, const float* logits, const int32_t* labels,
                  int64_t n, int64_t classes, cudaStream_t s);

}  // namespace gg::kernels::cuda
