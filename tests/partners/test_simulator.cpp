#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <set>
#include <vector>

#include "partners/schedule.hpp"
#include "partners/simulator.hpp"

using namespace gg::partners;

namespace {

// An independent diffusion count with std::set, for cross-checking the bitset code.
int diffusion_by_sets(const Schedule& s, int max_steps) {
  std::vector<std::set<int>> reach(s.p);
  for (int v = 0; v < s.p; ++v) reach[v] = {v};
  for (int t = 0;; ++t) {
    bool all = true;
    for (const auto& r : reach) all = all && static_cast<int>(r.size()) == s.p;
    if (all) return t;
    if (t == max_steps) return -1;
    auto next = reach;
    for (int v = 0; v < s.p; ++v) {
      const Partners q = partners(s, v, t);
      for (int i = 0; i < q.links(); ++i) {
        const auto& from = reach[q.link(i).recv_from];
        next[v].insert(from.begin(), from.end());
      }
    }
    reach = next;
  }
}

std::vector<double> start_values(int p, int salt) {
  std::vector<double> x(p);
  for (int v = 0; v < p; ++v) x[v] = std::sin(1.0 + v * 0.7 + salt * 1.3) * 100.0 + v;
  return x;
}

double mean_of(const std::vector<double>& x) {
  double m = 0.0;
  for (double v : x) m += v;
  return m / static_cast<double>(x.size());
}

}  // namespace

TEST_CASE("dissemination reaches every rank within ceil(log2 p) steps, with and without rotation",
          "[partners][simulator]") {
  for (int p = 2; p <= 64; ++p) {
    for (bool rotate : {false, true}) {
      INFO("p=" << p << " rotate=" << rotate);
      const int d = diffusion_steps({Kind::Dissemination, p, rotate, 3}, rounds_per_cycle(p));
      CHECK(d >= 1);
      CHECK(d <= rounds_per_cycle(p));
    }
  }
  CHECK(diffusion_steps({Kind::Dissemination, 1, false, 1}, 0) == 0);
}

TEST_CASE("two peers a step reach every rank no later than one", "[partners][simulator]") {
  for (int p = 3; p <= 130; ++p)
    for (bool rotate : {false, true}) {
      INFO("p=" << p << " rotate=" << rotate);
      const int one = diffusion_steps({Kind::Dissemination, p, rotate, 3}, 400);
      const int two = diffusion_steps({Kind::Exponential2, p, rotate, 3}, 400);
      CHECK(two >= 1);
      CHECK(two <= one);
    }
  // Two hops a step do not compose within the step (v hears v - 1 and v - 2, not v - 3), so
  // the reach is no faster. The averaging is, over the first steps at any p and throughout at
  // a p that is no power of two; at p = 128 one peer's round of 7 hops averages exactly, which
  // two peers a step do not (docs/gossip.md).
  const auto spread = [](const Schedule& s, int steps) {
    const std::vector<double> x = mix(s, start_values(s.p, 2), 0, steps);
    const double m = mean_of(x);
    double d = 0;
    for (double v : x) d += (v - m) * (v - m);
    return d;
  };
  for (int p : {96, 100, 127, 128}) {
    INFO("p=" << p);
    CHECK(spread({Kind::Exponential2, p, false, 3}, 4) <
          0.5 * spread({Kind::Dissemination, p, false, 3}, 4));
  }
  for (int p : {96, 100})
    CHECK(spread({Kind::Exponential2, p, false, 3}, 14) <
          0.5 * spread({Kind::Dissemination, p, false, 3}, 14));
  CHECK(spread({Kind::Dissemination, 128, false, 3}, 7) < 1e-20);
  CHECK(spread({Kind::Exponential2, 128, false, 3}, 7) > 1e-6);
}

TEST_CASE("the bitset diffusion count agrees with a plain set simulation",
          "[partners][simulator]") {
  for (int p : {2, 3, 5, 8, 13, 32, 63, 64, 65, 100, 130}) {
    for (Kind k : all_kinds()) {
      if (!serves({k, p, false, 1})) continue;
      for (bool rotate : {false, true}) {
        const Schedule s{k, p, rotate, 11};
        INFO(kind_name(k) << " p=" << p << " rotate=" << rotate);
        const int expected = diffusion_by_sets(s, 400);
        CHECK(diffusion_steps(s, 400) == expected);
        if (expected > 1) CHECK(diffusion_steps(s, expected - 1) == -1);
      }
    }
  }
  // A ring only moves information one hop per step.
  CHECK(diffusion_steps({Kind::Ring, 40, false, 1}, 1000) == 39);
}

TEST_CASE("hypercube pairwise averaging gives the exact average within any round",
          "[partners][simulator]") {
  for (int p = 2; p <= 1024; p *= 2) {
    const int R = rounds_per_cycle(p);
    for (bool rotate : {false, true}) {
      // Rotation only changes at round boundaries, so a round starting there is still a full
      // hypercube sweep (mid-round starts are not promised to average exactly when rotated).
      for (int64_t round = 0; round < 3; ++round) {
        INFO("p=" << p << " rotate=" << rotate << " round=" << round);
        const Schedule s{Kind::Hypercube, p, rotate, 5};
        const std::vector<double> x0 = start_values(p, static_cast<int>(round));
        const double mean = mean_of(x0);
        const std::vector<double> x = mix(s, x0, round * R, R);
        for (double v : x) CHECK(std::abs(v - mean) <= 1e-12 * (1.0 + std::abs(mean)));
        // Every rank added the same pairs in the same order: bit-identical results.
        CHECK(std::all_of(x.begin(), x.end(), [&](double v) { return v == x[0]; }));
      }
      CHECK(deviation_from_average({Kind::Hypercube, p, rotate, 5}, R) <= 1e-12);
      CHECK(deviation_from_average({Kind::Hypercube, p, rotate, 5}, R - 1) > 0.5 / p);
      CHECK(contraction_per_round({Kind::Hypercube, p, rotate, 5}, 3) <= 1e-12);
    }
  }
}

TEST_CASE("mix preserves the mean: every step is doubly stochastic", "[partners][simulator]") {
  for (int p : {1, 2, 3, 6, 16, 37, 64}) {
    for (Kind k : all_kinds()) {
      if (!serves({k, p, false, 1})) continue;
      for (bool rotate : {false, true}) {
        const Schedule s{k, p, rotate, 8};
        const std::vector<double> x0 = start_values(p, 1);
        const std::vector<double> x = mix(s, x0, 3, 25);
        INFO(kind_name(k) << " p=" << p << " rotate=" << rotate);
        CHECK(std::abs(mean_of(x) - mean_of(x0)) <= 1e-12 * (1.0 + std::abs(mean_of(x0))));
        // Averages never leave the range of the start values.
        CHECK(*std::max_element(x.begin(), x.end()) <= *std::max_element(x0.begin(), x0.end()));
        CHECK(*std::min_element(x.begin(), x.end()) >= *std::min_element(x0.begin(), x0.end()));
      }
    }
  }
}

TEST_CASE("mix is the exchange engine's update, step by step, in float", "[partners][simulator]") {
  const Schedule s{Kind::Random, 9, true, 21};
  std::vector<float> x(9);
  for (int v = 0; v < 9; ++v) x[v] = 0.1f * static_cast<float>(v * v) - 1.7f;
  std::vector<float> by_hand = x;
  for (int64_t t = 5; t < 12; ++t) {
    std::vector<float> next(9);
    for (int v = 0; v < 9; ++v)
      next[v] = 0.5f * (by_hand[v] + by_hand[partners(s, v, t).recv_from]);
    by_hand = next;
  }
  CHECK(mix(s, x, 5, 7) == by_hand);
  CHECK(mix(s, x, 5, 0) == x);
  // Two links a step: the engine adds the first partner, then divides the sum with the second.
  const Schedule e{Kind::Exponential2, 9, true, 21};
  by_hand = x;
  for (int64_t t = 5; t < 12; ++t) {
    std::vector<float> next(9);
    for (int v = 0; v < 9; ++v) {
      const Partners q = partners(e, v, t);
      next[v] = (by_hand[v] + by_hand[q.link(0).recv_from] + by_hand[q.link(1).recv_from]) / 3.f;
    }
    by_hand = next;
  }
  CHECK(mix(e, x, 5, 7) == by_hand);
  CHECK_THROWS_AS(mix(s, std::vector<float>(8), 0, 1), std::invalid_argument);
}

TEST_CASE("deviation from the average never grows, and a ring mixes slower than dissemination",
          "[partners][simulator]") {
  const Schedule ring{Kind::Ring, 16, false, 1};
  CHECK(deviation_from_average(ring, 0) == Approx(1.0));
  double last = 1.0;
  for (int t = 1; t <= 20; ++t) {
    const double d = deviation_from_average(ring, t);
    CHECK(d <= last + 1e-15);
    last = d;
  }
  CHECK(last < 0.9);
  for (int p : {24, 64, 100}) {
    INFO("p=" << p);
    const double ring_c = contraction_per_round({Kind::Ring, p, false, 1}, 4);
    const double dis_c = contraction_per_round({Kind::Dissemination, p, false, 1}, 4);
    CHECK(ring_c > 0.0);
    CHECK(ring_c < 1.0);
    CHECK(dis_c < ring_c);
    CHECK(deviation_from_average({Kind::Dissemination, p, false, 1}, rounds_per_cycle(p)) <
          deviation_from_average({Kind::Ring, p, false, 1}, rounds_per_cycle(p)));
  }
  CHECK(contraction_per_round({Kind::Ring, 1, false, 1}, 2) == 0.0);
  CHECK(deviation_from_average({Kind::Ring, 1, false, 1}, 2) == 0.0);
}

TEST_CASE("the simulator handles p = 4096", "[partners][simulator]") {
  const int p = 4096;
  CHECK(diffusion_steps({Kind::Dissemination, p, false, 1}, 100) == 12);
  CHECK(diffusion_steps({Kind::Hypercube, p, true, 1}, 100) == 12);
  const int random_d = diffusion_steps({Kind::Random, p, true, 1}, 200);
  CHECK(random_d >= 12);
  CHECK(random_d < 200);
  CHECK(diffusion_steps({Kind::Ring, p, false, 1}, 100) == -1);
  CHECK(deviation_from_average({Kind::Hypercube, p, false, 1}, 12) <= 1e-12);
  const double dev = deviation_from_average({Kind::Random, p, false, 1}, 12);
  CHECK(dev > 0.0);
  CHECK(dev < 1.0);
  const double c = contraction_per_round({Kind::Dissemination, p, true, 1}, 3);
  CHECK(c >= 0.0);
  CHECK(c < 0.1);
}
