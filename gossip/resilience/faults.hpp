// Injected failures for resilience studies: the plan of which rank fails at which step, given
// explicitly (fault.inject) or drawn at random (fault.mtbf_steps). The values' grammar (events,
// strategies) is gossip/config/fault_spec.hpp.
//
// The plan is a pure function of the config and the rank count: every rank computes the same
// plan locally, with no communication. It stands in for a failure detector: a real deployment
// would learn of a failure from the runtime (a timeout, ULFM's error codes), not know it ahead.
#pragma once

#include <cstdint>
#include <vector>

#include "gossip/config/fault_spec.hpp"

namespace gg::gossip {

struct Config;

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
