// The small kernels of the GPU backend (see cuda_kernels.hpp). Each is a grid-stride loop over its
// outputs computing in fp32 whatever the storage type; backward passes gather (each input element
// sums what reaches it) rather than scatter, so they need no atomics and are deterministic.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <type_traits>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/index_math.hpp"

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

// 16 bytes of a storage type (4 fp32 or 8 bf16 values) moved as one load or store: the
// element-wise passes are bound by memory, and scalar 2-byte loads leave most of it unused.
template <typename T>
constexpr int kVec = static_cast<int>(16 / sizeof(T));
template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};
template <int V, typename T>
__device__ __forceinline__ void load(const T* p, int64_t i, float (&o)[V]) {
  const Pack<T, V> k = *reinterpret_cast<const Pack<T, V>*>(p + i);
#pragma unroll
  for (int j = 0; j < V; ++j) o[j] = ld(k.v, j);
}
template <int V, typename T>
__device__ __forceinline__ void store(T* p, int64_t i, const float (&o)[V]) {
  Pack<T, V> k;
#pragma unroll
  for (int j = 0; j < V; ++j) st(k.v, j, o[j]);
  *reinterpret_cast<Pack<T, V>*>(p + i) = k;
}
// p[i, i + V) = o, or += o.
template <int V, typename T>
__device__ __forceinline__ void put_vec(T* p, int64_t i, float (&o)[V], bool acc) {
  if (acc) {
    float old[V];
    load<V>(p, i, old);
#pragma unroll
    for (int j = 0; j < V; ++j) o[j] += old[j];
  }
  store<V>(p, i, o);
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }
template <typename... P>
bool all_aligned16(const P*... p) {
  return (... && (p == nullptr || aligned16(p)));
}

// Runs f(std::integral_constant<int, V>{}) for the walk's vector width.
template <typename T, typename F>
void with_vec(int vec, F&& f) {
  if (vec == kVec<T>)
    f(std::integral_constant<int, kVec<T>>{});
  else
    f(std::integral_constant<int, 1>{});
}

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

// An element-wise pass over n values: f.template run<V>(i) handles values [i, i + V). Vectors of
// kVec values where every pointer allows (buffers from cudaMalloc do; a weight's range inside the
// flat buffers may not), then the tail one value at a time.
template <int V, typename F>
__global__ void eltwise_k(F f, int64_t vectors, int64_t n) {
  GG_GRID_LOOP(j, vectors) f.template run<V>(j * V);
  const int64_t tail = vectors * V + blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (tail < n) f.template run<1>(tail);
}
template <int V, typename F>
void launch_eltwise(const F& f, int64_t n, bool vectors_allowed, cudaStream_t s) {
  if (n <= 0) return;
  if (vectors_allowed && n >= V)
    eltwise_k<V><<<blocks_for(n / V), kThreads, 0, s>>>(f, n / V, n);
  else
    eltwise_k<1><<<blocks_for(n), kThreads, 0, s>>>(f, n, n);
  check_launch();
}

template <typename D, typename S>
struct CastOp {
  D* y;
  const S* x;
  template <int V>
  __device__ void run(int64_t i) const {
    float a[V];
    load<V>(x, i, a);
    store<V>(y, i, a);
  }
};

// NaN propagates as in PyTorch: relu(NaN) = NaN (fmaxf would drop it), and its gradient passes
// wherever the input is not <= 0 (threshold_backward).
template <typename T>
struct ReluOp {
  T* y;
  const T* x;
  template <int V>
  __device__ void run(int64_t i) const {
    float a[V];
    load<V>(x, i, a);
#pragma unroll
    for (int j = 0; j < V; ++j) a[j] = a[j] <= 0.f ? 0.f : a[j];
    store<V>(y, i, a);
  }
};

template <typename T>
struct ReluGradOp {
  T* dx;
  const T *dy, *x;
  bool acc;
  template <int V>
  __device__ void run(int64_t i) const {
    float g[V], a[V];
    load<V>(dy, i, g);
    load<V>(x, i, a);
#pragma unroll
    for (int j = 0; j < V; ++j) g[j] = a[j] <= 0.f ? 0.f : g[j];
    put_vec<V>(dx, i, g, acc);
  }
};

template <typename T>
struct AddOp {
  T* y;
  const T *a, *b;
  template <int V>
  __device__ void run(int64_t i) const {
    float u[V], w[V];
    load<V>(a, i, u);
    load<V>(b, i, w);
#pragma unroll
    for (int j = 0; j < V; ++j) u[j] += w[j];
    store<V>(y, i, u);
  }
};

template <typename T>
struct AccumulateOp {
  T* dx;
  const T* dy;
  template <int V>
  __device__ void run(int64_t i) const {
    float g[V];
    load<V>(dy, i, g);
    put_vec<V>(dx, i, g, true);
  }
};

// i runs over the slice {batch, c, plane}; per = c * plane, the slice's values per image.
template <typename T>
__global__ void to_concat_k(T* cat, const T* x, uint32_t n, FastDiv per, int64_t plane,
                            int64_t total_c, int64_t first) {
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
    const uint32_t b = per.div(i), r = i - b * per.d;
    st(cat, (b * total_c + first) * plane + r, ld(x, i));
  }
}

template <typename T>
__global__ void from_concat_k(T* dx, const T* dcat, uint32_t n, FastDiv per, int64_t plane,
                              int64_t total_c, int64_t first, bool acc) {
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
    const uint32_t b = per.div(i), r = i - b * per.d;
    put(dx, i, ld(dcat, (b * total_c + first) * plane + r), acc);
  }
}

// Channels-last: i runs over the slice {batch * plane, c}; row = i / c.
template <typename T>
__global__ void to_concat_rows_k(T* cat, const T* x, uint32_t n, FastDiv c, int64_t total_c,
                                 int64_t first) {
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
    const uint32_t row = c.div(i), ch = i - row * c.d;
    st(cat, row * total_c + first + ch, ld(x, i));
  }
}

template <typename T>
__global__ void from_concat_rows_k(T* dx, const T* dcat, uint32_t n, FastDiv c, int64_t total_c,
                                   int64_t first, bool acc) {
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
    const uint32_t row = c.div(i), ch = i - row * c.d;
    put(dx, i, ld(dcat, row * total_c + first + ch), acc);
  }
}

// {outer, c, plane} -> {outer, plane, c} (ToLast) or back; i runs over the destination.
template <typename D, typename S, bool ToLast>
__global__ void transpose_k(D* dst, const S* src, uint32_t n, FastDiv c, FastDiv plane) {
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
    if constexpr (ToLast) {
      const uint32_t px = c.div(i), ch = i - px * c.d;  // px = o * plane + p
      const uint32_t o = plane.div(px), p = px - o * plane.d;
      st(dst, i, ld(src, (static_cast<int64_t>(o) * c.d + ch) * plane.d + p));
    } else {
      const uint32_t oc = plane.div(i), p = i - oc * plane.d;  // oc = o * c + ch
      const uint32_t o = c.div(oc), ch = oc - o * c.d;
      st(dst, i, ld(src, (static_cast<int64_t>(o) * plane.d + p) * c.d + ch));
    }
  }
}

template <typename T>
__global__ void bias_grad_rows_k(float* db, const T* dy, uint32_t rows, uint32_t c) {
  __shared__ float part[kThreads];
  const uint32_t ch = blockIdx.x;
  float acc = 0.f;
  for (uint32_t r = threadIdx.x; r < rows; r += blockDim.x)
    acc += ld(dy, static_cast<int64_t>(r) * c + ch);
  part[threadIdx.x] = acc;
  __syncthreads();
  for (int k = blockDim.x / 2; k > 0; k /= 2) {
    if (threadIdx.x < k) part[threadIdx.x] += part[threadIdx.x + k];
    __syncthreads();
  }
  if (threadIdx.x == 0) db[ch] = part[0];
}

// y += bias per channel, over an NchwWalk or a RowWalk (lane e in channel c0 + e).
template <typename T, int V, typename W>
__global__ void bias_add_k(T* y, const float* bias, W w) {
  const uint32_t vectors = w.vectors();
  for (uint32_t j = blockIdx.x * blockDim.x + threadIdx.x; j < vectors;
       j += blockDim.x * gridDim.x) {
    const uint32_t c0 = w.channel(j);
    float a[V];
    load<V>(y, static_cast<int64_t>(j) * V, a);
#pragma unroll
    for (int e = 0; e < V; ++e) a[e] += bias[c0 + e * W::kLaneStep];
    store<V>(y, static_cast<int64_t>(j) * V, a);
  }
}

// One block per channel: the channel's sum over batch and plane, in fp32 per thread and a
// shared-memory tree across the block.
template <typename T>
__global__ void bias_grad_k(float* db, const T* dy, NchwWalk w) {
  __shared__ float part[kThreads];
  const uint32_t ch = blockIdx.x;
  float acc = 0.f;
  for (uint32_t q = threadIdx.x; q < w.batch * w.pv.d; q += blockDim.x)
    acc += ld(dy, w.at(q, ch, 0));
  part[threadIdx.x] = acc;
  __syncthreads();
  for (int k = blockDim.x / 2; k > 0; k /= 2) {
    if (threadIdx.x < k) part[threadIdx.x] += part[threadIdx.x + k];
    __syncthreads();
  }
  if (threadIdx.x == 0) db[ch] = part[0];
}

// Element idx of one side of a pool, {planes, h, w} (channels-last: {batch, h, w, c}): its
// position (h, w), and where its (image, channel) starts on the other side, {planes, oh, ow},
// with that side's pixel stride (1, or c channels-last). An output's window reads the input from
// there; an input's covering windows are outputs from there.
struct PoolPos {
  int64_t h, w, other, px;
};
__device__ __forceinline__ PoolPos pool_pos(int64_t idx, int64_t h, int64_t w, int64_t oh,
                                            int64_t ow, const PoolShape& p) {
  PoolPos r;
  if (!p.nhwc) {
    const int64_t plane = idx / (h * w), q = idx % (h * w);
    r.h = q / w;
    r.w = q % w;
    r.other = plane * oh * ow;
    r.px = 1;
  } else {
    const int64_t ch = idx % p.c, pix = idx / p.c;
    r.w = pix % w;
    const int64_t t = pix / w;
    r.h = t % h;
    r.other = (t / h) * oh * ow * p.c + ch;
    r.px = p.c;
  }
  return r;
}
__device__ __forceinline__ PoolPos pool_out(int64_t o, const PoolShape& p) {
  return pool_pos(o, p.oh, p.ow, p.ih, p.iw, p);
}
__device__ __forceinline__ PoolPos pool_in(int64_t i, const PoolShape& p) {
  return pool_pos(i, p.ih, p.iw, p.oh, p.ow, p);
}

template <typename T>
__global__ void max_pool_fwd_k(T* y, int32_t* argmax, const T* x, PoolShape p) {
  GG_GRID_LOOP(o, p.planes * p.oh * p.ow) {
    const PoolPos w = pool_out(o, p);
    const T* in = x + w.other;
    float best = 0.f;
    int64_t best_at = -1;
    for (int64_t kh = 0; kh < p.k; ++kh) {
      const int64_t ih = w.h * p.stride - p.pad + kh;
      if (ih < 0 || ih >= p.ih) continue;
      for (int64_t kw = 0; kw < p.k; ++kw) {
        const int64_t iw = w.w * p.stride - p.pad + kw;
        if (iw < 0 || iw >= p.iw) continue;
        const float v = ld(in, (ih * p.iw + iw) * w.px);
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
    const PoolPos w = pool_in(i, p);
    const int64_t r = w.h * p.iw + w.w;
    int64_t h0, h1, w0, w1;
    covering(w.h, p.k, p.stride, p.pad, p.oh, h0, h1);
    covering(w.w, p.k, p.stride, p.pad, p.ow, w0, w1);
    float sum = 0.f;
    for (int64_t oh = h0; oh <= h1; ++oh)
      for (int64_t ow = w0; ow <= w1; ++ow) {
        const int64_t o = w.other + (oh * p.ow + ow) * w.px;
        if (argmax[o] == r) sum += ld(dy, o);
      }
    put(dx, i, sum, acc);
  }
}

template <typename T>
__global__ void avg_pool_fwd_k(T* y, const T* x, PoolShape p) {
  const float inv = 1.f / static_cast<float>(p.k * p.k);
  GG_GRID_LOOP(o, p.planes * p.oh * p.ow) {
    const PoolPos w = pool_out(o, p);
    const T* in = x + w.other;
    float sum = 0.f;
    for (int64_t kh = 0; kh < p.k; ++kh) {
      const int64_t ih = w.h * p.stride - p.pad + kh;
      if (ih < 0 || ih >= p.ih) continue;
      for (int64_t kw = 0; kw < p.k; ++kw) {
        const int64_t iw = w.w * p.stride - p.pad + kw;
        if (iw >= 0 && iw < p.iw) sum += ld(in, (ih * p.iw + iw) * w.px);
      }
    }
    st(y, o, sum * inv);
  }
}

template <typename T>
__global__ void avg_pool_bwd_k(T* dx, const T* dy, PoolShape p, bool acc) {
  const float inv = 1.f / static_cast<float>(p.k * p.k);
  GG_GRID_LOOP(i, p.planes * p.ih * p.iw) {
    const PoolPos w = pool_in(i, p);
    int64_t h0, h1, w0, w1;
    covering(w.h, p.k, p.stride, p.pad, p.oh, h0, h1);
    covering(w.w, p.k, p.stride, p.pad, p.ow, w0, w1);
    float sum = 0.f;
    for (int64_t oh = h0; oh <= h1; ++oh)
      for (int64_t ow = w0; ow <= w1; ++ow) sum += ld(dy, w.other + (oh * p.ow + ow) * w.px);
    put(dx, i, sum * inv, acc);
  }
}

// Channels-last global average pool: one thread per (image, channel), consecutive threads on
// consecutive channels of a pixel.
template <typename T>
__global__ void gap_rows_fwd_k(T* y, const T* x, int64_t batch, int64_t c, int64_t plane) {
  GG_GRID_LOOP(o, batch * c) {
    const int64_t n = o / c, ch = o % c;
    float sum = 0.f;
    for (int64_t k = 0; k < plane; ++k) sum += ld(x, (n * plane + k) * c + ch);
    st(y, o, sum / static_cast<float>(plane));
  }
}

template <typename T>
__global__ void gap_rows_bwd_k(T* dx, const T* dy, int64_t c, int64_t plane, int64_t n, bool acc) {
  const float inv = 1.f / static_cast<float>(plane);
  GG_GRID_LOOP(i, n) put(dx, i, ld(dy, (i / (plane * c)) * c + i % c) * inv, acc);
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
__device__ __forceinline__ float dropout_mult(const DropoutKey& k, uint64_t step, int64_t index) {
  uint64_t h = mix(k.seed + 0x9e3779b97f4a7c15ull);
  h = mix(h ^ static_cast<uint64_t>(k.node));
  h = mix(h ^ step);
  h = mix(h ^ static_cast<uint64_t>(index));
  const float u = static_cast<float>(h >> 40) * (1.f / 16777216.f);
  return u < k.p ? 0.f : __fdiv_rn(1.f, 1.f - k.p);
}

template <typename T>
__global__ void dropout_fwd_k(T* y, const T* x, int64_t n, DropoutKey k) {
  const uint64_t step = *k.step;
  GG_GRID_LOOP(i, n) st(y, i, ld(x, i) * dropout_mult(k, step, i));
}

template <typename T>
__global__ void dropout_bwd_k(T* dx, const T* dy, int64_t n, DropoutKey k, bool acc) {
  const uint64_t step = *k.step;
  GG_GRID_LOOP(i, n) put(dx, i, ld(dy, i) * dropout_mult(k, step, i), acc);
}

__global__ void set_step_k(uint64_t* step, uint64_t value) {
  step[0] = value;
  step[1] = value + 1;
}
__global__ void advance_step_k(uint64_t* step) { step[0] = step[1]++; }

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

// Batch norm. Every pass walks the tensor in vectors that never span two channels (NchwWalk),
// so a channel's parameters are read once per vector and no value's channel costs a division.
//
// Reductions: grid (channels, splits); block (c, k) reduces channel c of images
// [k * per, (k + 1) * per) into two partial sums, which a per-channel pass adds up in double.
int64_t bn_splits(const BnShape& b) {
  const int64_t count = b.batch * b.plane;
  return std::max<int64_t>(1, std::min<int64_t>({64, b.batch, (count + 16383) / 16384}));
}
int64_t bn_images_per_split(const BnShape& b) {
  const int64_t splits = bn_splits(b);
  return (b.batch + splits - 1) / splits;
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

// The vectors block (c, k) reduces: channel c (blockIdx.x, which allows 2^31 - 1 channels) of
// split k's images (blockIdx.y), and how many vectors that is.
struct SplitRange {
  uint32_t n0 = 0, vectors = 0;
};
__device__ __forceinline__ SplitRange split_range(const NchwWalk& w, uint32_t per) {
  SplitRange r;
  r.n0 = blockIdx.y * per;
  const uint32_t n1 = min(w.batch, r.n0 + per);
  r.vectors = n1 > r.n0 ? (n1 - r.n0) * w.pv.d : 0;
  return r;
}

// Shifted sums (by the channel's first value) keep the variance accurate when |mean| >> std.
template <typename T, int V>
__global__ void bn_stat_partial_k(float* part, const T* x, NchwWalk w, uint32_t per) {
  const uint32_t c = blockIdx.x;
  const SplitRange r = split_range(w, per);
  const float shift = ld(x, static_cast<int64_t>(c) * w.pv.d * V);
  float s1 = 0.f, s2 = 0.f;
  for (uint32_t q = threadIdx.x; q < r.vectors; q += blockDim.x) {
    float a[V];
    load<V>(x, w.at(q, c, r.n0), a);
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const float v = a[j] - shift;
      s1 += v;
      s2 += v * v;
    }
  }
  block_sum2(s1, s2);
  if (threadIdx.x == 0) {
    part[(c * gridDim.y + blockIdx.y) * 2] = s1;
    part[(c * gridDim.y + blockIdx.y) * 2 + 1] = s2;
  }
}

// Channel c's batch mean and biased variance over `count` values: mean and inv_std, and the
// running statistics moved towards them as PyTorch does (the unbiased variance).
__device__ void bn_store_statistics(int64_t c, double m, double var, double count, const BnShape& b,
                                    float* mean, float* inv_std, float* running_mean,
                                    float* running_var) {
  mean[c] = static_cast<float>(m);
  inv_std[c] = static_cast<float>(1.0 / sqrt(var + static_cast<double>(b.eps)));
  const double mom = b.momentum;
  running_mean[c] = static_cast<float>((1.0 - mom) * running_mean[c] + mom * m);
  running_var[c] =
      static_cast<float>((1.0 - mom) * running_var[c] + mom * var * count / fmax(1.0, count - 1.0));
}

template <typename T>
__global__ void bn_stat_final_k(float* mean, float* inv_std, float* running_mean,
                                float* running_var, const float* part, const T* x, BnShape b,
                                int64_t splits) {
  // The partial sums are shifted by the channel's first value: x[0, c, 0] or, channels-last,
  // x[0, 0, c].
  const int64_t shift_stride = b.nhwc ? 1 : b.plane;
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
  const double m = shifted_mean + ld(x, c * shift_stride);
  bn_store_statistics(c, m, var, count, b, mean, inv_std, running_mean, running_var);
}

__global__ void bn_running_k(float* mean, float* inv_std, const float* running_mean,
                             const float* running_var, BnShape b) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= b.c) return;
  mean[c] = running_mean[c];
  inv_std[c] = static_cast<float>(1.0 / sqrt(static_cast<double>(running_var[c]) + b.eps));
}

// y = [relu]((x - mean) * gamma * inv_std + beta [+ res]), one vector per thread and pass, over
// an NchwWalk (every lane of a vector in one channel) or a RowWalk (lane e in channel c0 + e).
template <typename T, int V, bool Res, bool Relu, typename W>
__global__ void bn_apply_k(T* y, const T* x, const T* res, const float* mean, const float* inv_std,
                           const float* gamma, const float* beta, W w) {
  const uint32_t vectors = w.vectors();
  for (uint32_t j = blockIdx.x * blockDim.x + threadIdx.x; j < vectors;
       j += blockDim.x * gridDim.x) {
    const uint32_t c0 = w.channel(j);
    float a[V];
    load<V>(x, static_cast<int64_t>(j) * V, a);
    float r[V];
    if constexpr (Res) load<V>(res, static_cast<int64_t>(j) * V, r);
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const uint32_t c = c0 + e * W::kLaneStep;
      float v = (a[e] - mean[c]) * (gamma[c] * inv_std[c]) + beta[c];
      if constexpr (Res) v += r[e];
      if constexpr (Relu) v = v <= 0.f ? 0.f : v;  // NaN passes, as in relu_forward
      a[e] = v;
    }
    store<V>(y, static_cast<int64_t>(j) * V, a);
  }
}

// Backward, pass 1: per block the sums of g and g * xhat over its range, where g is dy, gated by
// the fused ReLU's output (y <= 0: no gradient; relu keeps NaN, so y <= 0 exactly where its
// input was), and written to dz when the pass is fused (the residual's gradient, or dy in place).
// gated_grad loads one vector's g (written to dz) and x.
template <int V, bool Relu, typename T>
__device__ __forceinline__ void gated_grad(int64_t at, T* dz, const T* dy, const T* relu_y,
                                           const T* x, float (&g)[V], float (&a)[V]) {
  load<V>(dy, at, g);
  load<V>(x, at, a);
  if constexpr (Relu) {
    float m[V];
    load<V>(relu_y, at, m);
#pragma unroll
    for (int e = 0; e < V; ++e) g[e] = m[e] <= 0.f ? 0.f : g[e];
  }
  if (dz) store<V>(dz, at, g);
}

template <typename T, int V, bool Relu>
__global__ void bn_grad_partial_k(float* part, T* dz, const T* dy, const T* relu_y, const T* x,
                                  const float* mean, const float* inv_std, NchwWalk w,
                                  uint32_t per) {
  const uint32_t c = blockIdx.x;
  const SplitRange r = split_range(w, per);
  const float mu = mean[c], is = inv_std[c];
  float s1 = 0.f, s2 = 0.f;
  for (uint32_t q = threadIdx.x; q < r.vectors; q += blockDim.x) {
    float g[V], a[V];
    gated_grad<V, Relu>(w.at(q, c, r.n0), dz, dy, relu_y, x, g, a);
#pragma unroll
    for (int e = 0; e < V; ++e) {
      s1 += g[e];
      s2 += g[e] * (a[e] - mu) * is;
    }
  }
  block_sum2(s1, s2);
  if (threadIdx.x == 0) {
    part[(c * gridDim.y + blockIdx.y) * 2] = s1;
    part[(c * gridDim.y + blockIdx.y) * 2 + 1] = s2;
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

// Pass 2: dx = gamma * inv_std / M * (M * g - sum(g) - xhat * sum(g * xhat)), and the residual's
// gradient += g where another reader wrote it first; over either walk, as bn_apply_k.
template <typename T, int V, typename W>
__global__ void bn_dx_k(T* dx, T* dres, const T* g_in, const T* x, const float* mean,
                        const float* inv_std, const float* gamma, const float* dgamma,
                        const float* dbeta, W w, float count, bool acc) {
  const uint32_t vectors = w.vectors();
  for (uint32_t j = blockIdx.x * blockDim.x + threadIdx.x; j < vectors;
       j += blockDim.x * gridDim.x) {
    const uint32_t c0 = w.channel(j);
    const int64_t at = static_cast<int64_t>(j) * V;
    float g[V], a[V], d[V];
    load<V>(g_in, at, g);
    // dx first, then the residual's gradient: when the residual is the batch norm's own input
    // (relu(bn(x) + x)), both are the same buffer, and dx's write must not drop the += g.
    if (dx) {
      load<V>(x, at, a);
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const uint32_t c = c0 + e * W::kLaneStep;
        const float is = inv_std[c];
        d[e] =
            gamma[c] * is / count * (count * g[e] - dbeta[c] - (a[e] - mean[c]) * is * dgamma[c]);
      }
      put_vec<V>(dx, at, d, acc);
    }
    if (dres) put_vec<V>(dres, at, g, true);
  }
}

// Channels-last batch norm reductions (its element-wise passes are bn_apply_k and bn_dx_k over a
// RowWalk): block (k, g) holds blockDim.x channel vectors of group g in x and blockDim.y row
// lanes in y, over pixels (rows)
// [k * per, (k + 1) * per); each thread sums its V channels over its rows, the lanes are added
// in shared memory, and row lane 0 writes the block's partial sums per channel.

// Adds the row lanes' sums (blockDim.y of them, a power of two) and writes lane 0's per channel.
template <int V>
__device__ __forceinline__ void rows_partial_out(float* part, const float (&s1)[V],
                                                 const float (&s2)[V], uint32_t v, uint32_t cv) {
  __shared__ float r1[kThreads * 8], r2[kThreads * 8];
  const uint32_t me = (threadIdx.y * blockDim.x + threadIdx.x) * V;
#pragma unroll
  for (int e = 0; e < V; ++e) {
    r1[me + e] = s1[e];
    r2[me + e] = s2[e];
  }
  __syncthreads();
  for (uint32_t h = blockDim.y / 2; h > 0; h /= 2) {
    if (threadIdx.y < h) {
      const uint32_t other = ((threadIdx.y + h) * blockDim.x + threadIdx.x) * V;
#pragma unroll
      for (int e = 0; e < V; ++e) {
        r1[me + e] += r1[other + e];
        r2[me + e] += r2[other + e];
      }
    }
    __syncthreads();
  }
  if (threadIdx.y != 0 || v >= cv) return;
#pragma unroll
  for (int e = 0; e < V; ++e) {
    const uint32_t c = v * V + e;
    part[(c * gridDim.x + blockIdx.x) * 2] = r1[me + e];
    part[(c * gridDim.x + blockIdx.x) * 2 + 1] = r2[me + e];
  }
}

template <typename T, int V>
__global__ void bn_stat_rows_k(float* part, const T* x, RowWalk w, uint32_t per) {
  const uint32_t v = blockIdx.y * blockDim.x + threadIdx.x, cv = w.cv.d;
  const uint32_t r0 = blockIdx.x * per, r1 = min(w.rows, r0 + per);
  float s1[V] = {}, s2[V] = {}, shift[V] = {};
  if (v < cv) {
    load<V>(x, static_cast<int64_t>(v) * V, shift);
    for (uint32_t row = r0 + threadIdx.y; row < r1; row += blockDim.y) {
      float a[V];
      load<V>(x, (static_cast<int64_t>(row) * cv + v) * V, a);
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const float d = a[e] - shift[e];
        s1[e] += d;
        s2[e] += d * d;
      }
    }
  }
  rows_partial_out<V>(part, s1, s2, v, cv);
}

template <typename T, int V, bool Relu>
__global__ void bn_grad_rows_k(float* part, T* dz, const T* dy, const T* relu_y, const T* x,
                               const float* mean, const float* inv_std, RowWalk w, uint32_t per) {
  const uint32_t v = blockIdx.y * blockDim.x + threadIdx.x, cv = w.cv.d;
  const uint32_t r0 = blockIdx.x * per, r1 = min(w.rows, r0 + per);
  float s1[V] = {}, s2[V] = {}, mu[V] = {}, is[V] = {};
  if (v < cv) {
#pragma unroll
    for (int e = 0; e < V; ++e) {
      mu[e] = mean[v * V + e];
      is[e] = inv_std[v * V + e];
    }
    for (uint32_t row = r0 + threadIdx.y; row < r1; row += blockDim.y) {
      float g[V], a[V];
      gated_grad<V, Relu>((static_cast<int64_t>(row) * cv + v) * V, dz, dy, relu_y, x, g, a);
#pragma unroll
      for (int e = 0; e < V; ++e) {
        s1[e] += g[e];
        s2[e] += g[e] * (a[e] - mu[e]) * is[e];
      }
    }
  }
  rows_partial_out<V>(part, s1, s2, v, cv);
}

__global__ void sgd_k(float* w, float* v, const float* g, int64_t n, float lr, float mu, float wd,
                      bool nesterov, bool first) {
  GG_GRID_LOOP(i, n) {
    // kernels::Sgd's arithmetic in its order, each operation rounded to nearest on its own (the
    // _rn intrinsics are never contracted into FMAs, as the host's ISO C++ is not): the same bits.
    const float d = __fadd_rn(g[i], __fmul_rn(wd, w[i]));
    const float vi = first ? d
                     : nesterov
                         ? __fadd_rn(__fmul_rn(mu, v[i]), d)
                         : __fadd_rn(__fadd_rn(__fmul_rn(mu, v[i]), g[i]), __fmul_rn(wd, w[i]));
    v[i] = vi;
    w[i] = __fsub_rn(w[i], __fmul_rn(lr, nesterov ? __fadd_rn(d, __fmul_rn(mu, vi)) : vi));
  }
}

// The gossip mixing rules of gossip/comm/mixing.hpp on the device, in the same arithmetic.
__global__ void mix_pair_k(float* x, const float* partner, int64_t n) {
  GG_GRID_LOOP(i, n) x[i] = __fmul_rn(0.5f, __fadd_rn(x[i], partner[i]));
}
__global__ void mix_correction_k(const float* sent, const float* partner, float* delta, int64_t n) {
  GG_GRID_LOOP(i, n) delta[i] = __fmul_rn(0.5f, __fsub_rn(partner[i], sent[i]));
}
__global__ void apply_correction_k(float* x, const float* delta, int64_t n) {
  GG_GRID_LOOP(i, n) x[i] = __fadd_rn(x[i], delta[i]);
}
__global__ void mix_copies_k(float* x, const float* mine, const float* theirs, int64_t n) {
  GG_GRID_LOOP(i, n) x[i] = __fadd_rn(x[i], __fmul_rn(0.5f, __fsub_rn(theirs[i], mine[i])));
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
  if (threadIdx.x == 0) loss_and_count[2 + row] = log_sum - zy;
}

// The rows' losses added in row order (not by atomics, whose order varies from run to run: a
// resumed run reports the same losses as an uninterrupted one).
__global__ void sum_rows_k(float* loss_and_count, const int32_t* labels, int64_t n,
                           int64_t classes) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  float sum = 0.f;
  for (int64_t i = 0; i < n; ++i)
    if (labels[i] >= 0 && labels[i] < classes) sum += loss_and_count[2 + i];
  loss_and_count[0] = sum;
}

}  // namespace

void cast(void* dst, DType dt, const void* src, DType st_, int64_t n, cudaStream_t s) {
  dispatch(dt, [&](auto d) {
    using D = decltype(d);
    dispatch(st_, [&](auto x) {
      using S = decltype(x);
      constexpr int V = kVec<D> < kVec<S> ? kVec<D> : kVec<S>;
      launch_eltwise<V>(CastOp<D, S>{static_cast<D*>(dst), static_cast<const S*>(src)}, n,
                        all_aligned16(dst, src), s);
    });
  });
}

void relu_forward(void* y, const void* x, int64_t n, DType t, cudaStream_t s) {
  dispatch(t, [&](auto v) {
    using T = decltype(v);
    launch_eltwise<kVec<T>>(ReluOp<T>{static_cast<T*>(y), static_cast<const T*>(x)}, n,
                            all_aligned16(y, x), s);
  });
}

void relu_backward(void* dx, const void* dy, const void* x, int64_t n, DType t, bool acc,
                   cudaStream_t s) {
  dispatch(t, [&](auto v) {
    using T = decltype(v);
    launch_eltwise<kVec<T>>(ReluGradOp<T>{static_cast<T*>(dx), static_cast<const T*>(dy),
                                          static_cast<const T*>(x), acc},
                            n, all_aligned16(dx, dy, x), s);
  });
}

void add_forward(void* y, const void* a, const void* b, int64_t n, DType t, cudaStream_t s) {
  dispatch(t, [&](auto v) {
    using T = decltype(v);
    launch_eltwise<kVec<T>>(
        AddOp<T>{static_cast<T*>(y), static_cast<const T*>(a), static_cast<const T*>(b)}, n,
        all_aligned16(y, a, b), s);
  });
}

void accumulate(void* dx, const void* dy, int64_t n, DType t, bool acc, cudaStream_t s) {
  if (!acc) {
    GG_CUDA_CHECK(cudaMemcpyAsync(dx, dy, n * dtype_size(t), cudaMemcpyDeviceToDevice, s));
    return;
  }
  dispatch(t, [&](auto v) {
    using T = decltype(v);
    launch_eltwise<kVec<T>>(AccumulateOp<T>{static_cast<T*>(dx), static_cast<const T*>(dy)}, n,
                            all_aligned16(dx, dy), s);
  });
}

void transpose_channels(void* dst, DType dt, const void* src, DType st_, int64_t outer, int64_t c,
                        int64_t plane, bool to_last, cudaStream_t s) {
  const int64_t n = outer * c * plane;
  if (n == 0) return;
  check_fast_div_range(n, "a transposed tensor");
  dispatch(dt, [&](auto d) {
    using D = decltype(d);
    dispatch(st_, [&](auto x) {
      using S = decltype(x);
      const auto un = static_cast<uint32_t>(n);
      if (to_last)
        transpose_k<D, S, true><<<blocks_for(n), kThreads, 0, s>>>(
            static_cast<D*>(dst), static_cast<const S*>(src), un, FastDiv(c), FastDiv(plane));
      else
        transpose_k<D, S, false><<<blocks_for(n), kThreads, 0, s>>>(
            static_cast<D*>(dst), static_cast<const S*>(src), un, FastDiv(c), FastDiv(plane));
    });
  });
  check_launch();
}

void slice_to_concat(void* cat, const void* x, int64_t batch, int64_t c, int64_t plane,
                     int64_t total_c, int64_t first, bool nhwc, DType t, cudaStream_t s) {
  check_fast_div_range(batch * total_c * plane, "a concatenation");
  const auto n = static_cast<uint32_t>(batch * c * plane);
  dispatch(t, [&](auto v) {
    using T = decltype(v);
    if (nhwc)
      to_concat_rows_k<<<blocks_for(n), kThreads, 0, s>>>(
          static_cast<T*>(cat), static_cast<const T*>(x), n, FastDiv(c), total_c, first);
    else
      to_concat_k<<<blocks_for(n), kThreads, 0, s>>>(static_cast<T*>(cat), static_cast<const T*>(x),
                                                     n, FastDiv(c * plane), plane, total_c, first);
  });
  check_launch();
}

void concat_to_slice(void* dx, const void* dcat, int64_t batch, int64_t c, int64_t plane,
                     int64_t total_c, int64_t first, bool nhwc, DType t, bool acc, cudaStream_t s) {
  check_fast_div_range(batch * total_c * plane, "a concatenation");
  const auto n = static_cast<uint32_t>(batch * c * plane);
  dispatch(t, [&](auto v) {
    using T = decltype(v);
    if (nhwc)
      from_concat_rows_k<<<blocks_for(n), kThreads, 0, s>>>(
          static_cast<T*>(dx), static_cast<const T*>(dcat), n, FastDiv(c), total_c, first, acc);
    else
      from_concat_k<<<blocks_for(n), kThreads, 0, s>>>(
          static_cast<T*>(dx), static_cast<const T*>(dcat), n, FastDiv(c * plane), plane, total_c,
          first, acc);
  });
  check_launch();
}

void bias_add(void* y, const float* bias, int64_t batch, int64_t c, int64_t plane, bool nhwc,
              DType t, cudaStream_t s) {
  dispatch(t, [&](auto v) {
    using T = decltype(v);
    const int vec = (nhwc ? c : plane) % kVec<T> == 0 && aligned16(y) ? kVec<T> : 1;
    auto* yt = static_cast<T*>(y);
    with_vec<T>(vec, [&](auto vc) {
      constexpr int V = decltype(vc)::value;
      const auto run = [&](const auto& w) {
        bias_add_k<T, V><<<blocks_for(w.vectors()), kThreads, 0, s>>>(yt, bias, w);
      };
      if (nhwc)
        run(RowWalk(batch * plane, c, vec));
      else
        run(NchwWalk(batch, c, plane, vec));
    });
  });
  check_launch();
}

void bias_grad(float* db, const void* dy, int64_t batch, int64_t c, int64_t plane, bool nhwc,
               DType t, cudaStream_t s) {
  dispatch(t, [&](auto v) {
    using T = decltype(v);
    if (nhwc) {
      check_fast_div_range(batch * plane * c, "a tensor");
      bias_grad_rows_k<<<static_cast<unsigned>(c), kThreads, 0, s>>>(
          db, static_cast<const T*>(dy), static_cast<uint32_t>(batch * plane),
          static_cast<uint32_t>(c));
    } else {
      bias_grad_k<<<static_cast<unsigned>(c), kThreads, 0, s>>>(db, static_cast<const T*>(dy),
                                                                NchwWalk(batch, c, plane, 1));
    }
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

void global_avg_pool_forward(void* y, const void* x, int64_t batch, int64_t c, int64_t plane,
                             bool nhwc, DType t, cudaStream_t s) {
  dispatch(t, [&](auto v) {
    using T = decltype(v);
    if (nhwc)
      gap_rows_fwd_k<<<blocks_for(batch * c), kThreads, 0, s>>>(
          static_cast<T*>(y), static_cast<const T*>(x), batch, c, plane);
    else
      gap_fwd_k<<<blocks_for(batch * c * 32), kThreads, 0, s>>>(
          static_cast<T*>(y), static_cast<const T*>(x), batch * c, plane);
  });
  check_launch();
}

void global_avg_pool_backward(void* dx, const void* dy, int64_t batch, int64_t c, int64_t plane,
                              bool nhwc, DType t, bool acc, cudaStream_t s) {
  dispatch(t, [&](auto v) {
    using T = decltype(v);
    if (nhwc)
      gap_rows_bwd_k<<<blocks_for(batch * c * plane), kThreads, 0, s>>>(
          static_cast<T*>(dx), static_cast<const T*>(dy), c, plane, batch * c * plane, acc);
    else
      gap_bwd_k<<<blocks_for(batch * c * plane), kThreads, 0, s>>>(
          static_cast<T*>(dx), static_cast<const T*>(dy), batch * c, plane, acc);
  });
  check_launch();
}

void set_dropout_step(uint64_t* step, uint64_t value, cudaStream_t s) {
  set_step_k<<<1, 1, 0, s>>>(step, value);
  check_launch();
}
void advance_dropout_step(uint64_t* step, cudaStream_t s) {
  advance_step_k<<<1, 1, 0, s>>>(step);
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

namespace {
// Channels-last reductions: at most this many row splits (the scratch holds c of them each).
int64_t bn_rows_max_splits(const BnShape& b) {
  return std::clamp<int64_t>((b.batch * b.plane + 15) / 16, 1, 2048);
}
struct RowsGrid {
  dim3 grid, block;
  uint32_t per = 0;
};
// Up to 32 channel vectors a block in x and the rest of kThreads as row lanes in y (a power of
// two); enough row splits for some thousand blocks, each thread summing at least 16 rows.
RowsGrid rows_grid(const BnShape& b, int vec) {
  const int64_t rows = b.batch * b.plane, cv = b.c / vec;
  const auto bx = static_cast<unsigned>(std::min<int64_t>(cv, 32));
  unsigned by = 1;
  while (by * 2 * bx <= static_cast<unsigned>(kThreads)) by *= 2;
  const int64_t gy = (cv + bx - 1) / bx;
  const int64_t want = (rows + by * 16 - 1) / (by * 16);
  const int64_t splits = std::clamp<int64_t>(
      want, 1, std::min(bn_rows_max_splits(b), std::max<int64_t>(1, 2048 / gy)));
  RowsGrid r;
  r.per = static_cast<uint32_t>((rows + splits - 1) / splits);
  r.grid = dim3(static_cast<unsigned>((rows + r.per - 1) / r.per), static_cast<unsigned>(gy));
  r.block = dim3(bx, by);
  return r;
}
RowWalk row_walk(const BnShape& b, int vec) { return RowWalk(b.batch * b.plane, b.c, vec); }
}  // namespace

int64_t bn_scratch_floats(const BnShape& b) {
  return b.c * (b.nhwc ? bn_rows_max_splits(b) : bn_splits(b)) * 2;
}

namespace {
// The walk for a batch norm's tensors: 16-byte vectors where the plane is a multiple of one and
// every pointer is aligned (the 7x7 planes of ResNet-50's last stage are not: one value a thread).
template <typename T, typename... P>
int bn_vec(const BnShape& b, const P*... p) {
  return (b.nhwc ? b.c : b.plane) % kVec<T> == 0 && all_aligned16(p...) ? kVec<T> : 1;
}
}  // namespace

void bn_statistics(float* mean, float* inv_std, float* running_mean, float* running_var,
                   const void* x, const BnShape& b, bool train, float* scratch, DType t,
                   cudaStream_t s) {
  const unsigned per_channel = static_cast<unsigned>((b.c + kThreads - 1) / kThreads);
  if (!train) {
    bn_running_k<<<per_channel, kThreads, 0, s>>>(mean, inv_std, running_mean, running_var, b);
    check_launch();
    return;
  }
  dispatch(t, [&](auto v) {
    using T = decltype(v);
    const int vec = bn_vec<T>(b, x);
    const auto* xt = static_cast<const T*>(x);
    int64_t splits = 0;
    with_vec<T>(vec, [&](auto vc) {
      constexpr int V = decltype(vc)::value;
      if (b.nhwc) {
        const RowsGrid r = rows_grid(b, vec);
        splits = r.grid.x;
        bn_stat_rows_k<T, V><<<r.grid, r.block, 0, s>>>(scratch, xt, row_walk(b, vec), r.per);
      } else {
        splits = bn_splits(b);
        const dim3 grid(static_cast<unsigned>(b.c), static_cast<unsigned>(splits));
        bn_stat_partial_k<T, V>
            <<<grid, kThreads, 0, s>>>(scratch, xt, NchwWalk(b.batch, b.c, b.plane, vec),
                                       static_cast<uint32_t>(bn_images_per_split(b)));
      }
    });
    bn_stat_final_k<<<per_channel, kThreads, 0, s>>>(mean, inv_std, running_mean, running_var,
                                                     scratch, xt, b, splits);
  });
  check_launch();
}

namespace {
__global__ void bn_sums_final_k(float* mean, float* inv_std, float* running_mean,
                                float* running_var, const float* sum, const float* sq, BnShape b) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= b.c) return;
  const double count = static_cast<double>(b.batch * b.plane);
  const double m = static_cast<double>(sum[c]) / count;
  // Biased, clamped at 0 against rounding (unshifted sums lose more of it than bn_statistics'
  // shifted ones); a NaN stays NaN.
  const double raw = static_cast<double>(sq[c]) / count - m * m;
  const double var = raw < 0.0 ? 0.0 : raw;
  bn_store_statistics(c, m, var, count, b, mean, inv_std, running_mean, running_var);
}
}  // namespace

void bn_statistics_from_sums(float* mean, float* inv_std, float* running_mean, float* running_var,
                             const float* sum, const float* sq, const BnShape& b, cudaStream_t s) {
  const unsigned per_channel = static_cast<unsigned>((b.c + kThreads - 1) / kThreads);
  bn_sums_final_k<<<per_channel, kThreads, 0, s>>>(mean, inv_std, running_mean, running_var, sum,
                                                   sq, b);
  check_launch();
}

namespace {
template <typename T, typename W>
void launch_bn_apply(const W& w, int vec, T* y, const T* x, const T* res, bool relu,
                     const float* mean, const float* inv_std, const float* gamma, const float* beta,
                     cudaStream_t s) {
  const unsigned blocks = blocks_for(w.vectors());
  with_vec<T>(vec, [&](auto vc) {
    constexpr int V = decltype(vc)::value;
    if (res && relu)
      bn_apply_k<T, V, true, true>
          <<<blocks, kThreads, 0, s>>>(y, x, res, mean, inv_std, gamma, beta, w);
    else if (res)
      bn_apply_k<T, V, true, false>
          <<<blocks, kThreads, 0, s>>>(y, x, res, mean, inv_std, gamma, beta, w);
    else if (relu)
      bn_apply_k<T, V, false, true>
          <<<blocks, kThreads, 0, s>>>(y, x, res, mean, inv_std, gamma, beta, w);
    else
      bn_apply_k<T, V, false, false>
          <<<blocks, kThreads, 0, s>>>(y, x, res, mean, inv_std, gamma, beta, w);
  });
}
}  // namespace

void bn_apply(void* y, const void* x, const void* res, bool relu, const float* mean,
              const float* inv_std, const float* gamma, const float* beta, const BnShape& b,
              DType t, cudaStream_t s) {
  dispatch(t, [&](auto v) {
    using T = decltype(v);
    const int vec = bn_vec<T>(b, y, x, res);
    auto* yt = static_cast<T*>(y);
    const auto *xt = static_cast<const T*>(x), *rt = static_cast<const T*>(res);
    if (b.nhwc)
      launch_bn_apply(row_walk(b, vec), vec, yt, xt, rt, relu, mean, inv_std, gamma, beta, s);
    else
      launch_bn_apply(NchwWalk(b.batch, b.c, b.plane, vec), vec, yt, xt, rt, relu, mean, inv_std,
                      gamma, beta, s);
  });
  check_launch();
}

void bn_backward(const BnGrad& g, float* dgamma, float* dbeta, const void* x, const float* mean,
                 const float* inv_std, const float* gamma, const BnShape& b, float* scratch,
                 DType t, cudaStream_t s) {
  if (g.relu_y && !g.dz)
    throw std::logic_error("bn_backward: a fused ReLU's gated gradient needs somewhere to go (dz)");
  dispatch(t, [&](auto v) {
    using T = decltype(v);
    const int vec = bn_vec<T>(b, g.dx, g.dres, g.dy, g.relu_y, g.dz, x);
    auto *dz = static_cast<T*>(g.dz), *dx = static_cast<T*>(g.dx), *dres = static_cast<T*>(g.dres);
    const auto *dy = static_cast<const T*>(g.dy), *ry = static_cast<const T*>(g.relu_y),
               *xt = static_cast<const T*>(x);
    const auto count = static_cast<float>(b.batch * b.plane);
    with_vec<T>(vec, [&](auto vc) {
      constexpr int V = decltype(vc)::value;
      // Pass 1: the two sums per channel (and g written to dz).
      int64_t splits = 0;
      if (b.nhwc) {
        const RowsGrid r = rows_grid(b, vec);
        splits = r.grid.x;
        const RowWalk w = row_walk(b, vec);
        if (ry)
          bn_grad_rows_k<T, V, true>
              <<<r.grid, r.block, 0, s>>>(scratch, dz, dy, ry, xt, mean, inv_std, w, r.per);
        else
          bn_grad_rows_k<T, V, false>
              <<<r.grid, r.block, 0, s>>>(scratch, dz, dy, ry, xt, mean, inv_std, w, r.per);
      } else {
        splits = bn_splits(b);
        const dim3 grid(static_cast<unsigned>(b.c), static_cast<unsigned>(splits));
        const NchwWalk w(b.batch, b.c, b.plane, vec);
        const auto per = static_cast<uint32_t>(bn_images_per_split(b));
        if (ry)
          bn_grad_partial_k<T, V, true>
              <<<grid, kThreads, 0, s>>>(scratch, dz, dy, ry, xt, mean, inv_std, w, per);
        else
          bn_grad_partial_k<T, V, false>
              <<<grid, kThreads, 0, s>>>(scratch, dz, dy, ry, xt, mean, inv_std, w, per);
      }
      bn_grad_final_k<<<static_cast<unsigned>((b.c + kThreads - 1) / kThreads), kThreads, 0, s>>>(
          dgamma, dbeta, scratch, b.c, splits);
      // Pass 2: dx (and the residual's gradient += g).
      if (!dx && !dres) return;
      const T* g_in = dz ? dz : dy;
      const auto run = [&](const auto& w) {
        bn_dx_k<T, V><<<blocks_for(w.vectors()), kThreads, 0, s>>>(
            dx, dres, g_in, xt, mean, inv_std, gamma, dgamma, dbeta, w, count, g.acc_x);
      };
      if (b.nhwc)
        run(row_walk(b, vec));
      else
        run(NchwWalk(b.batch, b.c, b.plane, vec));
    });
  });
  check_launch();
}

void sgd_update(float* w, float* v, const float* g, int64_t n, float lr, float momentum,
                float weight_decay, bool nesterov, bool first, cudaStream_t s) {
  sgd_k<<<blocks_for(n), kThreads, 0, s>>>(w, v, g, n, lr, momentum, weight_decay, nesterov, first);
  check_launch();
}

void mix_pair(float* x, const float* partner, int64_t n, cudaStream_t s) {
  mix_pair_k<<<blocks_for(n), kThreads, 0, s>>>(x, partner, n);
  check_launch();
}
void mix_correction(const float* sent, const float* partner, float* delta, int64_t n,
                    cudaStream_t s) {
  mix_correction_k<<<blocks_for(n), kThreads, 0, s>>>(sent, partner, delta, n);
  check_launch();
}
void apply_correction(float* x, const float* delta, int64_t n, cudaStream_t s) {
  apply_correction_k<<<blocks_for(n), kThreads, 0, s>>>(x, delta, n);
  check_launch();
}
void mix_copies(float* x, const float* mine, const float* theirs, int64_t n, cudaStream_t s) {
  mix_copies_k<<<blocks_for(n), kThreads, 0, s>>>(x, mine, theirs, n);
  check_launch();
}

void softmax_xent(float* dlogits, float* loss_and_count, const float* logits, const int32_t* labels,
                  int64_t n, int64_t classes, cudaStream_t s) {
  count_valid_k<<<1, 1, 0, s>>>(loss_and_count, labels, n);
  xent_row_k<<<static_cast<unsigned>(n), kThreads, 0, s>>>(dlogits, loss_and_count, logits, labels,
                                                           classes);
  sum_rows_k<<<1, 1, 0, s>>>(loss_and_count, labels, n, classes);
  check_launch();
}

}  // namespace gg::kernels::cuda
