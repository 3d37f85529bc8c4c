// The mixing rules (gossip/comm/rules.hpp) and the wire codec (WireCodec, wire.hpp) alone, as the
// exchange engine drives them: hand-computed values, no MPI, no threads.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "gossip/comm/exchange.hpp"
#include "gossip/comm/mixing.hpp"
#include "gossip/comm/push_sum.hpp"
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

TEST_CASE("with k links a step the average adds the partners in link order, the last divides") {
  std::vector<float> x = {1, 2, 3, 4, 5};
  PairAverage r(x.data(), kBuckets);
  gg::partners::Partners two{1, 2};
  two.add({3, 4});
  CHECK(two.links() == 2);
  CHECK(two.link(1) == gg::partners::Link{3, 4});
  r.begin_step(0, two);
  const std::vector<float> a0 = {3, 3, 3}, b0 = {5, -4, 1};
  r.received(0, 0, a0.data());
  CHECK(x == std::vector<float>{1, 2, 6, 7, 8});  // x + a, not yet divided
  r.received(0, 0, b0.data());
  CHECK(x == std::vector<float>{1, 2, (6.f + 5) / 3, (7.f - 4) / 3, (8.f + 1) / 3});
  const std::vector<float> a1 = {2, 2}, b1 = {0, 1};
  r.received(1, 0, a1.data());
  r.received(1, 0, b1.data());
  CHECK(x[0] == 1.f);
  CHECK(x[1] == 5.f / 3);
  // The next step with one link is the pair average again, bit for bit.
  r.begin_step(1, gg::partners::Partners{1, 1});
  const std::vector<float> c0 = {1, 1, 1};
  const std::vector<float> before(x.begin() + 2, x.end());
  r.received(0, 1, c0.data());
  for (int i = 0; i < 3; ++i) CHECK(x[2 + i] == 0.5f * (before[i] + 1.f));
  CHECK_THROWS_AS(mix_last(std::span<float>(x.data(), 2), std::span<const float>(x.data(), 2), 1),
                  std::invalid_argument);
}

TEST_CASE("a schedule's weights: the average mixes own x + w_i p_i in link order; others refuse") {
  gg::partners::Partners two{1, 2};
  two.add({3, 4});
  CHECK(!two.weighted);
  CHECK(two.own_weight() == 1.f / 3);
  CHECK(two.weight(1) == 1.f / 3);
  const std::vector<float> bad_sum = {0.5f, 0.25f}, negative = {1.25f, -0.5f}, one = {0.5f};
  CHECK_THROWS_AS(two.set_weights(0.5f, bad_sum), std::invalid_argument);  // 1.25 in all
  CHECK_THROWS_AS(two.set_weights(0.25f, negative), std::invalid_argument);
  CHECK_THROWS_AS(two.set_weights(0.5f, one), std::invalid_argument);  // one weight, two links
  CHECK(!two.weighted);
  const std::vector<float> w = {0.25f, 0.125f};
  two.set_weights(0.625f, w);
  CHECK(two.weighted);
  CHECK(two.own_weight() == 0.625f);
  CHECK(two.weight(0) == 0.25f);
  CHECK(two.weight(1) == 0.125f);

  std::vector<float> x = {1, 2, 3, 4, 5};
  PairAverage r(x.data(), kBuckets);
  CHECK(r.takes_weights());
  check_weights(r, two);  // the average takes them
  r.begin_step(0, two);
  const std::vector<float> a0 = {8, 8, 8}, b0 = {16, -16, 0};
  r.received(0, 0, a0.data());
  CHECK(x == std::vector<float>{1, 2, 0.625f * 3 + 2, 0.625f * 4 + 2, 0.625f * 5 + 2});
  r.received(0, 0, b0.data());
  CHECK(x == std::vector<float>{1, 2, 0.625f * 3 + 2 + 2, 0.625f * 4 + 2 - 2, 0.625f * 5 + 2});
  // A weighted pair is not averaged in place by a transport: the weights would be lost.
  gg::partners::Partners pair{1, 1};
  const std::vector<float> half = {0.25f};
  pair.set_weights(0.75f, half);
  r.begin_step(1, pair);
  const std::vector<float> c1 = {4, 8};
  r.received(1, 1, c1.data());
  CHECK(x[0] == 0.75f * 1 + 1);
  CHECK(x[1] == 0.75f * 2 + 2);

  // Rules that mix uniformly stop at a weighted step, with a line naming the rule to use.
  std::vector<float> y = {1, 2, 3, 4, 5};
  PushSum push(y.data(), kBuckets);
  CHECK(!push.takes_weights());
  CHECK_THROWS_WITH(check_weights(push, two), Catch::Contains("gossip.rule average"));
  StaleAverage stale(y.data(), kBuckets, false);
  CHECK_THROWS_AS(check_weights(stale, pair), std::logic_error);
  check_weights(stale, gg::partners::Partners{1, 1});  // uniform: fine
}

TEST_CASE("push-sum: a weight travels behind each bucket, the buffer holds values / weight") {
  // Messages: each bucket's values then its weight, in the buckets' order (bucket 0 last).
  const auto ends = [](const std::vector<Bucket>& v) {
    std::vector<int64_t> out;
    for (const Bucket& k : v) out.insert(out.end(), {k.begin, k.end});
    return out;
  };
  CHECK(ends(PushSum::messages(kBuckets)) == std::vector<int64_t>{3, 7, 0, 3});
  GossipOptions o;
  o.rule = RuleKind::PushSum;
  CHECK(ends(wire_buckets(o, kBuckets)) == ends(PushSum::messages(kBuckets)));
  // One link: the pair average, bit for bit (halving is exact).
  std::vector<float> x = {1, 2, 3, 4, 5}, y = {0.1f, -7, 3.3f, 1e-3f, 9};
  PushSum a(x.data(), kBuckets), b(y.data(), kBuckets);
  const std::vector<float> x0 = x, y0 = y;
  a.begin_step(0, {1, 1});
  b.begin_step(0, {0, 0});
  const float* ma = a.outgoing(0);
  CHECK(ma[3] == 0.5f);  // the weight's share
  CHECK(ma[0] == 1.5f);  // 3 * 1 * 0.5
  const std::vector<float> from_a(ma, ma + 4), from_b(b.outgoing(0), b.outgoing(0) + 4);
  a.received(0, 0, from_b.data());
  b.received(0, 0, from_a.data());
  for (int i = 2; i < 5; ++i) {
    CHECK(x[i] == 0.5f * (x0[i] + y0[i]));
    CHECK(y[i] == x[i]);
  }
  CHECK(a.weights()[0] == 1.f);
  // Uneven shares: a rank that pushes to two peers and hears from one keeps a third of its
  // weight and gains half of the other's: z = x / w stays the weighted mean of what it holds.
  std::vector<float> u = {0, 0, 6, 6, 6};
  PushSum r(u.data(), kBuckets);
  gg::partners::Partners two{1, 2};
  two.add({3, 4});
  r.begin_step(0, two);
  const float* mu = r.outgoing(0);
  CHECK(mu[0] == 6.f * (1.f / 3));
  const std::vector<float> half = {1.5f, 1.5f, 1.5f, 0.5f};  // a one-link peer's share of z = 3
  r.received(0, 0, half.data());
  const std::vector<float> none = {0, 0, 0, 0};
  r.received(0, 0, none.data());  // a second arrival that carries nothing
  const float w = 1.f / 3 + 0.5f;
  CHECK(r.weights()[0] == w);
  CHECK(u[2] == (6.f * (1.f / 3) + 1.5f) / w);
  // The weights are its state: saved, loaded, and refused when they do not fit.
  std::vector<StatePart> parts;
  r.save_state(parts, {});
  REQUIRE(parts.size() == 1);
  CHECK(parts[0].kind == "push-sum");
  std::vector<float> v = {0, 0, 0, 0, 0};
  PushSum back(v.data(), kBuckets);
  back.load_state(parts, {});
  CHECK(back.weights() == r.weights());
  back.load_state({}, {});
  CHECK(back.weights() == std::vector<float>{1.f, 1.f});
  PushSum other(v.data(), {{0, 5}});
  CHECK_THROWS_AS(other.load_state(parts, {}), std::invalid_argument);
  // It needs the fp32 wire.
  o.wire = Wire::Bf16;
  CHECK_THROWS_AS(make_rule(o, v.data(), kBuckets, 0), std::invalid_argument);
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

TEST_CASE("rules and codecs save their state as parts of their own kind, in the plain layout") {
  // A layout that is not the identity: the plain values are the buffer's reversed.
  const StateLayout layout = {
      [](const float* v, int64_t n) {
        return std::vector<float>(std::reverse_iterator(v + n), std::reverse_iterator(v));
      },
      [](const std::vector<float>& v) { return std::vector<float>(v.rbegin(), v.rend()); }};
  // The codec's residue: saved plain, loaded back into the buffer's layout, bit for bit.
  WireCodec codec(Wire::Int4, true, kBuckets);
  const std::vector<float> y = {0.3f, -1.f, 0.55f, 0.01f, 2.f};
  codec.encode(0, y.data());
  codec.encode(1, y.data() + 3);
  std::vector<StatePart> parts;
  codec.save_state(parts, layout);
  REQUIRE(parts.size() == 1);
  CHECK(parts[0].kind == kResidueKind);
  std::vector<float> r = codec.residue();
  CHECK(read_residue(parts[0]) == std::vector<float>(r.rbegin(), r.rend()));
  WireCodec back(Wire::Int4, true, kBuckets);
  back.load_state(parts, layout);
  CHECK(back.residue() == r);
  back.load_state({}, layout);  // none: zeroes
  CHECK(back.residue() == std::vector<float>(5, 0.f));
  WireCodec without(Wire::Int4, false, kBuckets);  // no error feedback: keeps nothing
  without.load_state(parts, layout);
  CHECK(without.residue().empty());
  std::vector<StatePart> none;
  without.save_state(none, layout);
  CHECK(none.empty());
  // A rule without a state saves nothing; CHOCO's copies go plain and come back.
  std::vector<float> x = {1, 2, 3, 4, 5};
  PairAverage plain_rule(x.data(), kBuckets);
  plain_rule.save_state(none, layout);
  CHECK(none.empty());
  ChocoAverage choco(x.data(), kBuckets);
  choco.begin_step(0, {1, 1});
  choco.sent(0, choco.outgoing(0));
  parts.clear();
  choco.save_state(parts, layout);
  REQUIRE(parts.size() == 1);
  CHECK(parts[0].kind == kPublicCopiesKind);
  const std::vector<PublicCopy> saved = read_copies(parts[0]);
  REQUIRE(saved.size() == 2);
  CHECK(saved[0].values == std::vector<float>{5, 4, 3, 0, 0});  // mine (0, 0, 3, 4, 5), reversed
  ChocoAverage again(x.data(), kBuckets);
  again.load_state(parts, layout);
  CHECK(again.public_copies()[0].values == std::vector<float>{0, 0, 3, 4, 5});
  // A part of a residue's kind is not a rule's: it starts from none.
  again.load_state(std::vector{residue_part({1, 2, 3, 4, 5})}, layout);
  CHECK(again.public_copies().empty());
  // Copies that do not fit the buffer: std::invalid_argument, the copies held kept.
  again.load_state(parts, layout);
  const StatePart short_copy = copies_part(std::string(kPublicCopiesKind), {{1, true, {1, 2}}});
  CHECK_THROWS_AS(again.load_state(std::vector{short_copy}, {}), std::invalid_argument);
  CHECK(again.public_copies().size() == 2);
  again.forget_peers({1});
  CHECK(again.public_copies().empty());
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

TEST_CASE("public copies: the first step of an exact wire is the pair average, then differences") {
  std::vector<float> x = {1, 2, 3, 4, 5};
  ChocoAverage r(x.data(), kBuckets);
  CHECK(r.waits());
  CHECK(r.echoes());
  CHECK_FALSE(r.pair_average_in_place());
  r.begin_step(0, {1, 1});
  // No copy yet (zero): the difference is the values themselves.
  CHECK(std::vector<float>(r.outgoing(0), r.outgoing(0) + 3) == std::vector<float>{3, 4, 5});
  r.sent(0, r.outgoing(0));
  const std::vector<float> p0 = {7, -4, 1};
  r.received(0, 0, p0.data());
  CHECK(x == std::vector<float>{1, 2, 5, 0, 3});  // x += (theirs - mine) / 2
  // Step 1, after an update: the difference to mine (3, 4, 5) goes out; theirs adds the partner's.
  x = {1, 2, 6, 0, 3};
  r.begin_step(1, {1, 1});
  CHECK(std::vector<float>(r.outgoing(0), r.outgoing(0) + 3) == std::vector<float>{3, -4, -2});
  r.sent(0, r.outgoing(0));  // mine = (6, 0, 3)
  const std::vector<float> q0 = {1, 4, 1};
  r.received(0, 1, q0.data());  // theirs = (8, 0, 2)
  CHECK(x == std::vector<float>{1, 2, 7, 0, 2.5f});
  // The copies, as a rank's state: this rank's as peer 1 knows it, and peer 1's.
  const std::vector<PublicCopy> saved = r.public_copies();
  REQUIRE(saved.size() == 2);
  CHECK((saved[0].peer == 1 && saved[0].mine));
  CHECK(saved[0].values == std::vector<float>{0, 0, 6, 0, 3});
  CHECK((saved[1].peer == 1 && !saved[1].mine));
  CHECK(saved[1].values == std::vector<float>{0, 0, 8, 0, 2});
  std::vector<float> y = x;
  ChocoAverage back(y.data(), kBuckets);
  back.set_public_copies(saved);
  back.begin_step(2, {1, 1});
  r.begin_step(2, {1, 1});
  CHECK(std::vector<float>(back.outgoing(0), back.outgoing(0) + 3) ==
        std::vector<float>(r.outgoing(0), r.outgoing(0) + 3));
  CHECK_THROWS_AS(back.set_public_copies({{1, true, {1, 2}}}), std::invalid_argument);
}

TEST_CASE("public copies, overlapped: the correction (theirs - mine) / 2 is applied later") {
  std::vector<float> x = {1, 2, 3, 4, 5};
  ChocoDelayed r(x.data(), kBuckets);
  r.begin_step(0, {2, 1});
  r.snapshot();
  x = {2, 2, 2, 2, 2};  // an update meanwhile: the snapshot's difference goes out
  for (int b : {0, 1}) r.sent(b, r.outgoing(b));
  const std::vector<float> p0 = {5, 0, 5}, p1 = {3, 4};
  r.received(0, 0, p0.data());
  r.received(1, 0, p1.data());
  CHECK(r.delta() == std::vector<float>{1, 1, 1, -2, 0});
  r.apply();
  CHECK(x == std::vector<float>{3, 3, 3, 0, 2});
  // Two partners: mine is the copy peer 2 holds, theirs peer 1's.
  const std::vector<PublicCopy> saved = r.public_copies();
  REQUIRE(saved.size() == 2);
  CHECK((saved[0].peer == 2 && saved[0].mine && saved[1].peer == 1 && !saved[1].mine));
}

namespace {
// p ranks on the dissemination schedule (k = t mod 2 at p = 3: send to v + 2^k), each with its
// rule and codec, driven as the engine drives them. Returns the ranks' largest distance to the
// mean after `steps` exchanges, checking at each that every pair's two copies are equal bit for
// bit and that the mix keeps the ranks' sum.
float run_ranks(Wire wire, bool choco, int steps) {
  constexpr int p = 3;
  const std::vector<Bucket> buckets = {{64, 160}, {0, 64}};  // blocks of 64 and a partial one
  std::vector<std::vector<float>> x(p, std::vector<float>(160));
  for (int v = 0; v < p; ++v)
    for (size_t i = 0; i < 160; ++i) x[v][i] = std::sin(0.37f * i + v) * (1 + 0.1f * v);
  GossipOptions o;
  o.wire = wire;
  o.public_copies = choco;
  std::vector<std::unique_ptr<MixingRule>> rules;
  std::vector<std::unique_ptr<WireCodec>> codecs;
  for (int v = 0; v < p; ++v) {
    rules.push_back(make_rule(o, x[v].data(), buckets, v));
    codecs.push_back(std::make_unique<WireCodec>(wire, false, buckets));
  }
  for (int t = 0; t < steps; ++t) {
    const int hop = 1 << (t % 2);
    double before = 0, after = 0;
    for (const auto& v : x)
      for (float f : v) before += f;
    std::vector<std::vector<float>> out(p);  // what each rank sent, as decoded
    for (int v = 0; v < p; ++v) {
      rules[v]->begin_step(t, {(v + hop) % p, (v - hop + p) % p});
      for (int b = 0; b < 2; ++b) {
        const float* image = encode_outgoing(*rules[v], *codecs[v], b);
        const float* d = codecs[v]->decode(b, image);
        out[v].insert(out[v].end(), d, d + buckets[b].size());
      }
    }
    for (int v = 0; v < p; ++v) {
      const std::vector<float>& in = out[(v - hop + p) % p];
      rules[v]->received(0, t, in.data());
      rules[v]->received(1, t, in.data() + 96);
    }
    for (int v = 0; v < p; ++v)
      for (const PublicCopy& c : saved_copies(*rules[v], kPublicCopiesKind)) {
        if (!c.mine) continue;  // the peer's copy of it must be the same, bit for bit
        for (const PublicCopy& d : saved_copies(*rules[c.peer], kPublicCopiesKind))
          if (!d.mine && d.peer == v) CHECK(d.values == c.values);
      }
    for (const auto& v : x)
      for (float f : v) after += f;
    if (choco) CHECK(after == Approx(before).margin(1e-4));
  }
  float worst = 0;
  for (size_t i = 0; i < 160; ++i) {
    const float mean = (x[0][i] + x[1][i] + x[2][i]) / 3;
    for (int v = 0; v < p; ++v) worst = std::max(worst, std::abs(x[v][i] - mean));
  }
  return worst;
}
}  // namespace

TEST_CASE("public copies over int4: copies agree bit for bit, the sum is kept, no rounding floor") {
  // The values' own rounding (int4: a fifteenth of each block's largest magnitude) leaves the
  // ranks that far apart for good; the difference to the copies shrinks as they agree, and so
  // does its rounding.
  const float plain = run_ranks(Wire::Int4, false, 60);
  const float choco = run_ranks(Wire::Int4, true, 60);
  const float exact = run_ranks(Wire::Fp32, false, 60);
  CHECK(plain > 1e-2f);
  CHECK(choco < 1e-4f);
  CHECK(exact < 1e-5f);
  CHECK(run_ranks(Wire::Int8, true, 60) < 1e-5f);
  GossipOptions stale;
  stale.public_copies = true;
  stale.staleness = 1;
  std::vector<float> x(5);
  CHECK_THROWS_AS(make_rule(stale, x.data(), kBuckets, 0), std::invalid_argument);
}
