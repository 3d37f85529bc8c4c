#include <algorithm>
#include <catch2/catch.hpp>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "partners/schedule.hpp"

using namespace gg::partners;

namespace {

bool power_of_two(int p) { return (p & (p - 1)) == 0; }

// Every schedule the property tests sweep: p = 1..64, each kind of the table that can serve p (a
// new schedule is swept without a line here), rotation on and off, two seeds.
std::vector<Schedule> all_schedules(int max_p) {
  std::vector<Schedule> out;
  for (int p = 1; p <= max_p; ++p)
    for (Kind k : all_kinds())
      for (bool rotate : {false, true})
        for (uint64_t seed : {uint64_t{1}, uint64_t{0x9e3779b97f4a7c15}})
          if (serves({k, p, rotate, seed})) out.push_back({k, p, rotate, seed});
  return out;
}

std::string describe(const Schedule& s) {
  return std::string(kind_name(s.kind)) + " p=" + std::to_string(s.p) +
         (s.rotate ? " rotated" : "") + " seed=" + std::to_string(s.seed);
}

}  // namespace

TEST_CASE("dissemination: send and receive partners are inverse permutations", "[partners]") {
  for (int p : {1, 2, 3, 5, 8, 13}) {
    for (int64_t t = 0; t < 10; ++t) {
      for (int v = 0; v < p; ++v) {
        const Partners me = dissemination(v, p, t);
        CHECK(dissemination(me.send_to, p, t).recv_from == v);
      }
    }
  }
}

TEST_CASE("dissemination reaches every rank in ceil(log2 p) steps", "[partners]") {
  for (int p : {2, 3, 4, 7, 16, 33}) {
    // reach[v] = ranks whose update has arrived at v
    std::vector<std::set<int>> reach(p);
    for (int v = 0; v < p; ++v) reach[v] = {v};
    for (int t = 0; t < rounds_per_cycle(p); ++t) {
      auto next = reach;
      for (int v = 0; v < p; ++v) {
        const int from = dissemination(v, p, t).recv_from;
        next[v].insert(reach[from].begin(), reach[from].end());
      }
      reach = next;
    }
    for (int v = 0; v < p; ++v) CHECK(static_cast<int>(reach[v].size()) == p);
  }
  CHECK(rounds_per_cycle(1) == 0);
  CHECK(rounds_per_cycle(5) == 3);
  CHECK_THROWS(dissemination(3, 3, 0));
}

TEST_CASE("every link of every step of every schedule is a permutation without self-sends",
          "[partners]") {
  for (const Schedule& s : all_schedules(64)) {
    INFO(describe(s));
    const int R = round_length(s.p);
    const int k = s.p == 1 ? 1 : links(s.kind);
    // Three rounds and a bit, so rotation boundaries are crossed, plus steps far from zero.
    std::vector<int64_t> steps;
    for (int64_t t = 0; t < 3 * R + 2; ++t) steps.push_back(t);
    for (int64_t t = 1'000'000'007; t < 1'000'000'007 + R + 1; ++t) steps.push_back(t);
    for (int64_t t : steps) {
      INFO("step " << t);
      const std::vector<Partners> all = step_partners(s, t);
      REQUIRE(static_cast<int>(all.size()) == s.p);
      for (int i = 0; i < k; ++i) {
        INFO("link " << i);
        std::vector<int> sends(s.p, 0), recvs(s.p, 0);
        for (int v = 0; v < s.p; ++v) {
          REQUIRE(all[v].links() == k);
          const Link q = all[v].link(i);
          REQUIRE(q.send_to >= 0);
          REQUIRE(q.send_to < s.p);
          REQUIRE(q.recv_from >= 0);
          REQUIRE(q.recv_from < s.p);
          ++sends[q.send_to];
          ++recvs[q.recv_from];
          CHECK(all[q.send_to].link(i).recv_from == v);
          if (s.p >= 2) {
            CHECK(q.send_to != v);
            CHECK(q.recv_from != v);
          } else {
            CHECK(all[v] == Partners{0, 0});
          }
          if (s.kind == Kind::Hypercube) CHECK(q.send_to == q.recv_from);
          // A rank's links in one step reach distinct peers (p2p tells them apart by rank).
          for (int j = 0; j < i; ++j) {
            CHECK(all[v].link(j).send_to != q.send_to);
            CHECK(all[v].link(j).recv_from != q.recv_from);
          }
        }
        CHECK(std::count(sends.begin(), sends.end(), 1) == s.p);
        CHECK(std::count(recvs.begin(), recvs.end(), 1) == s.p);
      }
    }
  }
}

TEST_CASE("partners computed independently by each rank agree: the schedule is a pure function",
          "[partners]") {
  // What a real run does: rank v calls partners(s, v, t) alone. If v sends to u, then u, computing
  // on its own, must expect to receive from v; otherwise the exchange deadlocks.
  for (const Schedule& s : all_schedules(64)) {
    INFO(describe(s));
    const int R = round_length(s.p);
    for (int64_t t = 0; t < 2 * R + 1; ++t) {
      INFO("step " << t);
      for (int v = 0; v < s.p; ++v) {
        const Partners mine = partners(s, v, t);
        for (int i = 0; i < mine.links(); ++i) {
          CHECK(partners(s, mine.link(i).send_to, t).link(i).recv_from == v);
          CHECK(partners(s, mine.link(i).recv_from, t).link(i).send_to == v);
        }
        CHECK(mine == step_partners(s, t)[v]);
      }
    }
  }
}

TEST_CASE("unrotated schedules follow the formulas in docs/gossip.md", "[partners]") {
  for (int p = 2; p <= 64; ++p) {
    const int R = rounds_per_cycle(p);
    for (int64_t t = 0; t < 2 * R + 1; ++t) {
      const int hop = 1 << (t % R);
      for (int v = 0; v < p; ++v) {
        INFO("p=" << p << " t=" << t << " v=" << v);
        CHECK(partners({Kind::Dissemination, p, false, 7}, v, t) ==
              Partners{(v + hop) % p, (v - hop + p) % p});
        CHECK(partners({Kind::Dissemination, p, false, 7}, v, t) == dissemination(v, p, t));
        CHECK(partners({Kind::Ring, p, false, 7}, v, t) == Partners{(v + 1) % p, (v + p - 1) % p});
        if (power_of_two(p))
          CHECK(partners({Kind::Hypercube, p, false, 7}, v, t) == Partners{v ^ hop, v ^ hop});
        if (p >= 3) {  // exponential2: hops 2^i and 2^j, i = 2t mod R, j = (2t + 1) mod R
          const int a = 1 << ((2 * t) % R), b = 1 << ((2 * t + 1) % R);
          Partners two{(v + a) % p, (v - a + p) % p};
          two.add({(v + b) % p, (v - b + p) % p});
          CHECK(partners({Kind::Exponential2, p, false, 7}, v, t) == two);
        }
      }
    }
  }
  CHECK(partners({Kind::Ring, 1, false, 1}, 0, 5) == Partners{0, 0});
  CHECK(partners({Kind::Hypercube, 1, true, 1}, 0, 5) == Partners{0, 0});
}

TEST_CASE("rotation is one seeded permutation per round, identical for every caller",
          "[partners]") {
  for (int p : {2, 3, 5, 8, 13, 64, 100}) {
    const Schedule s{Kind::Dissemination, p, true, 42};
    const int R = round_length(p);
    std::set<std::vector<int>> per_round;
    for (int64_t round = 0; round < 6; ++round) {
      const std::vector<int> first = rotation(s, round * R);
      std::vector<int> sorted = first;
      std::sort(sorted.begin(), sorted.end());
      for (int v = 0; v < p; ++v) REQUIRE(sorted[v] == v);
      // Constant within the round: the dissemination/hypercube round is never cut in two.
      for (int k = 1; k < R; ++k) CHECK(rotation(s, round * R + k) == first);
      per_round.insert(first);
    }
    // p = 2 has only two permutations; otherwise six rounds should not all draw the same one.
    CHECK(per_round.size() >= 2);
    Schedule off = s;
    off.rotate = false;
    std::vector<int> id(p);
    for (int v = 0; v < p; ++v) id[v] = v;
    CHECK(rotation(off, 3 * R) == id);
    Schedule other = s;
    other.seed = 43;
    if (p >= 5) CHECK(rotation(other, 0) != rotation(s, 0));
  }
}

TEST_CASE("random schedule is deterministic in the seed and changes with it", "[partners]") {
  const int p = 16;
  const auto sequence = [&](uint64_t seed, bool rotate) {
    std::vector<std::vector<Partners>> out;
    for (int64_t t = 0; t < 8; ++t)
      out.push_back(step_partners({Kind::Random, p, rotate, seed}, t));
    return out;
  };
  for (bool rotate : {false, true}) {
    CHECK(sequence(5, rotate) == sequence(5, rotate));
    CHECK(sequence(5, rotate) != sequence(6, rotate));
    const auto seq = sequence(5, rotate);
    // A fresh draw every step, not one pattern repeated.
    CHECK(std::count(seq.begin(), seq.end(), seq[0]) == 1);
  }
  // Seeds do not matter where nothing is drawn.
  for (int64_t t = 0; t < 8; ++t)
    CHECK(step_partners({Kind::Dissemination, p, false, 5}, t) ==
          step_partners({Kind::Dissemination, p, false, 6}, t));
}

TEST_CASE("random schedule is a single p-cycle at every step", "[partners]") {
  // One cycle through all ranks, so no pair of ranks is stuck swapping with each other.
  for (int p : {2, 3, 7, 16, 33}) {
    for (int64_t t = 0; t < 20; ++t) {
      const std::vector<Partners> all = step_partners({Kind::Random, p, false, 9}, t);
      int v = 0, length = 0;
      do {
        v = all[v].send_to;
        ++length;
      } while (v != 0 && length <= p);
      CHECK(length == p);
    }
  }
}

TEST_CASE("schedule names parse, and bad input is rejected with an actionable message",
          "[partners]") {
  for (Kind k : all_kinds()) CHECK(parse_kind(kind_name(k)) == k);
  try {
    parse_kind("telepathy");
    FAIL("no exception");
  } catch (const std::invalid_argument& e) {
    const std::string m = e.what();
    CHECK(m.find("telepathy") != std::string::npos);
    CHECK(m.find("dissemination, hypercube, ring, random, exponential2") != std::string::npos);
    CHECK(m.find('\n') == std::string::npos);
  }
  try {
    partners({Kind::Hypercube, 6, false, 1}, 0, 0);
    FAIL("no exception");
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()) ==
          "hypercube needs a power-of-two rank count, got p=6; use dissemination");
  }
  try {
    validate({Kind::Exponential2, 2, true, 1});
    FAIL("no exception");
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()) ==
          "exponential2 gives each rank two peers a step and needs at least 3 ranks, got p=2; "
          "use dissemination");
  }
  CHECK(partners({Kind::Exponential2, 1, false, 1}, 0, 3) == Partners{0, 0});
  CHECK(links(Kind::Exponential2) == 2);
  CHECK(links(Kind::Dissemination) == 1);
  CHECK_THROWS_AS(validate({Kind::Dissemination, 0, false, 1}), std::invalid_argument);
  CHECK_THROWS_AS(partners({Kind::Ring, 4, false, 1}, 4, 0), std::invalid_argument);
  CHECK_THROWS_AS(partners({Kind::Ring, 4, false, 1}, -1, 0), std::invalid_argument);
  CHECK_THROWS_AS(partners({Kind::Ring, 4, false, 1}, 0, -1), std::invalid_argument);
  CHECK_THROWS_AS(step_partners({Kind::Hypercube, 12, true, 1}, 0), std::invalid_argument);
  CHECK(round_length(1) == 1);
  CHECK(round_length(2) == 1);
  CHECK(round_length(9) == 4);
}
