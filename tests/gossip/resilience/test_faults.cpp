// Simulated failures without MPI: the fault plan (gossip/resilience/faults.hpp) and what a failure
// due at a step boundary does to a group of ranks (gossip/resilience/groups.hpp).
#include <catch2/catch.hpp>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "gossip/config/config.hpp"
#include "gossip/resilience/faults.hpp"
#include "gossip/resilience/groups.hpp"

using namespace gg::gossip;

namespace {

Config faults(const std::string& inject, double mtbf, const std::string& strategy) {
  Config c;
  c.fault.inject = inject;
  c.fault.mtbf_steps = mtbf;
  c.fault.strategy = *find_name<FaultStrategy>(strategy);
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
  CHECK_THROWS_WITH(parse_train_args({"--fault.strategy", "sideways"}),
                    "fault.strategy = sideways is unknown: use restart, rollback, forward");
  CHECK_THROWS_AS(parse_fault_inject("1:2,"), UsageError);
  CHECK_THROWS_AS(parse_fault_inject("1-2"), UsageError);
  CHECK_THROWS_AS(parse_fault_inject("-1:2"), UsageError);
  CHECK(parse_fault_inject("3:7") == std::vector<FaultEvent>{{7, 3}});
}

TEST_CASE(
    "a planned failure ends the group at its step boundary: the failed rank leaves, the "
    "others shrink carrying their state, or every rank restarts") {
  const auto job = [](const std::string& strategy) {
    JobFailures f(4);
    plan_failures(faults("2:5", 0, strategy), f.plan, 4, 100);
    return f;
  };
  int captured = 0;
  const auto capture = [&](RankState& s) {
    ++captured;
    s.step = 5;
  };
  JobFailures f = job("forward");
  CHECK(f.members == std::vector<int>{0, 1, 2, 3});
  CHECK_FALSE(fail_at_boundary(f, 4, 0, 10, capture));  // not due yet: nothing captured
  CHECK(captured == 0);
  CHECK(fail_at_boundary(f, 5, 0, 10, capture) == Ending::Shrink);
  REQUIRE(f.carry);
  CHECK(f.carry->step == 5);
  CHECK(f.carry_step == 5);
  CHECK(f.carry_per_epoch == 10);
  CHECK(f.pending->ranks == std::vector<int>{2});
  CHECK_FALSE(fail_at_boundary(f, 5, 0, 10, capture));  // consumed: a redone step never fails
  JobFailures failed = job("forward");
  CHECK(fail_at_boundary(failed, 5, 2, 10, capture) == Ending::Left);
  CHECK_FALSE(failed.carry);
  JobFailures restart = job("restart");
  CHECK(fail_at_boundary(restart, 5, 2, 10, capture) == Ending::Restart);
  CHECK(captured == 3);  // every rank settles its last step before the group ends
  JobFailures rollback = job("rollback");
  CHECK_FALSE(fail_at_boundary(rollback, 5, 2, 10, capture));  // the rollback hook's to handle
  CHECK(rollback.plan.due(5) == std::vector<int>{2});
  CHECK(f.group_rank_of(3) == 3);
  f.members = {0, 1, 3};
  CHECK(f.group_rank_of(3) == 2);
  CHECK(f.group_rank_of(2) == -1);
}
