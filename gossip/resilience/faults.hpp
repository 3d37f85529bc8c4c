// Injected failures for resilience studies: the plan of which rank fails at which step, given
// explicitly (fault.inject) or drawn at random (fault.mtbf_steps), followed once per job, and the
// rollback's exchange of a live rank's state. A failure comes at a step boundary: under restart
// every rank reloads the newest checkpoint, under forward the survivors go on over a new
// communicator (both end the group of ranks: gossip/resilience/groups.hpp), and under rollback the
// failed rank's replacement takes a live rank's state and every rank redoes the step (a step hook
// of gossip/train/fault_hooks.hpp). The failed rank stands idle; MPICH's ULFM calls are not usable
// here. The values' grammar (events, strategies) stays in gossip/config/fault_spec.hpp: the
// options are checked there, before MPI starts, and config depends on nothing of resilience.
//
// The plan is a pure function of the config and the rank count: every rank computes the same
// plan locally, with no communication. It stands in for a failure detector: a real deployment
// would learn of a failure from the runtime (a timeout, ULFM's error codes), not know it ahead.
#pragma once

#include <cstdint>
#include <vector>

#include "gossip/comm/mpi.hpp"
#include "gossip/config/config.hpp"
#include "gossip/config/fault_spec.hpp"
#include "gossip/resilience/rank_state.hpp"

namespace gg::gossip {

// Failures with exponentially distributed gaps of mean `mtbf_steps` steps (at least one step
// apart), each victim uniform among the ranks alive then (`shrinking`: a failed rank is gone, as
// with forward recovery; otherwise it is replaced and may fail again). Draws come from a
// counter-based generator keyed by `seed`, so the result depends on the arguments only. Stops
// before `horizon` steps, and with `shrinking` before the last rank would fail.
std::vector<FaultEvent> random_fault_plan(int ranks, double mtbf_steps, int64_t horizon,
                                          uint64_t seed, bool shrinking);

// The run's whole plan: fault.inject and fault.mtbf_steps merged, sorted by step (then rank).
// Throws UsageError for a rank out of range, a plan in which every rank fails (forward: overall;
// restart and rollback: at one step), or a rank that fails twice under forward.
std::vector<FaultEvent> make_fault_plan(const Config& c, int ranks, int64_t horizon);

// The simulated failures of the whole job (fault.inject, fault.mtbf_steps), planned once.
struct FailurePlan {
  std::vector<FaultEvent> events;
  bool planned = false;
  size_t next = 0;  // events before it have happened
  FaultStrategy strategy = FaultStrategy::Forward;
  // The failures due at step s (one step may see several); consumed once, so redone steps never
  // fail again.
  std::vector<int> due(int64_t s);
};

// Plans the job's failures once, from the first group's config and step count.
void plan_failures(const Config& c, FailurePlan& plan, int ranks, int64_t total);

// Rollback: each failed rank's replacement (`failed`: ranks of `comm`) receives the state of the
// next live rank after it (one point-to-point message); every other rank keeps its own `own`.
// Returns the state to rewind to.
RankState replace_failed(const mpi::Comm& comm, const std::vector<int>& failed, RankState own);

// The config of a group after a failure: the test hooks (fault.kill, stall, nan) fired already.
Config without_test_hooks(const Config& c);

}  // namespace gg::gossip
