// kernels/onednn/max_pool: the blocked max pool (nChw8c / nChw16c) against plain loops over the
// same channel-blocked tensor, forward values, the gradient's routing (first maximum in scan
// order wins a tie), windows clipped by padding and by ceil mode, channels that do not fill the
// last block. Both block sizes run on every CPU (oneDNN picks 8 on AVX2 and 16 on AVX-512).
#include <catch2/catch.hpp>
#include <cstdint>
#include <vector>

#include "kernels/onednn/max_pool.hpp"

using gg::kernels::BlockedPool;

namespace {

// Index of (n, c, h, w) in a channel-blocked tensor of `blocks` blocks of `b` channels.
int64_t at(int64_t n, int64_t c, int64_t h, int64_t w, int64_t blocks, int64_t hh, int64_t ww,
           int b) {
  return (((n * blocks + c / b) * hh + h) * ww + w) * b + c % b;
}

struct Plain {
  std::vector<float> y, dx;
};

// The pool by its definition, one channel at a time.
Plain plain_pool(const std::vector<float>& x, const std::vector<float>& dy, const BlockedPool& s,
                 int64_t channels) {
  Plain r{std::vector<float>(dy.size(), 0.f), std::vector<float>(x.size(), 0.f)};
  for (int64_t n = 0; n < s.n; ++n)
    for (int64_t c = 0; c < channels; ++c)
      for (int64_t oh = 0; oh < s.oh; ++oh)
        for (int64_t ow = 0; ow < s.ow; ++ow) {
          int64_t best = -1;
          for (int kh = 0; kh < s.k; ++kh)
            for (int kw = 0; kw < s.k; ++kw) {
              const int64_t ih = oh * s.stride - s.pad + kh, iw = ow * s.stride - s.pad + kw;
              if (ih < 0 || ih >= s.h || iw < 0 || iw >= s.w) continue;
              const int64_t i = at(n, c, ih, iw, s.blocks, s.h, s.w, s.block);
              if (best < 0 || x[i] > x[best]) best = i;
            }
          const int64_t o = at(n, c, oh, ow, s.blocks, s.oh, s.ow, s.block);
          r.y[o] = x[best];
          r.dx[best] += dy[o];
        }
  return r;
}

}  // namespace

TEST_CASE("blocked max pool equals the pool's definition, forward and gradient, ties included",
          "[onednn]") {
  struct Case {
    int k, stride, pad;
    int64_t h, oh;  // square input and output (oh by PyTorch's rule, ceil mode where noted)
  };
  const Case c = GENERATE(values<Case>({{3, 1, 1, 9, 9},   // GoogLeNet's branch pool
                                        {3, 2, 0, 9, 4},   // floor mode
                                        {3, 2, 0, 10, 5},  // ceil mode: the last window clipped
                                        {2, 2, 0, 7, 4},   // ceil mode, a window of one column
                                        {3, 2, 1, 8, 4}}));
  const int block = GENERATE(8, 16);
  const int64_t channels = GENERATE(8, 20);
  BlockedPool s;
  s.n = 2;
  s.blocks = (channels + block - 1) / block;
  s.h = s.w = c.h;
  s.oh = s.ow = c.oh;
  s.k = c.k;
  s.stride = c.stride;
  s.pad = c.pad;
  s.block = block;
  INFO("k " << c.k << " stride " << c.stride << " pad " << c.pad << " in " << c.h << " out " << c.oh
            << " block " << block << " channels " << channels);
  std::vector<float> x(s.n * s.blocks * s.h * s.w * block, 0.f);
  std::vector<float> dy(s.n * s.blocks * s.oh * s.ow * block, 0.f);
  uint32_t r = 12345;
  auto next = [&r]() { return r = r * 1664525u + 1013904223u; };
  for (int64_t n = 0; n < s.n; ++n)
    for (int64_t ch = 0; ch < channels; ++ch) {  // lanes past `channels` stay 0, as oneDNN pads
      for (int64_t h = 0; h < s.h; ++h)
        for (int64_t w = 0; w < s.w; ++w)  // few distinct values: many ties, negatives too
          x[at(n, ch, h, w, s.blocks, s.h, s.w, block)] = static_cast<float>(next() % 7) - 3.f;
      for (int64_t h = 0; h < s.oh; ++h)
        for (int64_t w = 0; w < s.ow; ++w)  // neighbouring outputs differ: misrouting shows
          dy[at(n, ch, h, w, s.blocks, s.oh, s.ow, block)] =
              static_cast<float>(1 + (h * s.ow + w) % 5) * 0.25f;
    }
  const Plain want = plain_pool(x, dy, s, channels);
  std::vector<float> y(dy.size(), -99.f), dx(x.size(), -99.f);
  std::vector<uint8_t> arg(dy.size());
  gg::kernels::blocked_max_pool_forward(x.data(), y.data(), arg.data(), s);
  gg::kernels::blocked_max_pool_backward(dy.data(), arg.data(), dx.data(), s);
  CHECK(y == want.y);
  CHECK(dx == want.dx);
}
