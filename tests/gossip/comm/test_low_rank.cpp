// Low-rank gossip (PowerGossip, gossip/comm/low_rank.hpp) as the exchange engine drives it: ranks
// in one process, their rules from make_rule, their messages through a wire codec, the hypercube's
// pairs. Hand-sized matrices: a rank-r difference is gone after two meetings, not after one.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "gossip/comm/exchange.hpp"
#include "gossip/comm/low_rank.hpp"
#include "gossip/comm/wire.hpp"
#include "kernels/models.hpp"
#include "kernels/param_layout.hpp"

using namespace gg::gossip;
using gg::kernels::Bucket;

namespace {

// p ranks over one buffer layout, meeting as the unrotated hypercube pairs them.
struct Ranks {
  Ranks(std::vector<std::vector<float>> values, std::vector<MatrixView> views,
        std::vector<Bucket> buckets, int rank, Wire wire = Wire::Fp32, bool delayed = false)
      : x(std::move(values)), buckets(std::move(buckets)) {
    o.schedule = {gg::partners::Kind::Hypercube, static_cast<int>(x.size())};
    o.low_rank = rank;
    o.matrices = std::move(views);
    o.wire = wire;
    o.delayed = delayed;
    for (size_t v = 0; v < x.size(); ++v) {
      rules.push_back(make_rule(o, x[v].data(), this->buckets, static_cast<int>(v)));
      codecs.push_back(std::make_unique<WireCodec>(wire, false, wire_buckets(o, this->buckets)));
    }
  }
  // One exchange: every rank's messages go out before any rank mixes (as over a network).
  void meet(int64_t t) {
    const size_t p = x.size();
    const auto& layout = codecs[0]->layout();
    std::vector<std::vector<float>> out(p, std::vector<float>(codecs[0]->floats()));
    for (size_t v = 0; v < p; ++v) {
      if (o.delayed) dynamic_cast<DelayedAverage&>(*rules[v]).snapshot();
      rules[v]->begin_step(t, gg::partners::partners(o.schedule, static_cast<int>(v), t));
      for (size_t b = 0; b < buckets.size(); ++b) {
        const float* image = encode_outgoing(*rules[v], *codecs[v], static_cast<int>(b));
        std::copy(image, image + layout[b].size(), out[v].begin() + layout[b].begin);
      }
    }
    for (size_t v = 0; v < p; ++v) {
      const int from = gg::partners::partners(o.schedule, static_cast<int>(v), t).recv_from;
      for (size_t b = 0; b < buckets.size(); ++b)
        rules[v]->received(
            static_cast<int>(b), t,
            codecs[v]->decode(static_cast<int>(b), out[from].data() + layout[b].begin));
      rules[v]->finish(t);
    }
  }
  void apply() {
    for (auto& r : rules) dynamic_cast<DelayedAverage&>(*r).apply();
  }
  // Every pair's two factors are the same, bit for bit.
  bool factors_agree() const {
    for (size_t v = 0; v < x.size(); ++v)
      for (const PublicCopy& f : saved_copies(*rules[v], kLowRankKind)) {
        bool found = false;
        for (const PublicCopy& g : saved_copies(*rules[static_cast<size_t>(f.peer)], kLowRankKind))
          if (g.peer == static_cast<int>(v)) found = g.values == f.values;
        if (!found) return false;
      }
    return true;
  }
  double sum() const {
    double s = 0;
    for (const auto& v : x)
      for (float f : v) s += f;
    return s;
  }
  // The largest distance of any value from the ranks' mean.
  float spread() const {
    float worst = 0;
    for (size_t i = 0; i < x[0].size(); ++i) {
      double mean = 0;
      for (const auto& v : x) mean += v[i];
      mean /= static_cast<double>(x.size());
      for (const auto& v : x) worst = std::max(worst, static_cast<float>(std::abs(v[i] - mean)));
    }
    return worst;
  }

  std::vector<std::vector<float>> x;
  std::vector<Bucket> buckets;
  GossipOptions o;
  std::vector<std::unique_ptr<MixingRule>> rules;
  std::vector<std::unique_ptr<WireCodec>> codecs;
};

// Values of rank v with no low-rank structure between ranks: a hash in [-1, 1).
float wave(size_t i, int v) {
  uint64_t h =
      (i + 1) * 0x9E3779B97F4A7C15ull ^ (static_cast<uint64_t>(v) + 7) * 0xBF58476D1CE4E5B9ull;
  h ^= h >> 31;
  h *= 0x94D049BB133111EBull;
  h ^= h >> 29;
  return static_cast<float>(static_cast<double>(h >> 11) * 0x1.0p-52 - 1.0);
}

// A 6 x 5 matrix on two ranks: rank 1's is rank 0's plus a rank-`diff` difference.
Ranks pair_with_difference(int diff, int rank) {
  std::vector<float> a(30), b(30);
  for (size_t i = 0; i < 30; ++i) a[i] = b[i] = wave(i, 0);
  for (int k = 0; k < diff; ++k)
    for (int r = 0; r < 6; ++r)
      for (int c = 0; c < 5; ++c) b[r * 5 + c] += std::cos(1.1f * r + k) * std::sin(0.7f * c - k);
  return Ranks({a, b}, {{0, 30, 6, 5}}, {{0, 30}}, rank);
}

}  // namespace

TEST_CASE("low rank: a rank-r difference is gone after two meetings, not after one") {
  for (int r : {1, 2}) {
    Ranks k = pair_with_difference(r, r);
    const double sum = k.sum();
    k.meet(0);  // X Q with a fresh factor: the difference within Q's span is averaged
    CHECK(k.spread() > 1e-2f);
    k.meet(1);  // X^T P with P = the difference's column space: the rest of it
    CHECK(k.spread() < 1e-5f);
    CHECK(k.sum() == Approx(sum).margin(1e-4));
    CHECK(k.factors_agree());
  }
  Ranks k = pair_with_difference(2, 1);  // rank 1 cannot remove a rank-2 difference in two
  k.meet(0);
  k.meet(1);
  CHECK(k.spread() > 1e-3f);
}

TEST_CASE("low rank: oneDNN's blocked storage holds the same matrix (factors independent of it)") {
  // An 8 x 8 x 3 x 3 convolution weight, plain and in 8 x 8 blocks ([O/8][I/8][kh kw][8 i][8 o]).
  const int64_t O = 8, I = 8, K = 9, n = O * I * K;
  std::vector<std::vector<float>> plain(2, std::vector<float>(n)), blocked = plain;
  for (int v = 0; v < 2; ++v)
    for (int64_t o = 0; o < O; ++o)
      for (int64_t i = 0; i < I; ++i)
        for (int64_t t = 0; t < K; ++t) {
          const float val = wave(static_cast<size_t>((o * I + i) * K + t), v);
          plain[v][(o * I + i) * K + t] = val;
          blocked[v][(t * 8 + i) * 8 + o] = val;
        }
  Ranks a(plain, {{0, n, O, I * K, K, 0}}, {{0, n}}, 2);
  Ranks b(blocked, {{0, n, O, I * K, K, 8}}, {{0, n}}, 2);
  for (int t = 0; t < 3; ++t) {
    a.meet(t);
    b.meet(t);
  }
  float worst = 0;
  for (int v = 0; v < 2; ++v)
    for (int64_t o = 0; o < O; ++o)
      for (int64_t i = 0; i < I; ++i)
        for (int64_t t = 0; t < K; ++t)
          worst =
              std::max(worst, std::abs(a.x[v][(o * I + i) * K + t] - b.x[v][(t * 8 + i) * 8 + o]));
  CHECK(worst < 1e-5f);
  CHECK(a.spread() > 1e-2f);  // not averaged whole: the comparison above means something
}

TEST_CASE("low rank: messages are r x the larger side per matrix, vectors whole, bucket 0 last") {
  GossipOptions o;
  o.low_rank = 2;
  // A 6 x 5 matrix, a vector of 4, and 6 values sent whole (a matrix too small to gain).
  o.matrices = {{0, 30, 6, 5}, {30, 4}, {34, 6}};
  const std::vector<Bucket> buckets = {{30, 40}, {0, 30}};
  const std::vector<Bucket> m = wire_buckets(o, buckets);
  REQUIRE(m.size() == 2);
  CHECK(m[1].begin == 0);
  CHECK(m[1].end == 12);
  CHECK(m[0].begin == 12);
  CHECK(m[0].end == 22);
  o.low_rank = 0;
  CHECK(wire_buckets(o, buckets)[0].end == 40);
  // matrix_views: a network's convolutions and inner products are matrices where r gains.
  const gg::kernels::Graph g = gg::kernels::build_model(
      {.name = "resnet8", .input = {3, 16, 16}, .classes = 10, .width = 16});
  int matrices = 0;
  int64_t covered = 0;
  for (const MatrixView& v : matrix_views(g, {}, 1)) {
    covered += v.size;
    if (v.rows > 0) {
      ++matrices;
      CHECK(v.rows * v.cols == v.size);
      CHECK(v.rows + v.cols < v.size);
    }
  }
  CHECK(covered == g.param_count());
  CHECK(matrices >= 8);
}

TEST_CASE("low rank: four ranks over bf16 reach consensus, pairs' factors agree, the sum is kept") {
  // Bucket 0: a vector of 4 and an 8 x 72 matrix; bucket 1: a 6 x 5 matrix.
  const std::vector<MatrixView> views = {{0, 30, 6, 5}, {30, 4}, {34, 576, 8, 72}};
  const std::vector<Bucket> buckets = {{30, 610}, {0, 30}};
  std::vector<std::vector<float>> x(4, std::vector<float>(610));
  for (int v = 0; v < 4; ++v)
    for (size_t i = 0; i < 610; ++i) x[v][i] = wave(i, v);
  for (Wire w : {Wire::Fp32, Wire::Bf16}) {
    Ranks k(x, views, buckets, 1, w);
    const double sum = k.sum();
    const float start = k.spread();
    k.meet(0);
    if (w == Wire::Fp32)  // the vector is averaged whole with the step's partner
      CHECK(k.x[0][31] == Approx((x[0][31] + x[1][31]) / 2).margin(1e-7));
    for (int t = 1; t < 400; ++t) {
      k.meet(t);
      if (t % 50 == 0) {
        CHECK(k.factors_agree());
        CHECK(k.sum() == Approx(sum).margin(1e-3));
      }
    }
    // bf16 rounds X Q, not the difference: the ranks stay about its rounding apart.
    CAPTURE(k.spread() / start);
    CHECK(k.spread() < (w == Wire::Fp32 ? 1e-4f : 1e-2f) * start);
  }
}

TEST_CASE("low rank, overlapped: the correction equals the direct mix, applied to a moved buffer") {
  const std::vector<MatrixView> views = {{0, 30, 6, 5}, {30, 4}};
  const std::vector<Bucket> buckets = {{30, 34}, {0, 30}};
  std::vector<std::vector<float>> x(2, std::vector<float>(34));
  for (int v = 0; v < 2; ++v)
    for (size_t i = 0; i < 34; ++i) x[v][i] = wave(i, v);
  Ranks direct(x, views, buckets, 1);
  Ranks later(x, views, buckets, 1, Wire::Fp32, true);
  direct.meet(0);
  later.meet(0);
  CHECK(later.x == x);  // nothing applied yet
  for (auto& v : later.x)
    for (float& f : v) f += 1;  // the next step moved the buffers
  later.apply();
  for (int v = 0; v < 2; ++v)
    for (size_t i = 0; i < 34; ++i) CHECK(later.x[v][i] == Approx(direct.x[v][i] + 1).margin(1e-6));
  CHECK(later.factors_agree());
  // The factors are a rank's state: saved and loaded they give the same next meeting; a saved
  // entry of another size (another r) is dropped, as are a forgotten peer's.
  MixingRule& rule = *direct.rules[0];
  std::vector<StatePart> parts;
  rule.save_state(parts, {});
  REQUIRE(parts.size() == 1);
  CHECK(parts[0].kind == kLowRankKind);
  const std::vector<PublicCopy> saved = read_copies(parts[0]);
  REQUIRE(saved.size() == 1);
  CHECK(saved[0].peer == 1);
  rule.load_state(
      std::vector{copies_part(std::string(kLowRankKind), {{1, true, std::vector<float>(3)}})}, {});
  CHECK(saved_copies(rule, kLowRankKind).empty());
  rule.load_state(parts, {});
  CHECK(saved_copies(rule, kLowRankKind)[0].values == saved[0].values);
  rule.forget_peers({0});
  CHECK(saved_copies(rule, kLowRankKind).size() == 1);
  rule.forget_peers({1});
  CHECK(saved_copies(rule, kLowRankKind).empty());
  // A part of a newer format is refused in one line naming it; a truncated one likewise.
  parts[0].version = 2;
  CHECK_THROWS_WITH(rule.load_state(parts, {}),
                    Catch::Contains("low-rank-factors") && Catch::Contains("newer than"));
  parts[0].version = 1;
  parts[0].bytes.pop_back();
  CHECK_THROWS_WITH(rule.load_state(parts, {}), Catch::Contains("truncated or corrupt"));
}

TEST_CASE("low rank: refused with staleness 1, public copies or a distance measure") {
  std::vector<float> x(30);
  for (int what = 0; what < 3; ++what) {
    GossipOptions o;
    o.low_rank = 1;
    o.matrices = {{0, 30, 6, 5}};
    o.staleness = what == 0 ? 1 : 0;
    o.public_copies = what == 1;
    o.measure_distance = what == 2;
    CHECK_THROWS_AS(make_rule(o, x.data(), {{0, 30}}, 0), std::invalid_argument);
  }
}
