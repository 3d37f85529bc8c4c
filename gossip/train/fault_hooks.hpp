// Where training meets the failures (gossip/resilience/faults.hpp, groups.hpp, emergency.hpp):
// the plan's failures at a step boundary, the rollback as a step hook, the emergency state kept
// after every step, and the lines and fault events that report a recovery, simulated or real,
// once the new group has its first step.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "gossip/resilience/groups.hpp"
#include "gossip/train/hooks.hpp"
#include "gossip/train/job.hpp"

namespace gg::gossip {

// Plans the job's failures once, from the first group's config and step count.
void plan_failures(const Config& c, JobState& job, int ranks, int64_t total);

// At the boundary before step s: under restart or forward, the failures due end the group (the
// failed ranks leave, the others shrink or restart); nullopt when training goes on.
std::optional<Ending> fail_at_boundary(Group& g, JobState& job, int64_t s);

// Under rollback: a failure due at step s lets the step run, then replaces the failed ranks'
// states with live ones from before the step, and every rank runs it again.
std::unique_ptr<StepHook> make_rollback_hook(Group& g, JobState& job);

// Under supervise: this rank's state at this step boundary becomes the one its saver writes if a
// peer dies; the hook does it after every step (the last hook: after the step's agreements).
void keep_emergency_state(Group& g, EmergencyState& e);
std::unique_ptr<StepHook> make_emergency_hook(Group& g, EmergencyState& e);

// A relaunch by the supervisor: the survivors' states (take_emergency_states) carried into the
// job's first group.
void take_survivor_states(const Config& c, const mpi::Comm& world, JobState& job);

// At the start of a group that follows a simulated failure: the fault events and a line on
// rank 0.
void report_recovery(Group& g, JobState& job);

// A relaunch after a real failure (take_emergency_states): a line, and a fault event per lost
// rank (or one naming the first rank process gone, when every state was saved), with the seconds
// from the first saver's notice of the failure to now (training again).
void report_real_failure(Group& g, JobState& job);

}  // namespace gg::gossip
