// The fault plan (gossip/resilience/faults.hpp): random failures from a counter-based generator,
// the explicit ones merged in and checked; the rollback's state exchange.
#include "gossip/resilience/faults.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <stdexcept>
#include <string>

namespace gg::gossip {
namespace {

constexpr int kStateTag = 0x5254;  // rollback: a donor's state to a failed rank's replacement

bool contains(const std::vector<int>& v, int x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

// SplitMix64's finaliser over (seed, counter): draw k of stream `stream` is the same on every
// rank and independent of how many draws came before.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

double uniform(uint64_t seed, uint64_t stream, uint64_t k) {
  const uint64_t bits = mix(mix(seed ^ 0x4641554c54ull) + mix(stream * 0x100000001b3ull + k));
  return static_cast<double>(bits >> 11) * 0x1.0p-53;  // [0, 1)
}

}  // namespace

std::vector<FaultEvent> random_fault_plan(int ranks, double mtbf_steps, int64_t horizon,
                                          uint64_t seed, bool shrinking) {
  std::vector<FaultEvent> events;
  if (!(mtbf_steps > 0) || ranks < 2) return events;
  std::vector<int> alive(ranks);
  for (int r = 0; r < ranks; ++r) alive[r] = r;
  int64_t step = 0;
  for (uint64_t k = 0; !shrinking || alive.size() > 1; ++k) {
    // Inverse transform of an exponential gap; at least one step, so no step sees two.
    const double gap = -mtbf_steps * std::log1p(-uniform(seed, 0, k));
    const double next = static_cast<double>(step) + std::max(1.0, std::ceil(gap));
    if (next >= static_cast<double>(horizon)) break;
    step = static_cast<int64_t>(next);
    const size_t i =
        std::min(alive.size() - 1, static_cast<size_t>(uniform(seed, 1, k) * alive.size()));
    events.push_back({step, alive[i]});
    if (shrinking) alive.erase(alive.begin() + static_cast<std::ptrdiff_t>(i));
  }
  return events;
}

std::vector<FaultEvent> make_fault_plan(const Config& c, int ranks, int64_t horizon) {
  const FaultStrategy strategy = c.fault.strategy;
  const bool shrinking = strategy == FaultStrategy::Forward;
  std::vector<FaultEvent> plan;
  if (!c.fault.inject.empty()) plan = parse_fault_inject(c.fault.inject);
  for (const FaultEvent& e : plan)
    if (e.rank >= ranks)
      throw UsageError("fault.inject = " + c.fault.inject + ": rank " + std::to_string(e.rank) +
                       " is out of range: the job has " + std::to_string(ranks) + " ranks");
  if (c.fault.mtbf_steps > 0) {
    if (ranks < 2)
      throw UsageError(
          "fault.mtbf_steps needs at least 2 ranks: one rank has no one to recover "
          "from");
    // Random failures after the explicit ones: with forward, only among those still alive.
    std::set<int> gone;
    if (shrinking)
      for (const FaultEvent& e : plan) gone.insert(e.rank);
    std::vector<int> keep;
    for (int r = 0; r < ranks; ++r)
      if (!gone.count(r)) keep.push_back(r);
    for (FaultEvent e : random_fault_plan(static_cast<int>(keep.size()), c.fault.mtbf_steps,
                                          horizon, c.train.seed, shrinking)) {
      e.rank = keep[e.rank];
      plan.push_back(e);
    }
  }
  std::sort(plan.begin(), plan.end(), [](const FaultEvent& a, const FaultEvent& b) {
    return a.step != b.step ? a.step < b.step : a.rank < b.rank;
  });
  plan.erase(std::unique(plan.begin(), plan.end()), plan.end());
  const std::string what =
      c.fault.inject.empty() ? std::string("fault.mtbf_steps") : "fault.inject = " + c.fault.inject;
  if (shrinking) {
    std::set<int> failed;
    for (const FaultEvent& e : plan)
      if (!failed.insert(e.rank).second)
        throw UsageError(what + ": rank " + std::to_string(e.rank) +
                         " fails twice; with fault.strategy forward a failed rank is gone");
    if (!plan.empty() && static_cast<int>(failed.size()) >= ranks)
      throw UsageError(what + ": every rank fails; forward recovery needs a survivor");
  } else {
    std::map<int64_t, int> per_step;
    for (const FaultEvent& e : plan)
      if (++per_step[e.step] >= ranks)
        throw UsageError(what + ": every rank fails at step " + std::to_string(e.step) + "; " +
                         text_of(strategy) + " needs a live rank");
  }
  return plan;
}

std::vector<int> FailurePlan::due(int64_t s) {
  std::vector<int> ranks;
  while (next < events.size() && events[next].step <= s) ranks.push_back(events[next++].rank);
  return ranks;
}

void plan_failures(const Config& c, FailurePlan& plan, int ranks, int64_t total) {
  if (plan.planned) return;
  plan.strategy = c.fault.strategy;
  plan.events = make_fault_plan(c, ranks, total);
  plan.planned = true;
}

RankState replace_failed(const mpi::Comm& comm, const std::vector<int>& failed, RankState own) {
  const int p = comm.size(), me = comm.rank();
  auto donor_of = [&](int v) {
    int d = (v + 1) % p;
    while (contains(failed, d)) d = (d + 1) % p;
    return d;
  };
  if (contains(failed, me)) {
    // This rank's state is lost: nothing of it survives into what it trains next.
    own = RankState{};
    const std::vector<uint8_t> wire = comm.recv_bytes(donor_of(me), kStateTag);
    return decode_state(wire.data(), wire.size(), "the donor's state");
  }
  std::vector<uint8_t> wire;
  for (int v : failed) {
    if (donor_of(v) != me) continue;
    if (wire.empty()) wire = encode_state(own);
    if (static_cast<int64_t>(wire.size()) > mpi::kMaxCount)
      throw std::runtime_error("rollback: a state of " + std::to_string(wire.size()) +
                               " bytes is too large for one message");
    comm.send_bytes(wire, v, kStateTag);
  }
  return own;
}

Config without_test_hooks(const Config& c) {
  Config next = c;
  next.fault.kill.clear();
  next.fault.stall.clear();
  next.fault.nan = -1;
  next.fault.nan_stats = -1;
  return next;
}

}  // namespace gg::gossip
