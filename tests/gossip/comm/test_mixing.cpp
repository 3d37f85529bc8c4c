// The mixing rules and the wire codecs alone (gossip/comm/mixing.hpp, wire.hpp): hand-computed
// values, no MPI, no threads.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <stdexcept>
#include <vector>

#include "gossip/comm/mixing.hpp"
#include "gossip/comm/wire.hpp"
#include "shuffle/rng.hpp"

using namespace gg::gossip;

TEST_CASE("the gossip step is the pairwise average, element by element") {
  std::vector<float> x = {1, -2, 10, 0.25f};
  const std::vector<float> y = {3, 2, -6, 0.75f};
  mix_pair(x, y);
  CHECK(x == std::vector<float>{2, 0, 2, 0.5f});
  std::vector<float> short_one(3);
  CHECK_THROWS_AS(mix_pair(short_one, y), std::invalid_argument);
}

TEST_CASE("the delayed correction applied to the sent values gives the pairwise average") {
  const std::vector<float> sent = {1, -2, 10};
  const std::vector<float> partner = {3, 2, -6};
  std::vector<float> delta(3);
  mix_correction(sent, partner, delta);
  CHECK(delta == std::vector<float>{1, 2, -8});
  // The buffer moved on by an update meanwhile: the correction lands on the moved values.
  std::vector<float> x = {1.5f, -2, 9};
  apply_correction(x, delta);
  CHECK(x == std::vector<float>{2.5f, 0, 1});
}

TEST_CASE("a sum over ranks becomes their mean") {
  std::vector<float> x = {4, -8, 2};
  mean_of_sum(x, 4);
  CHECK(x == std::vector<float>{1, -2, 0.5f});
  CHECK_THROWS_AS(mean_of_sum(x, 0), std::invalid_argument);
}

TEST_CASE("staleness 1 mixes this step's or the previous step's bucket, never older ones") {
  CHECK(freshness(-1, 0, false) == Freshness::Unmixed);  // nothing arrived yet
  CHECK(freshness(7, 7, false) == Freshness::Fresh);
  CHECK(freshness(6, 7, false) == Freshness::Late);
  CHECK(freshness(6, 7, true) == Freshness::Unmixed);     // late = skip
  CHECK(freshness(5, 7, false) == Freshness::Unmixed);    // two steps old
  CHECK(freshness(-1, 40, false) == Freshness::Unmixed);  // an exchange made at step 40
}

TEST_CASE("bf16 packing: two values per float, error feedback carries what rounding took") {
  CHECK(wire_floats(Wire::Fp32, 5) == 5);
  CHECK(wire_floats(Wire::Bf16, 5) == 3);
  CHECK(wire_floats(Wire::Bf16, 4) == 2);
  // 1 + 2^-9 rounds to 1 in bf16 (7 bits of mantissa); the residue keeps the 2^-9.
  const float small = 1.0f / 512;
  std::vector<float> x = {1 + small, 2, -3};
  std::vector<float> residue(3, 0.f);
  std::vector<uint16_t> out(4, 0xffff);
  pack_bf16(x, residue, out.data());
  CHECK(out[3] == 0);  // an odd count's unused half is zeroed
  std::vector<float> back(3);
  unpack_bf16(out.data(), back);
  CHECK(back == std::vector<float>{1, 2, -3});
  CHECK(residue == std::vector<float>{small, 0, 0});
  // Over sends with feedback, what was sent plus the residue left is what should have been:
  // 1 + 2^-9 three times goes out as 1, 1 (a tie: to even) and 1 + 2^-7, leaving -2^-9.
  float sent = back[0];
  for (int i = 0; i < 2; ++i) {
    pack_bf16(x, residue, out.data());
    std::vector<float> again(3);
    unpack_bf16(out.data(), again);
    sent += again[0];
  }
  CHECK(sent == 3 + 4 * small);
  CHECK(residue[0] == -small);
  CHECK(sent + residue[0] == 3 * (1 + small));
  // Without a residue: plain rounding, nothing kept.
  pack_bf16(x, {}, out.data());
  unpack_bf16(out.data(), back);
  CHECK(back[0] == 1.f);
  std::vector<float> wrong(2);
  CHECK_THROWS_AS(pack_bf16(x, wrong, out.data()), std::invalid_argument);
}

namespace {
// The values packed and unpacked again on a quantized wire (residue: error feedback, or none).
std::vector<float> round_trip(Wire w, const std::vector<float>& x, std::vector<float>* residue) {
  std::vector<float> room(static_cast<size_t>(wire_floats(w, static_cast<int64_t>(x.size()))),
                          -1.f);
  pack_quant(w, x, residue ? std::span<float>(*residue) : std::span<float>(), room.data());
  std::vector<float> back(x.size());
  unpack_quant(w, room.data(), back);
  return back;
}
// The largest magnitude in the block of kQuantBlock values that holds x[i].
float block_max(const std::vector<float>& x, size_t i) {
  const size_t lo = i / kQuantBlock * kQuantBlock, hi = std::min(x.size(), lo + kQuantBlock);
  float m = 0;
  for (size_t j = lo; j < hi; ++j) m = std::max(m, std::fabs(x[j]));
  return m;
}
// The step of that block: its largest magnitude / level.
float block_step(const std::vector<float>& x, size_t i, int top) {
  return block_max(x, i) / static_cast<float>(top);
}
}  // namespace

TEST_CASE("int8 and int4 wires: a scale per block of 64, levels to nearest, sizes exact") {
  // A scale (one float) per block, then 4 (int8) or 8 (int4) levels in each float.
  CHECK(wire_floats(Wire::Int8, 5) == 1 + 2);
  CHECK(wire_floats(Wire::Int8, 64) == 1 + 16);
  CHECK(wire_floats(Wire::Int8, 65) == 2 + 17);
  CHECK(wire_floats(Wire::Int4, 5) == 1 + 1);
  CHECK(wire_floats(Wire::Int4, 64) == 1 + 8);
  CHECK(wire_floats(Wire::Int4, 130) == 3 + 17);
  CHECK(parse_wire("int8") == Wire::Int8);
  CHECK(parse_wire("int4") == Wire::Int4);
  CHECK_THROWS_AS(parse_wire("int2"), std::invalid_argument);

  // Multiples of the block's step come back exactly: int8's step is 127 / 127 = 1 here, and
  // 2.5 / 3.5 are ties, to even (2, 4).
  CHECK(round_trip(Wire::Int8, {127, -127, 2.5f, 3.5f, 0, -64}, nullptr) ==
        std::vector<float>{127, -127, 2, 4, 0, -64});
  // int4: levels -7..7 of 0.25 (1.75 / 7).
  CHECK(round_trip(Wire::Int4, {1.75f, -1.75f, 0.5f, 0, -0.25f}, nullptr) ==
        std::vector<float>{1.75f, -1.75f, 0.5f, 0, -0.25f});
  // An all-zero block, and the unused bytes of the last float zeroed (5 int8 levels in 2 floats).
  std::vector<float> room(3, -1.f);
  pack_quant(Wire::Int8, std::vector<float>(5, 0.f), {}, room.data());
  CHECK(room == std::vector<float>{0, 0, 0});
  CHECK_THROWS_AS(pack_quant(Wire::Bf16, room, {}, room.data()), std::invalid_argument);
}

TEST_CASE("stochastic rounding: within one step, unbiased, the same draws for the same key") {
  // 130 values (a partial last block); int4's coarse step shows the bias of rounding to nearest.
  std::vector<float> x(130);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.77f * static_cast<float>(i)) * 3;
  x[0] = 3.f;  // every block's largest magnitude: 3, so the steps are known
  x[64] = -3.f;
  x[128] = 3.f;
  for (Wire w : {Wire::Int8, Wire::Int4}) {
    const int top = w == Wire::Int8 ? 127 : 7;
    const float step = 3.f / static_cast<float>(top);
    std::vector<float> room(static_cast<size_t>(wire_floats(w, 130))), again = room;
    std::vector<double> sum(130, 0.0);
    const int draws = 4000;
    for (int k = 0; k < draws; ++k) {
      pack_quant(w, x, {}, room.data(), bucket_key(wire_key(7, 1, k), 0));
      std::vector<float> back(130);
      unpack_quant(w, room.data(), back);
      for (size_t i = 0; i < x.size(); ++i) {
        REQUIRE(std::fabs(back[i] - x[i]) < step * 1.0001f);
        sum[i] += back[i];
      }
    }
    // The mean of the draws is the value: within 4 standard errors (each draw is off by at most
    // a step, so its deviation is at most step / 2).
    const double bound = 4 * step / 2 / std::sqrt(static_cast<double>(draws));
    double worst_bias = 0;
    for (size_t i = 0; i < x.size(); ++i)
      worst_bias = std::max(worst_bias, std::fabs(sum[i] / draws - x[i]));
    CAPTURE(w == Wire::Int8, worst_bias, bound);
    CHECK(worst_bias < bound);
    // Rounding to nearest is off by a fixed amount where the value sits between levels.
    const std::vector<float> nearest = round_trip(w, x, nullptr);
    double nearest_bias = 0;
    for (size_t i = 0; i < x.size(); ++i)
      nearest_bias = std::max(nearest_bias, std::fabs(double(nearest[i]) - x[i]));
    CHECK(nearest_bias > 10 * bound);
    // The same key, the same bytes; another key, other bytes.
    pack_quant(w, x, {}, room.data(), 42);
    pack_quant(w, x, {}, again.data(), 42);
    CHECK(room == again);
    pack_quant(w, x, {}, again.data(), 43);
    CHECK(room != again);
  }
  CHECK(wire_key(1, 0, 5) != wire_key(1, 1, 5));
  CHECK(wire_key(1, 0, 5) != wire_key(2, 0, 5));
  // The weights' and the momentum's exchange of a step (gossipgrad) draw apart; the gradients'
  // key is stream 0's.
  CHECK(wire_key(1, 0, 5) == wire_key(1, 0, 5, 0));
  CHECK(wire_key(1, 0, 5, 1) != wire_key(1, 0, 5, 0));
  CHECK(wire_key(1, 0, 5, 1) != wire_key(1, 0, 5, 2));
  CHECK(bucket_key(9, 0) != bucket_key(9, 1));
  CHECK_THROWS_AS(WireCodec(Wire::Bf16, false, {{0, 4}}, true), std::invalid_argument);
}

// Tagged [isa]: tests/CMakeLists.txt runs it again with oneDNN capped to AVX2 and SSE4.1, whose
// builds of the draws (kernels/onednn/isa.hpp) must give these bits too.
TEST_CASE("stochastic rounding: each value's draw is splitmix64(key + its index), on every ISA",
          "[isa]") {
  std::vector<float> x(300);  // 4 full blocks and a partial one
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = std::sin(0.61f * static_cast<float>(i)) * (i < 128 ? 0.02f : 4.f);
  for (Wire w : {Wire::Int8, Wire::Int4}) {
    const float top = w == Wire::Int8 ? 127.f : 7.f;
    for (uint64_t key : {uint64_t{5}, bucket_key(wire_key(3, 2, 11), 4)}) {
      std::vector<float> room(static_cast<size_t>(wire_floats(w, 300))), back(300);
      pack_quant(w, x, {}, room.data(), key);
      unpack_quant(w, room.data(), back);
      int mismatches = 0;
      for (size_t i = 0; i < x.size(); ++i) {
        const float m = block_max(x, i);
        const float u = static_cast<float>(gg::shuffle::splitmix64(key + i) >> 40) * 0x1.0p-24f;
        const float level = std::clamp(std::floor(x[i] * (top / m) + u), -top, top);
        mismatches += back[i] != level * (m / top);
      }
      CAPTURE(w == Wire::Int8, key);
      CHECK(mismatches == 0);
    }
  }
}

TEST_CASE("int8 and int4 wires: every value within half its block's step, NaN kept") {
  // Blocks of very different magnitudes, a partial last block.
  std::vector<float> x(200);
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = std::sin(0.37f * static_cast<float>(i)) * (i < 64 ? 1e-3f : i < 128 ? 5.f : 0.2f);
  for (auto [w, top] : {std::pair{Wire::Int8, 127}, std::pair{Wire::Int4, 7}}) {
    CAPTURE(top);
    const std::vector<float> back = round_trip(w, x, nullptr);
    float worst = 0;  // in steps
    for (size_t i = 0; i < x.size(); ++i)
      worst = std::max(worst, std::fabs(back[i] - x[i]) / block_step(x, i, top));
    CHECK(worst <= 0.5f * (1 + 1e-5f));
    CHECK(worst > 0.3f);  // it does round
  }
  // A NaN or an infinity makes its block (only) NaN: the NaN guard sees it, as with fp32.
  x[70] = std::numeric_limits<float>::quiet_NaN();
  x[150] = std::numeric_limits<float>::infinity();
  const std::vector<float> back = round_trip(Wire::Int8, x, nullptr);
  for (size_t i = 0; i < x.size(); ++i) CHECK(std::isnan(back[i]) == (i >= 64 && i < 192));
}

TEST_CASE("int8 and int4 wires: error feedback sends the total, less the last residue") {
  // The same slowly changing values sent over many steps: with feedback the sum of what arrived
  // differs from the sum of what was meant by the last residue only (within half a step); without,
  // the rounding errors pile up step after step.
  for (Wire w : {Wire::Int8, Wire::Int4}) {
    const int top = w == Wire::Int8 ? 127 : 7;
    std::vector<float> residue(100, 0.f);
    std::vector<double> meant(100, 0), with(100, 0), without(100, 0);
    for (int t = 0; t < 50; ++t) {
      std::vector<float> x(100);
      for (size_t i = 0; i < x.size(); ++i)
        x[i] = 1.f + 0.01f * static_cast<float>(t) + 0.013f * static_cast<float>(i);
      const std::vector<float> fed = round_trip(w, x, &residue), plain = round_trip(w, x, nullptr);
      for (size_t i = 0; i < x.size(); ++i) {
        meant[i] += x[i];
        with[i] += fed[i];
        without[i] += plain[i];
      }
    }
    double lost_with = 0, lost_without = 0, left = 0;
    for (size_t i = 0; i < 100; ++i) {
      CHECK(std::fabs(with[i] + residue[i] - meant[i]) <= 1e-3 * meant[i] / 50);
      lost_with = std::max(lost_with, std::fabs(with[i] - meant[i]));
      lost_without = std::max(lost_without, std::fabs(without[i] - meant[i]));
      left = std::max(left, static_cast<double>(std::fabs(residue[i])));
    }
    // The largest block's step at the end: the values sent are x + residue, so their largest
    // magnitude m grows by at most half a step, m <= max|x| + m / (2 top).
    const double step = (1.5 + 0.013 * 99) / (top - 0.5);
    CHECK(left <= 0.5 * step * 1.0001);
    CHECK(lost_with <= 0.5 * step * 1.0001);
    CHECK(lost_without > 4 * lost_with);
  }
}
