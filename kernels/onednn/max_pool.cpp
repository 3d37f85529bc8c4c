#include "kernels/onednn/max_pool.hpp"

#include <algorithm>
#include <cstring>
#include <utility>

#include "kernels/onednn/isa.hpp"

namespace gg::kernels {
namespace {

// The window of output (oh, ow): its corner (top, left), which padding may put outside the
// input, and its part inside the input, rows [h0, h1), columns [w0, w1).
struct Window {
  int64_t top, left, h0, h1, w0, w1;
};
Window window(const BlockedPool& s, int64_t oh, int64_t ow) {
  const int64_t top = oh * s.stride - s.pad, left = ow * s.stride - s.pad;
  return {top,
          left,
          std::max<int64_t>(top, 0),
          std::min<int64_t>(top + s.k, s.h),
          std::max<int64_t>(left, 0),
          std::min<int64_t>(left + s.k, s.w)};
}

// One window position's B channels as one vector (GCC's vector extensions: a ymm register in the
// AVX2 build when B = 8, two xmm in the baseline's, a zmm in the AVX-512 build when B = 16).
template <int B>
struct Lanes {
  typedef float F __attribute__((vector_size(4 * B)));
  typedef int32_t I __attribute__((vector_size(4 * B)));
  typedef uint8_t U8 __attribute__((vector_size(B)));
  typedef uint8_t Bytes __attribute__((vector_size(4 * B)));
};

// The low byte of each lane of a: one byte shuffle (__builtin_convertvector gave a scalar extract
// and shift per lane on AVX2).
template <int B, size_t... L>
[[gnu::always_inline]] inline typename Lanes<B>::U8 low_bytes(typename Lanes<B>::I a,
                                                              std::index_sequence<L...>) {
  typename Lanes<B>::Bytes b;
  std::memcpy(&b, &a, sizeof(b));
  return __builtin_shufflevector(b, b, (4 * L)...);
}

// The maxima of one channel block's plane and, beside them, their window positions, both chosen
// by one compare: a value replaces the maximum only when greater (the first of equal maxima wins;
// a NaN never does, see max_pool_nan in the executor). Built for AVX-512, AVX2 and the baseline
// (kernels/onednn/isa.hpp).
template <int B>
[[gnu::always_inline]] inline void forward_plane(const float* x, float* y, uint8_t* arg,
                                                 const BlockedPool* pool) {
  using F = typename Lanes<B>::F;
  using I = typename Lanes<B>::I;
  using U8 = typename Lanes<B>::U8;
  const BlockedPool& s = *pool;
  const int64_t w = s.w, k = s.k;
  for (int64_t oh = 0; oh < s.oh; ++oh)
    for (int64_t ow = 0; ow < s.ow; ++ow) {
      const Window win = window(s, oh, ow);
      float* out = y + (oh * s.ow + ow) * B;
      uint8_t* where = arg + (oh * s.ow + ow) * B;
      if (win.h0 >= win.h1 || win.w0 >= win.w1) {  // no input position in the window
        std::fill(out, out + B, 0.f);
        std::fill(where, where + B, uint8_t{255});
        continue;
      }
      // Start from the window's first position (comparing it with itself changes nothing).
      F m;
      std::memcpy(&m, x + (win.h0 * w + win.w0) * B, sizeof(F));
      I a = I{} + static_cast<int32_t>((win.h0 - win.top) * k + (win.w0 - win.left));
      for (int64_t ih = win.h0; ih < win.h1; ++ih)
        for (int64_t iw = win.w0; iw < win.w1; ++iw) {
          F v;
          std::memcpy(&v, x + (ih * w + iw) * B, sizeof(F));
          const I more = v > m;
          m = more ? v : m;
          a = more ? static_cast<int32_t>((ih - win.top) * k + (iw - win.left)) : a;
        }
      std::memcpy(out, &m, sizeof(F));
      const U8 bytes = low_bytes<B>(a, std::make_index_sequence<B>());
      std::memcpy(where, &bytes, sizeof(U8));
    }
}

// offset[i]: where window position i lies from the window's corner, in pixels of the plane.
template <int B>
void backward_plane(const float* dy, const uint8_t* arg, float* dx, const BlockedPool& s,
                    const int* offset) {
  std::memset(dx, 0, sizeof(float) * s.h * s.w * B);
  for (int64_t oh = 0; oh < s.oh; ++oh)
    for (int64_t ow = 0; ow < s.ow; ++ow) {
      const float* g = dy + (oh * s.ow + ow) * B;
      const uint8_t* a = arg + (oh * s.ow + ow) * B;
      const Window win = window(s, oh, ow);
      float* corner = dx + (win.top * s.w + win.left) * B;
      for (int l = 0; l < B; ++l)
        if (a[l] != 255) corner[offset[a[l]] * B + l] += g[l];
    }
}

template <int B>
void forward(const float* x, float* y, uint8_t* arg, const BlockedPool& s) {
  const int64_t planes = s.n * s.blocks, in = s.h * s.w * B, out = s.oh * s.ow * B;
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < planes; ++p)
    vectorised<forward_plane<B>>(x + p * in, y + p * out, arg + p * out, &s);
}

template <int B>
void backward(const float* dy, const uint8_t* arg, float* dx, const BlockedPool& s) {
  const int64_t planes = s.n * s.blocks, in = s.h * s.w * B, out = s.oh * s.ow * B;
  int offset[255];
  for (int i = 0; i < 255; ++i) offset[i] = static_cast<int>((i / s.k) * s.w + i % s.k);
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < planes; ++p)
    backward_plane<B>(dy + p * out, arg + p * out, dx + p * in, s, offset);
}

}  // namespace

BlockedPool blocked_pool(const Node& pool, const Dims& input, int64_t batch, int block) {
  BlockedPool s;
  s.n = batch;
  s.blocks = (input[0] + block - 1) / block;
  s.h = input[1];
  s.w = input[2];
  s.oh = pool.out[1];
  s.ow = pool.out[2];
  s.k = static_cast<int>(pool.pool.kernel);
  s.stride = static_cast<int>(pool.pool.stride);
  s.pad = static_cast<int>(pool.pool.pad);
  s.block = block;
  return s;
}

void blocked_max_pool_forward(const float* x, float* y, uint8_t* arg, const BlockedPool& s) {
  if (s.block == 16)
    forward<16>(x, y, arg, s);
  else
    forward<8>(x, y, arg, s);
}

void blocked_max_pool_backward(const float* dy, const uint8_t* arg, float* dx,
                               const BlockedPool& s) {
  if (s.block == 16)
    backward<16>(dy, arg, dx, s);
  else
    backward<8>(dy, arg, dx, s);
}

}  // namespace gg::kernels
