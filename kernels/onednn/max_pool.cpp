#include "kernels/onednn/max_pool.hpp"

#include <algorithm>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

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

#if defined(__SSE2__)
// Four lanes at a time in SSE2 registers (every x86-64 has them): the maxima and, beside them,
// their window positions as floats, both chosen by one compare.
template <int B>
void forward_plane(const float* x, float* y, uint8_t* arg, const BlockedPool& s) {
  constexpr int Q = B / 4;
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
      __m128 m[Q], a[Q];
      const float* first = x + (win.h0 * w + win.w0) * B;
      const __m128 at0 =
          _mm_set1_ps(static_cast<float>((win.h0 - win.top) * k + (win.w0 - win.left)));
      for (int q = 0; q < Q; ++q) {
        m[q] = _mm_loadu_ps(first + 4 * q);
        a[q] = at0;
      }
      for (int64_t ih = win.h0; ih < win.h1; ++ih)
        for (int64_t iw = win.w0; iw < win.w1; ++iw) {
          const float* v = x + (ih * w + iw) * B;
          const __m128 at = _mm_set1_ps(static_cast<float>((ih - win.top) * k + (iw - win.left)));
          for (int q = 0; q < Q; ++q) {
            const __m128 value = _mm_loadu_ps(v + 4 * q);
            const __m128 more = _mm_cmpgt_ps(value, m[q]);
            m[q] = _mm_or_ps(_mm_and_ps(more, value), _mm_andnot_ps(more, m[q]));
            a[q] = _mm_or_ps(_mm_and_ps(more, at), _mm_andnot_ps(more, a[q]));
          }
        }
      for (int q = 0; q < Q; ++q) {
        _mm_storeu_ps(out + 4 * q, m[q]);
        alignas(16) int32_t i[4];
        _mm_store_si128(reinterpret_cast<__m128i*>(i), _mm_cvtps_epi32(a[q]));
        for (int l = 0; l < 4; ++l) where[4 * q + l] = static_cast<uint8_t>(i[l]);
      }
    }
}
#else
template <int B>
void forward_plane(const float* x, float* y, uint8_t* arg, const BlockedPool& s) {
  for (int64_t oh = 0; oh < s.oh; ++oh)
    for (int64_t ow = 0; ow < s.ow; ++ow) {
      const Window win = window(s, oh, ow);
      float m[B];
      uint8_t a[B];
      std::fill(m, m + B, 0.f);
      std::fill(a, a + B, uint8_t{255});
      bool first = true;
      for (int64_t ih = win.h0; ih < win.h1; ++ih)
        for (int64_t iw = win.w0; iw < win.w1; ++iw) {
          const float* v = x + (ih * s.w + iw) * B;
          const auto at = static_cast<uint8_t>((ih - win.top) * s.k + (iw - win.left));
          for (int l = 0; l < B; ++l)
            if (first || v[l] > m[l]) {
              m[l] = v[l];
              a[l] = at;
            }
          first = false;
        }
      std::memcpy(y + (oh * s.ow + ow) * B, m, sizeof(m));
      std::memcpy(arg + (oh * s.ow + ow) * B, a, sizeof(a));
    }
}
#endif

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
  for (int64_t p = 0; p < planes; ++p) forward_plane<B>(x + p * in, y + p * out, arg + p * out, s);
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
