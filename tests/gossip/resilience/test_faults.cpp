#include <catch2/catch.hpp>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "gossip/config/config.hpp"
#include "gossip/resilience/faults.hpp"

using namespace gg::gossip;

namespace {

Config faults(const std::string& inject, double mtbf, const std::string& strategy) {
  Config c;
  c.fault.inject = inject;
  c.fault.mtbf_steps = mtbf;
  c.fault.strategy = strategy;
  return c;
}

}  // namespace

TEST_CASE("the random failure plan is a pure function of its arguments") {
  const auto a = random_fault_plan(8, 50, 100000, 42, false);
  const auto b = random_fault_plan(8, 50, 100000, 42, false);
  REQUIRE(a.size() > 100);
  CHECK(a == b);  // what every rank computes alone
  CHECK(random_fault_plan(8, 50, 100000, 43, false) != a);
  // A longer horizon extends the plan without changing its start (counter-based draws).
  const auto longer = random_fault_plan(8, 50, 200000, 42, false);
  REQUIRE(longer.size() > a.size());
  CHECK(std::vector<FaultEvent>(longer.begin(), longer.begin() + a.size()) == a);
}

TEST_CASE("random failures come every mtbf_steps on average, victims spread over the ranks") {
  const auto plan = random_fault_plan(4, 20, 400000, 7, false);
  REQUIRE(plan.size() > 1000);
  const double mean_gap = static_cast<double>(plan.back().step) / plan.size();
  CHECK(std::abs(mean_gap - 20.5) < 1.5);  // exponential gaps rounded up to whole steps
  std::vector<int> per_rank(4, 0);
  for (size_t i = 0; i < plan.size(); ++i) {
    if (i > 0) CHECK(plan[i].step > plan[i - 1].step);
    REQUIRE(plan[i].rank >= 0);
    REQUIRE(plan[i].rank < 4);
    ++per_rank[plan[i].rank];
  }
  for (int n : per_rank)
    CHECK(std::abs(n - static_cast<double>(plan.size()) / 4) < plan.size() / 10.0);
}

TEST_CASE("with forward recovery a random victim is a live rank and one rank survives") {
  for (uint64_t seed = 1; seed <= 50; ++seed) {
    const auto plan = random_fault_plan(5, 3, 1000, seed, true);
    REQUIRE(plan.size() == 4);  // stops before the last rank
    std::set<int> gone;
    for (const FaultEvent& e : plan) CHECK(gone.insert(e.rank).second);
  }
}

TEST_CASE("fault.inject and fault.mtbf_steps merge into one sorted plan") {
  const auto plan = make_fault_plan(faults("2:30,1:10", 0, "rollback"), 4, 100);
  REQUIRE(plan.size() == 2);
  CHECK(plan[0] == FaultEvent{10, 1});
  CHECK(plan[1] == FaultEvent{30, 2});
  const auto mixed = make_fault_plan(faults("0:5", 10, "forward"), 4, 1000);
  REQUIRE(mixed.size() == 3);  // rank 0 and then two of ranks 1..3: one survives
  std::set<int> ranks;
  for (const FaultEvent& e : mixed) ranks.insert(e.rank);
  CHECK(ranks.size() == 3);
  CHECK(make_fault_plan(faults("", 0, "restart"), 4, 100).empty());
}

TEST_CASE("bad fault specs are usage errors naming the problem") {
  auto message = [](const Config& c, int ranks) {
    try {
      make_fault_plan(c, ranks, 100);
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK(message(faults("4:10", 0, "forward"), 4) ==
        "fault.inject = 4:10: rank 4 is out of range: the job has 4 ranks");
  CHECK(message(faults("0:1,1:2", 0, "forward"), 2) ==
        "fault.inject = 0:1,1:2: every rank fails; forward recovery needs a survivor");
  CHECK(message(faults("0:1,1:1", 0, "restart"), 2) ==
        "fault.inject = 0:1,1:1: every rank fails at step 1; restart needs a live rank");
  CHECK(message(faults("1:1,1:5", 0, "forward"), 3) ==
        "fault.inject = 1:1,1:5: rank 1 fails twice; with fault.strategy forward a failed rank is "
        "gone");
  CHECK(message(faults("1:1,1:5", 0, "rollback"), 3) == "no error");  // replaced, may fail again
  CHECK(message(faults("", 0, "sideways"), 3) ==
        "fault.strategy = sideways is unknown: restart, rollback or forward");
  CHECK_THROWS_AS(parse_fault_inject("1:2,"), UsageError);
  CHECK_THROWS_AS(parse_fault_inject("1-2"), UsageError);
  CHECK_THROWS_AS(parse_fault_inject("-1:2"), UsageError);
  CHECK(parse_fault_inject("3:7") == std::vector<FaultEvent>{{7, 3}});
}
