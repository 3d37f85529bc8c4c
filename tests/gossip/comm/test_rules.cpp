// The mixing rules (gossip/comm/rules.hpp) and the wire codec (WireCodec, wire.hpp) alone, as the
// exchange engine drives them: hand-computed values, no MPI, no threads.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "gossip/comm/rules.hpp"
#include "gossip/comm/wire.hpp"

using namespace gg::gossip;
using gg::kernels::Bucket;

namespace {
// A buffer of 5 values in two buckets, bucket 0 last (as make_buckets lays them out).
const std::vector<Bucket> kBuckets = {{2, 5}, {0, 2}};
}  // namespace

TEST_CASE("the pair average mixes each bucket as it arrives and sends the buffer itself") {
  std::vector<float> x = {1, 2, 3, 4, 5};
  PairAverage r(x.data(), kBuckets);
  CHECK(r.waits());
  CHECK(r.pair_average_in_place());
  CHECK(r.outgoing(0) == x.data() + 2);
  const std::vector<float> p0 = {7, -4, 1};
  r.received(0, 0, p0.data());
  CHECK(x == std::vector<float>{1, 2, 5, 0, 3});
  const std::vector<float> p1 = {-1, 2};
  r.received(1, 0, p1.data());
  r.finish(0);
  CHECK(x == std::vector<float>{0, 2, 5, 0, 3});
}

TEST_CASE("staleness 1 sends the bucket as it was when ready and mixes the latest at the end") {
  std::vector<float> x = {1, 2, 3, 4, 5};
  StaleAverage r(x.data(), kBuckets, false);
  CHECK_FALSE(r.waits());
  CHECK_FALSE(r.pair_average_in_place());
  r.capture(0);
  r.capture(1);
  x[2] = 100;  // the buffer moves on after the capture: what is sent does not
  CHECK(std::vector<float>(r.outgoing(1), r.outgoing(1) + 2) == std::vector<float>{1, 2});
  CHECK(std::vector<float>(r.outgoing(0), r.outgoing(0) + 3) == std::vector<float>{3, 4, 5});
  // Step 0: only bucket 0 arrived; bucket 1 has nothing yet and stays unmixed.
  const std::vector<float> p0 = {0, 2, 9};
  r.received(0, 0, p0.data());
  r.finish(0);
  CHECK(x == std::vector<float>{1, 2, 50, 3, 7});
  CHECK(r.lateness().late == 0);
  CHECK(r.lateness().unmixed == 1);
  // Step 1: nothing new arrived: bucket 0 is mixed with step 0's (late), bucket 1 still unmixed.
  r.finish(1);
  CHECK(x == std::vector<float>{1, 2, 25, 2.5f, 8});
  CHECK(r.lateness().late == 1);
  CHECK(r.lateness().unmixed == 2);
  // Step 2: step 0's bucket is two steps old: unmixed; bucket 1 arrives fresh.
  const std::vector<float> p1 = {3, 4};
  r.received(1, 2, p1.data());
  r.finish(2);
  CHECK(x == std::vector<float>{2, 3, 25, 2.5f, 8});
  CHECK(r.lateness().late == 1);
  CHECK(r.lateness().unmixed == 3);
}

TEST_CASE("staleness 1 with late = skip leaves the previous step's bucket unmixed") {
  std::vector<float> x = {1, 2, 3, 4, 5};
  StaleAverage r(x.data(), kBuckets, true);
  const std::vector<float> p0 = {5, 6, 7};
  r.received(0, 0, p0.data());
  r.finish(1);  // step 0's bucket in step 1: late, skipped
  CHECK(x == std::vector<float>{1, 2, 3, 4, 5});
  CHECK(r.lateness().late == 0);
  CHECK(r.lateness().unmixed == 2);
  r.finish(0);
  CHECK(x == std::vector<float>{1, 2, 4, 5, 6});
}

TEST_CASE("the delayed average corrects the moved buffer by half the partner's difference") {
  std::vector<float> x = {1, 2, 3, 4, 5};
  DelayedAverage r(x.data(), kBuckets);
  r.snapshot();
  CHECK(std::vector<float>(r.outgoing(0), r.outgoing(0) + 3) == std::vector<float>{3, 4, 5});
  x = {2, 2, 2, 2, 2};  // an update meanwhile
  const std::vector<float> p0 = {5, 0, 5}, p1 = {3, 4};
  r.received(0, 0, p0.data());
  r.received(1, 0, p1.data());
  CHECK(r.delta() == std::vector<float>{1, 1, 1, -2, 0});
  r.apply();
  CHECK(x == std::vector<float>{3, 3, 3, 0, 2});
}

TEST_CASE("the fp32 wire passes values through, the bf16 wire halves them and carries residue") {
  const std::vector<float> x = {1, 2, 3, 4, 5};
  WireCodec fp32(Wire::Fp32, false, kBuckets);
  CHECK(fp32.floats() == 5);
  CHECK(fp32.encode(0, x.data() + 2) == x.data() + 2);
  CHECK(fp32.decode(1, x.data()) == x.data());
  CHECK_THROWS_AS(WireCodec(Wire::Fp32, true, kBuckets), std::invalid_argument);

  WireCodec bf16(Wire::Bf16, true, kBuckets);
  // Bucket 0 (3 values) takes 2 floats' room, bucket 1 (2 values) 1, bucket 0 last.
  CHECK(bf16.floats() == 3);
  CHECK(bf16.layout()[1].begin == 0);
  CHECK(bf16.layout()[0].begin == 1);
  const float v = 1 + 1.f / 256;  // halfway between bf16's 1 and 1 + 1/128: rounds to even, 1
  const std::vector<float> y = {v, v, v};
  const float* packed = bf16.encode(0, y.data());
  const float* back = bf16.decode(0, packed);
  CHECK(std::vector<float>(back, back + 3) == std::vector<float>{1, 1, 1});
  // The residue (1/256 each) is added next time: 1 + 2/256 is exact in bf16.
  back = bf16.decode(0, bf16.encode(0, y.data()));
  CHECK(std::vector<float>(back, back + 3) ==
        std::vector<float>{v + 1.f / 256, v + 1.f / 256, v + 1.f / 256});
}

TEST_CASE("the int8 and int4 wires: their layout, values within a step, the residue as state") {
  for (auto [w, top] : {std::pair{Wire::Int8, 127}, std::pair{Wire::Int4, 7}}) {
    CAPTURE(top);
    WireCodec codec(w, true, kBuckets);
    // Each bucket (3 and 2 values) takes a scale and one float of levels, bucket 0 last.
    CHECK(codec.floats() == 4);
    CHECK(codec.layout()[1].begin == 0);
    CHECK(codec.layout()[0].begin == 2);
    const std::vector<float> y = {0.3f, -1.f, 0.55f};
    const float* back = codec.decode(0, codec.encode(0, y.data()));
    const float step = 1.f / static_cast<float>(top);
    for (int i = 0; i < 3; ++i) CHECK(std::fabs(back[i] - y[i]) <= 0.5f * step * 1.0001f);
    // The residue is what rounding took: a rank's state, saved and given back whole.
    const std::vector<float> residue = codec.residue();
    REQUIRE(residue.size() == 5);
    for (int i = 0; i < 3; ++i) CHECK(residue[2 + i] == y[i] - back[i]);
    WireCodec restored(w, true, kBuckets);
    restored.set_residue(residue);
    CHECK(restored.residue() == residue);
    const float* a = codec.encode(0, y.data());
    const float* b = restored.encode(0, y.data());
    CHECK(std::vector<float>(a, a + 2) == std::vector<float>(b, b + 2));
    CHECK_THROWS_AS(restored.set_residue(std::vector<float>(4)), std::invalid_argument);
    restored.set_residue({});
    CHECK(restored.residue() == std::vector<float>(5, 0.f));
  }
  CHECK(WireCodec(Wire::Int8, false, kBuckets).residue().empty());
}

TEST_CASE("consensus control: each rule adds up ||x - partner||^2 of what it mixes, when asked") {
  const std::vector<float> p0 = {7, -4, 1}, p1 = {-1, 2};
  // Bucket 0: x = {3, 4, 5} against {7, -4, 1}: 16 + 64 + 16; bucket 1: {1, 2} against {-1, 2}: 4.
  const double want = 16 + 64 + 16 + 4;
  SECTION("the pair average, before mixing") {
    std::vector<float> x = {1, 2, 3, 4, 5};
    PairAverage r(x.data(), kBuckets);
    r.received(0, 0, p0.data());
    CHECK(r.take_distance() == 0);  // not asked: nothing measured
    r.measure_distance(true);
    x = {1, 2, 3, 4, 5};
    r.received(0, 0, p0.data());
    r.received(1, 0, p1.data());
    CHECK(r.take_distance() == want);
    CHECK(r.take_distance() == 0);  // taken: a new sum starts
  }
  SECTION("staleness 1, at the step's end") {
    std::vector<float> x = {1, 2, 3, 4, 5};
    StaleAverage r(x.data(), kBuckets, false);
    r.measure_distance(true);
    r.received(0, 0, p0.data());
    r.received(1, 0, p1.data());
    CHECK(r.take_distance() == 0);
    r.finish(0);
    CHECK(r.take_distance() == want);
  }
  SECTION("the delayed average, from the correction; a state reads and restores the sum") {
    std::vector<float> x = {1, 2, 3, 4, 5};
    DelayedAverage r(x.data(), kBuckets);
    r.measure_distance(true);
    r.snapshot();
    x = {2, 2, 2, 2, 2};  // an update meanwhile does not change what was measured
    r.received(0, 0, p0.data());
    r.received(1, 0, p1.data());
    CHECK(r.distance() == want);  // read, not taken
    CHECK(r.reset_distance(7) == want);
    CHECK(r.take_distance() == 7);
    CHECK(r.take_distance() == 0);
  }
}
