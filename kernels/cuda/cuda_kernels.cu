// The small kernels of the GPU backend (see cuda_kernels.hpp). Each is a grid-stride loop over its
// outputs computing in fp32 whatever the storage type; backward passes gather (each input element
// sums what reaches it) rather than scatter, so they need no atomics and are deterministic.
#include <cuda_bf16.h>

#include <algorithm>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/cuda_kernels.hpp"

namespace gg::kernels::cuda {
namespace {

using bf16 = __nv_bfloat16;

__device__ __forceinline__ float ld(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float ld(const bf16* p, int64_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ void st(float* p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void st(bf16* p, int64_t i, float v) { p[i] = __float2bfloat16(v); }
// dx = v, or dx += v.
template <typename T>
__device__ __forceinline__ void put(T* p, int64_t i, float v, bool acc) {
  st(p, i, acc ? ld(p, i) + v : v);
}

constexpr int kThreads = 256;

unsigned blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(b, int64_t{1} << 20)));
}

#define GG_GRID_LOOP(i, n)                                                               \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(blockDim.x) * gridDim.x)

void check_launch() { GG_CUDA_CHECK(cudaGetLastError()); }

// Runs f(T{}) with T the storage type of t.
template <typename F>
void dispatch(DType t, F&& f) {
  if (t == DType::F32)
    f(float{});
  else
    f(bf16{});
}

template <typename D, typename S>
__global__ void cast_k(D* dst, const S* src, int64_t n) {
  GG_GRID_LOOP(i, n) st(dst, i, ld(src, i));
}

// NaN propagates as in PyTorch: relu(NaN) = NaN (fmaxf would drop it), and its gradient passes
// wherever the input is not <= 0 (threshold_backward).
template <typename T>
__global__ void relu_fwd_k(T* y, const T* x, int64_t n) {
  GG_GRID_LOOP(i, n) {
    const float v = ld(x, i);
    st(y, i, v <= 0.f ? 0.f : v);
  }
}

template <typename T>
__global__ void relu_bwd_k(T* dx, const T* dy, const T* x, int64_t n, bool acc) {
  GG_GRID_LOOP(i, n) put(dx, i, ld(x, i) <= 0.f ? 0.f : ld(dy, i), acc);
}

template <typename T>
__global__ void add_k(T* y, const T* a, const T* b, int64_t n) {
  GG_GRID_LOOP(i, n) st(y, i, ld(a, i) + ld(b, i));
}

template <typename T>
__global__ void accumulate_k(T* dx, const T* dy, int64_t n, bool acc) {
  GG_GRID_LOOP(i, n) put(dx, i, ld(dy, i), acc);
}

// i runs over the slice {batch, c, plane}.
template <typename T>
__global__ void to_concat_k(T* cat, const T* x, int64_t batch, int64_t c, int64_t plane,
                            int64_t total_c, int64_t first) {
  const int64_t per = c * plane;
  GG_GRID_LOOP(i, batch * per) {
    const int64_t b = i / per, r = i % per;
    st(cat, (b * total_c + first) * plane + r, ld(x, i));
  }
}

template <typename T>
__global__ void from_concat_k(T* dx, const T* dcat, int64_t batch, int64_t c, int64_t plane,
                              int64_t total_c, int64_t first, bool acc) {
  const int64_t per = c * plane;
  GG_GRID_LOOP(i, batch * per) {
    const int64_t b = i / per, r = i % per;
    put(dx, i, ld(dcat, (b * total_c + first) * plane + r), acc);
  }
}

template <typename T>
__global__ void bias_add_k(T* y, const float* bias, int64_t n, int64_t c, int64_t plane) {
  GG_GRID_LOOP(i, n) st(y, i, ld(y, i) + bias[(i / plane) % c]);
}

// One block per channel: the channel's sum over batch and plane, in fp32 per thread and a
// shared-memory tree across the block.
template <typename T>
__global__ void bias_grad_k(float* db, const T* dy, int64_t batch, int64_t c, int64_t plane) {
  __shared__ float part[kThreads];
  const int64_t ch = blockIdx.x;
  float acc = 0.f;
  for (int64_t e = threadIdx.x; e < batch * plane; e += blockDim.x)
    acc += ld(dy, ((e / plane) * c + ch) * plane + e % plane);
  part[threadIdx.x] = acc;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) db[ch] = part[0];
}

// A NaN in the window wins (the last one, if several), as in PyTorch's kernels.
template <typename T>
__global__ void max_pool_fwd_k(T* y, int32_t* argmax, const T* x, PoolShape p) {
  GG_GRID_LOOP(o, p.planes * p.oh * p.ow) {
    const int64_t plane = o / (p.oh * p.ow), r = o % (p.oh * p.ow);
    const int64_t oh = r / p.ow, ow = r % p.ow;
    const T* in = x + plane * p.ih * p.iw;
    float best = 0.f;
    int64_t best_at = -1;
    for (int64_t kh = 0; kh < p.k; ++kh) {
      const int64_t ih = oh * p.stride - p.pad + kh;
      if (ih < 0 || ih >= p.ih) continue;
      for (int64_t kw = 0; kw < p.k; ++kw) {
        const int64_t iw = ow * p.stride - p.pad + kw;
        if (iw < 0 || iw >= p.iw) continue;
        const float v = ld(in, ih * p.iw + iw);
        if (best_at < 0 || v > best || isnan(v)) {
          best = v;
          best_at = ih * p.iw + iw;
        }
      }
    }
    st(y, o, best);
    argmax[o] = static_cast<int32_t>(best_at);
  }
}

// The outputs whose window covers input position i (one dimension): [lo, hi].
__device__ __forceinline__ void covering(int64_t i, int64_t k, int64_t s, int64_t pad, int64_t out,
                                         int64_t& lo, int64_t& hi) {
  const int64_t a = i + pad - k + 1;  // first output start that reaches i
  lo = a <= 0 ? 0 : (a + s - 1) / s;
  hi = min((i + pad) / s, out - 1);
}

template <typename T>
__global__ void max_pool_bwd_k(T* dx, const T* dy, const int32_t* argmax, PoolShape p, bool acc) {
  GG_GRID_LOOP(i, p.planes * p.ih * p.iw) {
    const int64_t plane = i / (p.ih * p.iw), r = i % (p.ih * p.iw);
    const int64_t ih = r / p.iw, iw = r % p.iw;
    int64_t h0, h1, w0, w1;
    covering(ih, p.k, p.stride, p.pad, p.oh, h0, h1);
    covering(iw, p.k, p.stride, p.pad, p.ow, w0, w1);
    float sum = 0.f;
    for (int64_t oh = h0; oh <= h1; ++oh)
      for (int64_t ow = w0; ow <= w1; ++ow) {
        const int64_t o = (plane * p.oh + oh) * p.ow + ow;
        if (argmax[o] == r) sum += ld(dy, o);
      }
    put(dx, i, sum, acc);
  }
}

template <typename T>
__global__ void avg_pool_fwd_k(T* y, const T* x, PoolShape p) {
  const float inv = 1.f / static_cast<float>(p.k * p.k);
  GG_GRID_LOOP(o, p.planes * p.oh * p.ow) {
    const int64_t plane = o / (p.oh * p.ow), r = o % (p.oh * p.ow);
    const int64_t oh = r / p.ow, ow = r % p.ow;
    const T* in = x + plane * p.ih * p.iw;
    float sum = 0.f;
    for (int64_t kh = 0; kh < p.k; ++kh) {
      const int64_t ih = oh * p.stride - p.pad + kh;
      if (ih < 0 || ih >= p.ih) continue;
      for (int64_t kw = 0; kw < p.k; ++kw) {
        const int64_t iw = ow * p.stride - p.pad + kw;
        if (iw >= 0 && iw < p.iw) sum += ld(in, ih * p.iw + iw);
      }
    }
    st(y, o, sum * inv);
  }
}

template <typename T>
__global__ void avg_pool_bwd_k(T* dx, const T* dy, PoolShape p, bool acc) {
  const float inv = 1.f / static_cast<float>(p.k * p.k);
  GG_GRID_LOOP(i, p.planes * p.ih * p.iw) {
    const int64_t plane = i / (p.ih * p.iw), r = i % (p.ih * p.iw);
    const int64_t ih = r / p.iw, iw = r % p.iw;
    int64_t h0, h1, w0, w1;
    covering(ih, p.k, p.stride, p.pad, p.oh, h0, h1);
    covering(iw, p.k, p.stride, p.pad, p.ow, w0, w1);
    float sum = 0.f;
    for (int64_t oh = h0; oh <= h1; ++oh)
      for (int64_t ow = w0; ow <= w1; ++ow) sum += ld(dy, (plane * p.oh + oh) * p.ow + ow);
    put(dx, i, sum * inv, acc);
  }
}

// One warp per plane, striding over the planes (the grid is capped by blocks_for).
template <typename T>
__global__ void gap_fwd_k(T* y, const T* x, int64_t planes, int64_t plane) {
  const int64_t first = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32;
  const int64_t warps = gridDim.x * static_cast<int64_t>(blockDim.x) / 32;
  const int lane = threadIdx.x % 32;
  for (int64_t w = first; w < planes; w += warps) {
    float sum = 0.f;
    for (int64_t k = lane; k < plane; k += 32) sum += ld(x, w * plane + k);
    for (int off = 16; off > 0; off /= 2) sum += __shfl_down_sync(0xffffffffu, sum, off);
    if (lane == 0) st(y, w, sum / static_cast<float>(plane));
  }
}

template <typename T>
__global__ void gap_bwd_k(T* dx, const T* dy, int64_t planes, int64_t plane, bool acc) {
  const float inv = 1.f / static_cast<float>(plane);
  GG_GRID_LOOP(i, planes * plane) put(dx, i, ld(dy, i / plane) * inv, acc);
}

// kernels::dropout_multiplier, bit for bit: splitmix64's finaliser chained over the key.
__device__ __forceinline__ uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
__device__ __forceinline__ float dropout_mult(const DropoutKey& k, int64_t index) {
  uint64_t h = mix(k.seed + 0x9e3779b97f4a7c15ull);
  h = mix(h ^ static_cast<uint64_t>(k.node));
  h = mix(h ^ k.step);
  h = mix(h ^ static_cast<uint64_t>(index));
  const float u = static_cast<float>(h >> 40) * (1.f / 16777216.f);
  return u < k.p ? 0.f : __fdiv_rn(1.f, 1.f - k.p);
}

template <typename T>
__global__ void dropout_fwd_k(T* y, const T* x, int64_t n, DropoutKey k) {
  GG_GRID_LOOP(i, n) st(y, i, ld(x, i) * dropout_mult(k, i));
}

template <typename T>
__global__ void dropout_bwd_k(T* dx, const T* dy, int64_t n, DropoutKey k, bool acc) {
  GG_GRID_LOOP(i, n) put(dx, i, ld(dy, i) * dropout_mult(k, i), acc);
}

template <typename T>
__global__ void lrn_fwd_k(T* y, float* denom, const T* x, LrnShape l) {
  const int64_t half = l.size / 2;
  const float scale = l.alpha / static_cast<float>(l.size);
  GG_GRID_LOOP(at, l.batch * l.c * l.plane) {
    const int64_t i = at % l.plane, c = (at / l.plane) % l.c, b = at / (l.plane * l.c);
    float sum = 0.f;
    for (int64_t j = max(int64_t{0}, c - half); j <= min(l.c - 1, c + half); ++j) {
      const float v = ld(x, (b * l.c + j) * l.plane + i);
      sum += v * v;
    }
    const float d = l.k + scale * sum;
    denom[at] = d;
    st(y, at, ld(x, at) * powf(d, -l.beta));
  }
}

template <typename T>
__global__ void lrn_bwd_k(T* dx, const T* dy, const T* x, const float* denom, LrnShape l,
                          bool acc) {
  const int64_t half = l.size / 2;
  const float scale = 2.f * l.beta * l.alpha / static_cast<float>(l.size);
  GG_GRID_LOOP(at, l.batch * l.c * l.plane) {
    const int64_t i = at % l.plane, j = (at / l.plane) % l.c, b = at / (l.plane * l.c);
    float cross = 0.f;
    for (int64_t c = max(int64_t{0}, j - half); c <= min(l.c - 1, j + half); ++c) {
      const int64_t o = (b * l.c + c) * l.plane + i;
      cross += ld(dy, o) * ld(x, o) * powf(denom[o], -l.beta - 1.f);
    }
    put(dx, at, ld(dy, at) * powf(denom[at], -l.beta) - scale * ld(x, at) * cross, acc);
  }
}

// Batch norm reductions: grid (splits, channels); each block reduces one chunk of its channel's
// batch * plane values into two partial sums, which a per-channel pass adds up in double.
int64_t bn_splits(const BnShape& b) {
  const int64_t count = b.batch * b.plane;
  return std::max<int64_t>(1, std::min<int64_t>(64, (count + 16383) / 16384));
}

__device__ __forceinline__ void block_sum2(float& a, float& b) {
  __shared__ float sa[kThreads], sb[kThreads];
  sa[threadIdx.x] = a;
  sb[threadIdx.x] = b;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) {
      sa[threadIdx.x] += sa[threadIdx.x + w];
      sb[threadIdx.x] += sb[threadIdx.x + w];
    }
    __syncthreads();
  }
  a = sa[0];
  b = sb[0];
}

// Shifted sums (by the channel's first value) keep the variance accurate when |mean| >> std.
template <typename T>
__global__ void bn_stat_partial_k(float* part, const T* x, BnShape b) {
  const int64_t c = blockIdx.y, splits = gridDim.x, count = b.batch * b.plane;
  const int64_t chunk = (count + splits - 1) / splits;
  const int64_t e0 = blockIdx.x * chunk, e1 = min(count, e0 + chunk);
  const float shift = ld(x, c * b.plane);
  float s1 = 0.f, s2 = 0.f;
  for (int64_t e = e0 + threadIdx.x; e < e1; e += blockDim.x) {
    const float v = ld(x, ((e / b.plane) * b.c + c) * b.plane + e % b.plane) - shift;
    s1 += v;
    s2 += v * v;
  }
  block_sum2(s1, s2);
  if (threadIdx.x == 0) {
    part[(c * splits + blockIdx.x) * 2] = s1;
    part[(c * splits + blockIdx.x) * 2 + 1] = s2;
  }
}

template <typename T>
__global__ void bn_stat_final_k(float* mean, float* inv_std, float* running_mean,
                                float* running_var, const float* part, const T* x, BnShape b,
                                int64_t splits) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= b.c) return;
  double s1 = 0, s2 = 0;
  for (int64_t k = 0; k < splits; ++k) {
    s1 += part[(c * splits + k) * 2];
    s2 += part[(c * splits + k) * 2 + 1];
  }
  const double count = static_cast<double>(b.batch * b.plane);
  const double shifted_mean = s1 / count;
  // Biased, clamped at 0 against rounding; a NaN stays NaN (fmax would make it 0).
  const double raw = s2 / count - shifted_mean * shifted_mean;
  const double var = raw < 0.0 ? 0.0 : raw;
  const double m = shifted_mean + ld(x, c * b.plane);
  mean[c] = static_cast<float>(m);
  inv_std[c] = static_cast<float>(1.0 / sqrt(var + static_cast<double>(b.eps)));
  const double mom = b.momentum;
  running_mean[c] = static_cast<float>((1.0 - mom) * running_mean[c] + mom * m);
  running_var[c] =
      static_cast<float>((1.0 - mom) * running_var[c] + mom * var * count / fmax(1.0, count - 1.0));
}

__global__ void bn_running_k(float* mean, float* inv_std, const float* running_mean,
                             const float* running_var, BnShape b) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= b.c) return;
  mean[c] = running_mean[c];
  inv_std[c] = static_cast<float>(1.0 / sqrt(static_cast<double>(running_var[c]) + b.eps));
}

template <typename T>
__global__ void bn_apply_k(T* y, const T* x, const float* mean, const float* inv_std,
                           const float* gamma, const float* beta, BnShape b) {
  GG_GRID_LOOP(i, b.batch * b.c * b.plane) {
    const int64_t c = (i / b.plane) % b.c;
    st(y, i, gamma[c] * (ld(x, i) - mean[c]) * inv_std[c] + beta[c]);
  }
}

template <typename T>
__global__ void bn_grad_partial_k(float* part, const T* dy, const T* x, const float* mean,
                                  const float* inv_std, BnShape b) {
  const int64_t c = blockIdx.y, splits = gridDim.x, count = b.batch * b.plane;
  const int64_t chunk = (count + splits - 1) / splits;
  const int64_t e0 = blockIdx.x * chunk, e1 = min(count, e0 + chunk);
  const float mu = mean[c], is = inv_std[c];
  float s1 = 0.f, s2 = 0.f;
  for (int64_t e = e0 + threadIdx.x; e < e1; e += blockDim.x) {
    const int64_t at = ((e / b.plane) * b.c + c) * b.plane + e % b.plane;
    const float g = ld(dy, at);
    s1 += g;
    s2 += g * (ld(x, at) - mu) * is;
  }
  block_sum2(s1, s2);
  if (threadIdx.x == 0) {
    part[(c * splits + blockIdx.x) * 2] = s1;
    part[(c * splits + blockIdx.x) * 2 + 1] = s2;
  }
}

__global__ void bn_grad_final_k(float* dgamma, float* dbeta, const float* part, int64_t c_count,
                                int64_t splits) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= c_count) return;
  double s1 = 0, s2 = 0;
  for (int64_t k = 0; k < splits; ++k) {
    s1 += part[(c * splits + k) * 2];
    s2 += part[(c * splits + k) * 2 + 1];
  }
  dbeta[c] = static_cast<float>(s1);
  dgamma[c] = static_cast<float>(s2);
}

// dx = gamma * inv_std / M * (M * dy - sum(dy) - xhat * sum(dy * xhat)).
template <typename T>
__global__ void bn_dx_k(T* dx, const T* dy, const T* x, const float* mean, const float* inv_std,
                        const float* gamma, const float* dgamma, const float* dbeta, BnShape b,
                        bool acc) {
  const float count = static_cast<float>(b.batch * b.plane);
  GG_GRID_LOOP(i, b.batch * b.c * b.plane) {
    const int64_t c = (i / b.plane) % b.c;
    const float xhat = (ld(x, i) - mean[c]) * inv_std[c];
    const float v =
        gamma[c] * inv_std[c] / count * (count * ld(dy, i) - dbeta[c] - xhat * dgamma[c]);
    put(dx, i, v, acc);
  }
}

__global__ void sgd_k(float* w, float* v, const float* g, int64_t n, float lr, float mu, float wd,
                      bool nesterov, bool first) {
  GG_GRID_LOOP(i, n) {
    // The order of kernels::Sgd's arithmetic, so both round alike (up to contraction into FMAs).
    const float d = g[i] + wd * w[i];
    const float vi = first ? d : (nesterov ? mu * v[i] + d : mu * v[i] + g[i] + wd * w[i]);
    v[i] = vi;
    w[i] -= lr * (nesterov ? d + mu * vi : vi);
  }
}

__global__ void count_valid_k(float* loss_and_count, const int32_t* labels, int64_t n) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  int64_t valid = 0;
  for (int64_t i = 0; i < n; ++i) valid += labels[i] >= 0;
  loss_and_count[0] = 0.f;
  loss_and_count[1] = static_cast<float>(valid);
}

// One block per row.
__global__ void xent_row_k(float* dlogits, float* loss_and_count, const float* logits,
                           const int32_t* labels, int64_t classes) {
  __shared__ float red[kThreads];
  const int64_t row = blockIdx.x;
  const float* z = logits + row * classes;
  float* dz = dlogits + row * classes;
  const int32_t y = labels[row];
  if (y < 0 || y >= classes) {
    for (int64_t c = threadIdx.x; c < classes; c += blockDim.x) dz[c] = 0.f;
    return;
  }
  // Read before any thread overwrites the row (dlogits may alias logits).
  const float zy = z[y];
  float m = -INFINITY;
  for (int64_t c = threadIdx.x; c < classes; c += blockDim.x) m = fmaxf(m, z[c]);
  red[threadIdx.x] = m;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + w]);
    __syncthreads();
  }
  m = red[0];
  __syncthreads();
  float s = 0.f;
  for (int64_t c = threadIdx.x; c < classes; c += blockDim.x) s += expf(z[c] - m);
  red[threadIdx.x] = s;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) red[threadIdx.x] += red[threadIdx.x + w];
    __syncthreads();
  }
  const float log_sum = logf(red[0]) + m;
  const float inv = 1.f / fmaxf(1.f, loss_and_count[1]);
  for (int64_t c = threadIdx.x; c < classes; c += blockDim.x)
    dz[c] = (expf(z[c] - log_sum) - (c == y ? 1.f : 0.f)) * inv;
  if (threadIdx.x == 0) atomicAdd(loss_and_count, log_sum - zy);
}

}  // namespace

void cast(void* dst, DType dt, const void* src, DType st_, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  dispatch(dt, [&](auto d) {
    using D = decltype(d);
    dispatch(st_, [&](auto x) {
      using S = decltype(x);
      cast_k<<<blocks_for(n), kThreads, 0, s>>>(static_cast<D*>(dst), static_cast<const S*>(src),
                                                n);
    });
  });
  check_launch();
}

void relu_forward(void* y, const void* x, int64_t n, DType t, cudaStream_t s) {
  dispatch(t, [&](auto v) {
    using T = decltype(v);
    relu_fwd_k<<<blocks_for(n), kThreads, 0, s>>>(static_cast<T*>(y), static_cast<const T*>(x), n);
  });
  check_launch();
}

void relu_backward(void* dx, const void* dy, const void* x, int64_t n, DType t, bool acc,
                   cudaStream_t s) {
  dispatch(t, [&](auto v) {
    using T = decltype(v);
    relu_bwd_k<<<blocks_for(n), kThreads, 0, s>>>(static_cast<T*>(dx), static_cast<const T*>(dy),
                                                  static_cast<const T*>(x), n, acc);
  });
  check_launch();
}

void add_forward(void* y, const void* a, const void* b, int64_t n, DType t, cudaStream_t s) {
  dispatch(t, [&](auto v) {
    using T = decltype(v);
    add_k<<<blocks_for(n), kThreads, 0, s>>>(static_cast<T*>(y), static_cast<const T*>(a),
                                             static_cast<const T*>(b), n);
  });
  check_launch();
}

void accumulate(void* dx, const void* dy, int64_t n, DType t, bool acc, cudaStream_t s) {
  if (!acc) {
    GG_CUDA_CHECK(cudaMemcpyAsync(dx, dy, n * dtype_size(t), cudaMemcpyDeviceToDevice, s));
    return;
  }
  dispatch(t, [&](auto v) {
    using T = decltype(v);
    accumulate_k<<<blocks_for(n), kThreads, 0, s>>>(static_cast<T*>(dx), static_cast<const T*>(dy),
                                                    n, acc);
  });
  check_launch();
}

void slice_to_concat(void* cat, const void* x, int64_t batch, int64_t c, int64_t plane,
                     int64_t total_c, int64_t first, DType t, cudaStream_t s) {
  dispatch(t, [&](auto v) {
    using T = decltype(v);
    to_concat_k<<<blocks_for(batch * c * plane), kThreads, 0, s>>>(
        static_cast<T*>(cat), static_cast<const T*>(x), batch, c, plane, total_c, first);
  });
  check_launch();
}

void concat_to_slice(void* dx, const void* dcat, int64_t batch, int64_t c, int64_t plane,
                     int64_t total_c, int64_t first, DType t, bool acc, cudaStream_t s) {
  dispatch(t, [&](auto v) {
    using T = decltype(v);
    from_concat_k<<<blocks_for(batch * c * plane), kThreads, 0, s>>>(
        static_cast<T*>(dx), static_cast<const T*>(dcat), batch, c, plane, total_c, first, acc);
  });
  check_launch();
}

void bias_add(void* y, const float* bias, int64_t batch, int64_t c, int64_t plane, DType t,
              cudaStream_t s) {
  dispatch(t, [&](auto v) {
    using T = decltype(v);
    bias_add_k<<<blocks_for(batch * c * plane), kThreads, 0, s>>>(static_cast<T*>(y), bias,
                                                                  batch * c * plane, c, plane);
  });
  check_launch();
}

void bias_grad(float* db, const void* dy, int64_t batch, int64_t c, int64_t plane, DType t,
               cudaStream_t s) {
  dispatch(t, [&](auto v) {
    using T = decltype(v);
    bias_grad_k<<<static_cast<unsigned>(c), kThreads, 0, s>>>(db, static_cast<const T*>(dy), batch,
                                                              c, plane);
  });
  check_launch();
}

void max_pool_forward(void* y, int32_t* argmax, const void* x, const PoolShape& p, DType t,
                      cudaStream_t s) {
  dispatch(t, [&](auto v) {
    using T = decltype(v);
    max_pool_fwd_k<<<blocks_for(p.planes * p.oh * p.ow), kThreads, 0, s>>>(
        static_cast<T*>(y), argmax, static_cast<const T*>(x), p);
  });
  check_launch();
}

void max_pool_backward(void* dx, const void* dy, const int32_t* argmax, const PoolShape& p, DType t,
                       bool acc, cudaStream_t s) {
  dispatch(t, [&](auto v) {
    using T = decltype(v);
    max_pool_bwd_k<<<blocks_for(p.planes * p.ih * p.iw), kThreads, 0, s>>>(
        static_cast<T*>(dx), static_cast<const T*>(dy), argmax, p, acc);
  });
  check_launch();
}

void avg_pool_forward(void* y, const void* x, const PoolShape& p, DType t, cudaStream_t s) {
  dispatch(t, [&](auto v) {
    using T = decltype(v);
    avg_pool_fwd_k<<<blocks_for(p.planes * p.oh * p.ow), kThreads, 0, s>>>(
        static_cast<T*>(y), static_cast<const T*>(x), p);
  });
  check_launch();
}

void avg_pool_backward(void* dx, const void* dy, const PoolShape& p, DType t, bool acc,
                       cudaStream_t s) {
  dispatch(t, [&](auto v) {
    using T = decltype(v);
    avg_pool_bwd_k<<<blocks_for(p.planes * p.ih * p.iw), kThreads, 0, s>>>(
        static_cast<T*>(dx), static_cast<const T*>(dy), p, acc);
  });
  check_launch();
}

void global_avg_pool_forward(void* y, const void* x, int64_t planes, int64_t plane, DType t,
                             cudaStream_t s) {
  dispatch(t, [&](auto v) {
    using T = decltype(v);
    gap_fwd_k<<<blocks_for(planes * 32), kThreads, 0, s>>>(static_cast<T*>(y),
                                                           static_cast<const T*>(x), planes, plane);
  });
  check_launch();
}

void global_avg_pool_backward(void* dx, const void* dy, int64_t planes, int64_t plane, DType t,
                              bool acc, cudaStream_t s) {
  dispatch(t, [&](auto v) {
    using T = decltype(v);
    gap_bwd_k<<<blocks_for(planes * plane), kThreads, 0, s>>>(
        static_cast<T*>(dx), static_cast<const T*>(dy), planes, plane, acc);
  });
  check_launch();
}

void dropout_forward(void* y, const void* x, int64_t n, const DropoutKey& k, DType t,
                     cudaStream_t s) {
  dispatch(t, [&](auto v) {
    using T = decltype(v);
    dropout_fwd_k<<<blocks_for(n), kThreads, 0, s>>>(static_cast<T*>(y), static_cast<const T*>(x),
                                                     n, k);
  });
  check_launch();
}

void dropout_backward(void* dx, const void* dy, int64_t n, const DropoutKey& k, DType t, bool acc,
                      cudaStream_t s) {
  dispatch(t, [&](auto v) {
    using T = decltype(v);
    dropout_bwd_k<<<blocks_for(n), kThreads, 0, s>>>(static_cast<T*>(dx), static_cast<const T*>(dy),
                                                     n, k, acc);
  });
  check_launch();
}

void lrn_forward(void* y, float* denom, const void* x, const LrnShape& l, DType t, cudaStream_t s) {
  dispatch(t, [&](auto v) {
    using T = decltype(v);
    lrn_fwd_k<<<blocks_for(l.batch * l.c * l.plane), kThreads, 0, s>>>(static_cast<T*>(y), denom,
                                                                       static_cast<const T*>(x), l);
  });
  check_launch();
}

void lrn_backward(void* dx, const void* dy, const void* x, const float* denom, const LrnShape& l,
                  DType t, bool acc, cudaStream_t s) {
  dispatch(t, [&](auto v) {
    using T = decltype(v);
    lrn_bwd_k<<<blocks_for(l.batch * l.c * l.plane), kThreads, 0, s>>>(
        static_cast<T*>(dx), static_cast<const T*>(dy), static_cast<const T*>(x), denom, l, acc);
  });
  check_launch();
}

int64_t bn_scratch_floats(const BnShape& b) { return b.c * bn_splits(b) * 2; }

void bn_statistics(float* mean, float* inv_std, float* running_mean, float* running_var,
                   const void* x, const BnShape& b, bool train, float* scratch, DType t,
                   cudaStream_t s) {
  const unsigned per_channel = static_cast<unsigned>((b.c + kThreads - 1) / kThreads);
  if (!train) {
    bn_running_k<<<per_channel, kThreads, 0, s>>>(mean, inv_std, running_mean, running_var, b);
    check_launch();
    return;
  }
  const int64_t splits = bn_splits(b);
  dispatch(t, [&](auto v) {
    using T = decltype(v);
    const dim3 grid(static_cast<unsigned>(splits), static_cast<unsigned>(b.c));
    bn_stat_partial_k<<<grid, kThreads, 0, s>>>(scratch, static_cast<const T*>(x), b);
    bn_stat_final_k<<<per_channel, kThreads, 0, s>>>(mean, inv_std, running_mean, running_var,
                                                     scratch, static_cast<const T*>(x), b, splits);
  });
  check_launch();
}

void bn_apply(void* y, const void* x, const float* mean, const float* inv_std, const float* gamma,
              const float* beta, const BnShape& b, DType t, cudaStream_t s) {
  dispatch(t, [&](auto v) {
    using T = decltype(v);
    bn_apply_k<<<blocks_for(b.batch * b.c * b.plane), kThreads, 0, s>>>(
        static_cast<T*>(y), static_cast<const T*>(x), mean, inv_std, gamma, beta, b);
  });
  check_launch();
}

void bn_backward(void* dx, float* dgamma, float* dbeta, const void* dy, const void* x,
                 const float* mean, const float* inv_std, const float* gamma, const BnShape& b,
                 float* scratch, DType t, bool acc, cudaStream_t s) {
  const int64_t splits = bn_splits(b);
  dispatch(t, [&](auto v) {
    using T = decltype(v);
    const dim3 grid(static_cast<unsigned>(splits), static_cast<unsigned>(b.c));
    bn_grad_partial_k<<<grid, kThreads, 0, s>>>(scratch, static_cast<const T*>(dy),
                                                static_cast<const T*>(x), mean, inv_std, b);
    bn_grad_final_k<<<static_cast<unsigned>((b.c + kThreads - 1) / kThreads), kThreads, 0, s>>>(
        dgamma, dbeta, scratch, b.c, splits);
    if (dx)
      bn_dx_k<<<blocks_for(b.batch * b.c * b.plane), kThreads, 0, s>>>(
          static_cast<T*>(dx), static_cast<const T*>(dy), static_cast<const T*>(x), mean, inv_std,
          gamma, dgamma, dbeta, b, acc);
  });
  check_launch();
}

void sgd_update(float* w, float* v, const float* g, int64_t n, float lr, float momentum,
                float weight_decay, bool nesterov, bool first, cudaStream_t s) {
  sgd_k<<<blocks_for(n), kThreads, 0, s>>>(w, v, g, n, lr, momentum, weight_decay, nesterov, first);
  check_launch();
}

void softmax_xent(float* dlogits, float* loss_and_count, const float* logits, const int32_t* labels,
                  int64_t n, int64_t classes, cudaStream_t s) {
  count_valid_k<<<1, 1, 0, s>>>(loss_and_count, labels, n);
  xent_row_k<<<static_cast<unsigned>(n), kThreads, 0, s>>>(dlogits, loss_and_count, logits, labels,
                                                           classes);
  check_launch();
}

}  // namespace gg::kernels::cuda
