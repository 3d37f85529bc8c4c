// The bf16 wire's rounding (gossip/comm/exchange.hpp): to nearest, ties to even, NaN and
// infinities kept, within half a bf16 step of the value.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>

#include "gossip/comm/exchange.hpp"

using gg::gossip::from_bf16;
using gg::gossip::to_bf16;

namespace {
float bits(uint32_t u) {
  float f = 0;
  std::memcpy(&f, &u, 4);
  return f;
}
}  // namespace

TEST_CASE("bf16 wire rounding is to nearest with ties to even") {
  CHECK(from_bf16(to_bf16(1.0f)) == 1.0f);
  CHECK(from_bf16(to_bf16(-2.5f)) == -2.5f);
  CHECK(from_bf16(to_bf16(0.0f)) == 0.0f);
  CHECK(std::signbit(from_bf16(to_bf16(-0.0f))));
  // 1 + 2^-8 lies half way between 1 and 1 + 2^-7: to even (1). 1 + 3 * 2^-8: to 1 + 2^-6.
  CHECK(from_bf16(to_bf16(1.0f + std::ldexp(1.0f, -8))) == 1.0f);
  CHECK(from_bf16(to_bf16(1.0f + 3 * std::ldexp(1.0f, -8))) == 1.0f + std::ldexp(1.0f, -6));
  // Just above half way rounds up.
  CHECK(from_bf16(to_bf16(bits(0x3f808001u))) == bits(0x3f810000u));
  CHECK(std::isnan(from_bf16(to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  CHECK(std::isnan(from_bf16(to_bf16(bits(0x7f800001u)))));  // a NaN whose payload is all low
  CHECK(from_bf16(to_bf16(std::numeric_limits<float>::infinity())) ==
        std::numeric_limits<float>::infinity());
  CHECK(from_bf16(to_bf16(std::numeric_limits<float>::max())) ==
        std::numeric_limits<float>::infinity());  // rounds past the largest bf16
}

TEST_CASE("bf16 wire rounding stays within half a unit in the last place") {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> exponent(-30.f, 30.f);
  for (int i = 0; i < 100000; ++i) {
    const float x = std::exp2(exponent(rng)) * (rng() % 2 ? 1.f : -1.f);
    const float q = from_bf16(to_bf16(x));
    INFO(x);
    REQUIRE(std::fabs(q - x) <= std::ldexp(std::fabs(x), -8));
  }
}
