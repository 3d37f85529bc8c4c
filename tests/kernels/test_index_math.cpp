// Tests for the CUDA kernels' index arithmetic (kernels/cuda/index_math.hpp), which is plain C++
// and so runs here without a GPU: FastDiv against `/` over every divisor the models' shapes
// produce and the edges of its range, and the NCHW walk's channels and per-channel coverage at
// ResNet-50's and GoogLeNet's planes, with vectors that divide the plane and without.
#include <catch2/catch.hpp>
#include <cstdint>
#include <random>
#include <set>
#include <vector>

#include "kernels/cuda/index_math.hpp"

using gg::kernels::cuda::FastDiv;
using gg::kernels::cuda::kFastDivLimit;
using gg::kernels::cuda::NchwWalk;
using gg::kernels::cuda::RowWalk;

TEST_CASE("FastDiv divides like / over its whole range") {
  std::mt19937_64 rng(7);
  std::vector<uint32_t> divisors;
  for (uint32_t d = 1; d <= 4096; ++d) divisors.push_back(d);
  for (int s = 12; s <= 31; ++s) {
    const uint32_t p = uint32_t{1} << s;
    for (uint32_t d : {p - 1, p, p + 1}) divisors.push_back(d);
  }
  for (int i = 0; i < 2000; ++i)
    divisors.push_back(1 + static_cast<uint32_t>(rng() % kFastDivLimit));
  divisors.push_back(kFastDivLimit);
  for (uint32_t d : divisors) {
    if (d > kFastDivLimit) continue;
    const FastDiv f(d);
    std::vector<uint32_t> ns = {0, 1, d - 1, d, d + 1, 2 * d - 1, kFastDivLimit, kFastDivLimit - 1};
    for (int i = 0; i < 200; ++i)
      ns.push_back(static_cast<uint32_t>(rng() % (kFastDivLimit + 1ull)));
    for (uint32_t n : ns) {
      if (n > kFastDivLimit) continue;
      if (f.div(n) != n / d || f.mod(n) != n % d) {
        FAIL_CHECK(n << " / " << d << ": " << f.div(n) << " rem " << f.mod(n));
        return;
      }
    }
  }
  CHECK_THROWS_WITH(FastDiv(0), "FastDiv: divisor 0 is outside [1, 2^31)");
  CHECK_THROWS_AS(FastDiv(int64_t{1} << 31), std::invalid_argument);
}

TEST_CASE("the NCHW walk finds each vector's channel and covers each channel's values once") {
  struct Shape {
    int64_t batch, c, plane;
  };
  // 112x112, 56x56, 28x28, 14x14 and 7x7 planes (ResNet-50), GoogLeNet's odd channel counts,
  // planes of 1 (a fully connected layer's bias) and planes that no vector divides.
  for (const Shape s : {Shape{3, 5, 12544}, Shape{2, 64, 3136}, Shape{4, 3, 784}, Shape{5, 7, 196},
                        Shape{3, 9, 49}, Shape{2, 480, 196}, Shape{7, 10, 1}, Shape{2, 3, 25}}) {
    for (int vec : {1, 4, 8}) {
      if (s.plane % vec != 0) continue;
      const NchwWalk w(s.batch, s.c, s.plane, vec);
      REQUIRE(int64_t{w.vectors()} * vec == s.batch * s.c * s.plane);
      for (uint32_t j = 0; j < w.vectors(); ++j)
        if (w.channel(j) != (int64_t{j} * vec / s.plane) % s.c) {
          FAIL_CHECK("plane " << s.plane << " vec " << vec << ": vector " << j << " in channel "
                              << w.channel(j));
          break;
        }
      // Channel ch of images [n0, n0 + k): k * plane / vec vectors, every value once.
      for (uint32_t ch : {uint32_t{0}, static_cast<uint32_t>(s.c - 1)}) {
        const uint32_t n0 = static_cast<uint32_t>(s.batch / 2),
                       k = static_cast<uint32_t>(s.batch - n0);
        std::set<int64_t> seen;
        for (uint32_t q = 0; q < k * s.plane / vec; ++q) {
          const int64_t at = w.at(q, ch, n0);
          for (int e = 0; e < vec; ++e) seen.insert(at + e);
        }
        std::set<int64_t> want;
        for (int64_t n = n0; n < s.batch; ++n)
          for (int64_t e = 0; e < s.plane; ++e) want.insert((n * s.c + ch) * s.plane + e);
        CHECK(seen == want);
      }
    }
  }
  CHECK_THROWS_AS(NchwWalk(2, 3, 49, 4), std::invalid_argument);
  CHECK_THROWS_WITH(NchwWalk(1024, 2048, 1 << 20, 8),
                    "CUDA backend: a tensor has 2199023255552 elements, more than the 2^31 - 1 "
                    "its kernels index: lower train.batch");
}

TEST_CASE("the channels-last walk gives each vector lane its channel") {
  for (const auto& [rows, c] :
       {std::pair<int64_t, int64_t>{49 * 3, 2048}, {12544, 64}, {25, 24}, {7, 5}, {4, 8}}) {
    for (int vec : {1, 4, 8}) {
      if (c % vec != 0) continue;
      const RowWalk w(rows, c, vec);
      REQUIRE(int64_t{w.vectors()} * vec == rows * c);
      for (uint32_t j = 0; j < w.vectors(); ++j)
        for (uint32_t e = 0; e < static_cast<uint32_t>(vec); ++e)
          if (w.channel(j) + e * RowWalk::kLaneStep != (int64_t{j} * vec + e) % c) {
            FAIL_CHECK("c " << c << " vec " << vec << ": vector " << j << " lane " << e);
            return;
          }
    }
  }
  CHECK_THROWS_AS(RowWalk(10, 6, 4), std::invalid_argument);
}
