// The mixing rules and the bf16 codec alone (gossip/comm/mixing.hpp, wire.hpp): hand-computed
// values, no MPI, no threads.
#include <catch2/catch.hpp>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "gossip/comm/mixing.hpp"
#include "gossip/comm/wire.hpp"

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
