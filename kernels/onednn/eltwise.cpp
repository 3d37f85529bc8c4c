// The element-wise passes the oneDNN executor runs itself: ReLU keeping NaN, a residual add fused
// with the ReLU that reads it, and the ReLU's gradient fused with the sum of two readers'
// gradients. Each kernel is built for AVX-512 and AVX2 as well as the baseline, picked by the
// instruction set oneDNN runs (kernels/onednn/isa.hpp: ONEDNN_MAX_CPU_ISA caps ours too), and split
// over the OpenMP threads in cache-line-aligned chunks.
#include "kernels/onednn/eltwise.hpp"

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/onednn/api.hpp"
#include "kernels/onednn/isa.hpp"

namespace gg::kernels {
namespace {

using dnnl::memory;
using dt = memory::data_type;

// y = relu(x) over n values, NaN kept (see relu_keeping_nan). The baseline's SSE is about 3x
// slower than oneDNN's JIT on a tensor that fits the cache; the AVX2 and AVX-512 builds run as
// fast as it. The loops are written so that GCC vectorises them.
[[gnu::always_inline]] inline void relu_f32(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] <= 0.f ? 0.f : x[i];
}

// The same, returning whether a value was NaN (about 30% slower on a tensor in the cache).
[[gnu::always_inline]] inline bool relu_f32_seeing_nan(const float* x, float* y, int64_t n) {
  int nan = 0;  // a bool here stops the vectoriser: 10x slower
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    nan |= v != v;
    y[i] = v <= 0.f ? 0.f : v;
  }
  return nan != 0;
}

// The same on bf16 bits, negative (-0 and -inf included) but not NaN giving +0; branch-free on
// integers, as fast as oneDNN's JIT with the NaN test included.
[[gnu::always_inline]] inline bool relu_bf16(const uint16_t* x, uint16_t* y, int64_t n) {
  uint16_t nan = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t v = x[i];
    const uint16_t is_nan = (v & 0x7fff) > 0x7f80 ? 1 : 0;
    nan |= is_nan;
    y[i] = (v < 0x8000) | is_nan ? v : uint16_t{0};
  }
  return nan != 0;
}

// a + b for two bf16 values, in fp32 and rounded once to nearest even, as oneDNN's sum rounds (a
// NaN stays a quiet NaN).
[[gnu::always_inline]] inline uint16_t bf16_sum(uint16_t a, uint16_t b) {
  float fa, fb;
  const uint32_t ua = uint32_t{a} << 16, ub = uint32_t{b} << 16;
  std::memcpy(&fa, &ua, 4);
  std::memcpy(&fb, &ub, 4);
  const float sum = fa + fb;
  uint32_t u;
  std::memcpy(&u, &sum, 4);
  const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
  return static_cast<uint16_t>(nan ? (u >> 16) | 0x40u : (u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// y = relu(a + b), NaN kept, returning whether a value was NaN: a residual add and the ReLU that
// is its only reader in one pass, where oneDNN's sum and then relu_keeping_nan wrote and read the
// tensor once more. The same numbers as the two passes: the sum rounds once, as oneDNN's does.
[[gnu::always_inline]] inline bool add_relu_f32(const float* a, const float* b, float* y,
                                                int64_t n) {
  int nan = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float v = a[i] + b[i];
    nan |= v != v;
    y[i] = v <= 0.f ? 0.f : v;
  }
  return nan != 0;
}

[[gnu::always_inline]] inline bool add_relu_bf16(const uint16_t* a, const uint16_t* b, uint16_t* y,
                                                 int64_t n) {
  uint16_t nan = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t v = bf16_sum(a[i], b[i]);
    const uint16_t is_nan = (v & 0x7fff) > 0x7f80 ? 1 : 0;
    nan |= is_nan;
    y[i] = (v < 0x8000) | is_nan ? v : uint16_t{0};
  }
  return nan != 0;
}

// Splits n elements of `size` bytes over the OpenMP threads in chunks of whole cache lines and
// calls f(first, count) for every non-empty chunk; returns the OR of what the calls return.
template <class F>
int split_over_threads(int64_t n, int64_t size, F f) {
  int any = 0;
#pragma omp parallel reduction(| : any)
  {
    const int64_t parts = omp_get_num_threads(), per_line = 64 / size;
    // ceil(n / parts), rounded up to whole cache lines: the chunks cover all n elements (a
    // floor here left the last n % parts elements unwritten).
    const int64_t chunk = ((n + parts - 1) / parts + per_line - 1) / per_line * per_line;
    const int64_t first = std::min(n, chunk * omp_get_thread_num());
    const int64_t count = std::min(n - first, chunk);
    if (count > 0) any |= f(first, count);
  }
  return any;
}

// The gradient of a ReLU computed in place whose output two layers read: dx = y <= 0 ? +0 : a + b
// (a, b: the readers' gradients), one pass instead of oneDNN's sum and then its ReLU backward,
// which write and read the whole tensor once more. A NaN in y passes the gradient, as oneDNN's
// ReLU backward from the output and PyTorch's threshold_backward do; where y <= 0 it is +0, as
// PyTorch gives (oneDNN: 0 times the gradient, -0 for a negative one). bf16 sums are rounded
// once, to nearest even, as oneDNN's sum rounds. The sum is computed for every element and then
// selected: a sum only where the gradient passes made the loads of a and b conditional, which
// GCC vectorises only with AVX-512's masked loads, so the AVX2 and baseline builds ran a scalar
// loop with a branch on the sign of y.
[[gnu::always_inline]] inline void relu_backward_sum2_f32(const float* y, const float* a,
                                                          const float* b, float* dx, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float sum = a[i] + b[i];
    uint32_t bits;
    std::memcpy(&bits, &sum, 4);
    bits &= y[i] <= 0.f ? 0u : ~0u;  // false for NaN
    std::memcpy(dx + i, &bits, 4);
  }
}

[[gnu::always_inline]] inline void relu_backward_sum2_bf16(const uint16_t* y, const uint16_t* a,
                                                           const uint16_t* b, uint16_t* dx,
                                                           int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t v = y[i], sum = bf16_sum(a[i], b[i]);
    // y <= 0: +0, -0 or negative and not NaN (sign bit set, magnitude at most infinity's).
    const bool at_most_zero = v == 0 || (v >= 0x8000 && (v & 0x7fff) <= 0x7f80);
    dx[i] = at_most_zero ? uint16_t{0} : sum;
  }
}

// dst = s[0] + ... + s[k - 1] in fp32, left to right, over n values (k >= 2), a chunk at a time so
// that the partial sums stay in the L1 cache between the sources' passes.
constexpr int64_t kSumChunk = 2048;

[[gnu::always_inline]] inline void sum_f32(const float* const* s, int k, float* dst, int64_t n) {
  for (int64_t c = 0; c < n; c += kSumChunk) {
    const int64_t m = std::min(kSumChunk, n - c);
    float* d = dst + c;
    const float *a = s[0] + c, *b = s[1] + c;
    for (int64_t i = 0; i < m; ++i) d[i] = a[i] + b[i];
    for (int j = 2; j < k; ++j) {
      const float* x = s[j] + c;
      for (int64_t i = 0; i < m; ++i) d[i] += x[i];
    }
  }
}

}  // namespace

bool relu_keeping_nan(const memory& x, const memory& y, bool report) {
  const memory::desc md = x.get_desc();
  const bool f32 = onednn::type_of(md) == dt::f32;
  const int64_t size = f32 ? 4 : 2;
  const int64_t n = static_cast<int64_t>(md.get_size()) / size;
  char* a = static_cast<char*>(x.get_data_handle());
  char* b = static_cast<char*>(y.get_data_handle());
  const int nan = split_over_threads(n, size, [&](int64_t first, int64_t count) -> int {
    if (!f32)
      return vectorised<relu_bf16>(reinterpret_cast<const uint16_t*>(a) + first,
                                   reinterpret_cast<uint16_t*>(b) + first, count);
    const float* from = reinterpret_cast<const float*>(a) + first;
    float* to = reinterpret_cast<float*>(b) + first;
    if (report) return vectorised<relu_f32_seeing_nan>(from, to, count);
    vectorised<relu_f32>(from, to, count);
    return 0;
  });
  return report && nan != 0;
}

bool add_relu_keeping_nan(const memory& a, const memory& b, const memory& y, bool report) {
  const memory::desc md = y.get_desc();
  const bool f32 = onednn::type_of(md) == dt::f32;
  const int64_t size = f32 ? 4 : 2;
  const int64_t n = static_cast<int64_t>(md.get_size()) / size;
  const char* pa = static_cast<const char*>(a.get_data_handle());
  const char* pb = static_cast<const char*>(b.get_data_handle());
  char* py = static_cast<char*>(y.get_data_handle());
  const int nan = split_over_threads(n, size, [&](int64_t first, int64_t count) -> int {
    if (f32)
      return vectorised<add_relu_f32>(reinterpret_cast<const float*>(pa) + first,
                                      reinterpret_cast<const float*>(pb) + first,
                                      reinterpret_cast<float*>(py) + first, count);
    return vectorised<add_relu_bf16>(reinterpret_cast<const uint16_t*>(pa) + first,
                                     reinterpret_cast<const uint16_t*>(pb) + first,
                                     reinterpret_cast<uint16_t*>(py) + first, count);
  });
  return report && nan != 0;
}

void relu_backward_sum2(const memory& y, const memory& a, const memory& b, const memory& dx) {
  const memory::desc md = y.get_desc();
  const bool f32 = onednn::type_of(md) == dt::f32;
  const int64_t n = static_cast<int64_t>(md.get_size()) / (f32 ? 4 : 2);
  const void* py = y.get_data_handle();
  const void* pa = a.get_data_handle();
  const void* pb = b.get_data_handle();
  void* pdx = dx.get_data_handle();
  split_over_threads(n, f32 ? 4 : 2, [&](int64_t first, int64_t count) {
    if (f32)
      vectorised<relu_backward_sum2_f32>(
          static_cast<const float*>(py) + first, static_cast<const float*>(pa) + first,
          static_cast<const float*>(pb) + first, static_cast<float*>(pdx) + first, count);
    else
      vectorised<relu_backward_sum2_bf16>(
          static_cast<const uint16_t*>(py) + first, static_cast<const uint16_t*>(pa) + first,
          static_cast<const uint16_t*>(pb) + first, static_cast<uint16_t*>(pdx) + first, count);
    return 0;
  });
}

void sum_of(const std::vector<memory>& srcs, const memory& dst) {
  const int64_t n = static_cast<int64_t>(dst.get_desc().get_size()) / 4;
  const int k = static_cast<int>(srcs.size());
  std::vector<const float*> from;
  for (const memory& m : srcs) from.push_back(static_cast<const float*>(m.get_data_handle()));
  float* to = static_cast<float*>(dst.get_data_handle());
  split_over_threads(n, 4, [&](int64_t first, int64_t count) {
    std::vector<const float*> s(from.size());
    for (int j = 0; j < k; ++j) s[j] = from[j] + first;
    vectorised<sum_f32>(s.data(), k, to + first, count);
    return 0;
  });
}

}  // namespace gg::kernels
