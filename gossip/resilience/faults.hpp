// Injected failures for resilience studies: the plan of which rank fails at which step, given
// explicitly (fault.inject) or drawn at random (fault.mtbf_steps), and the recovery strategy.
//
// The plan is a pure function of the config and the rank count: every rank computes the same
// plan locally, with no communication. It stands in for a failure detector: a real deployment
// would learn of a failure from the runtime (a timeout, ULFM's error codes), not know it ahead.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gg::gossip {

struct Config;

enum class FaultStrategy {
  Restart,   // every rank reloads the last full checkpoint (or the initial state) and redoes
  Rollback,  // the failed rank takes a live rank's state; every rank redoes the interrupted step
  Forward,   // the survivors carry on without the failed rank (lossy forward recovery)
};
FaultStrategy parse_fault_strategy(const std::string& name);  // throws UsageError
const char* to_string(FaultStrategy s);

// Rank `rank` (of the job's original ranks) fails at the boundary before step `step`, counted
// in the steps of the job at its starting rank count: after a forward recovery, where an epoch
// has more steps, a later failure comes at the same point of the same epoch.
struct FaultEvent {
  int64_t step = 0;
  int rank = 0;
  bool operator==(const FaultEvent&) const = default;
};

// "RANK:STEP[,RANK:STEP...]" -> events in the order given; throws UsageError naming fault.inject.
std::vector<FaultEvent> parse_fault_inject(const std::string& spec);

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

}  // namespace gg::gossip
