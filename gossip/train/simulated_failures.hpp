// Simulated failures (fault.inject, fault.mtbf_steps) and their recovery. A failure comes at a
// step boundary: under restart every rank reloads the newest checkpoint, under forward the
// survivors go on over a new communicator (both end the group: see Ending), and under rollback
// the failed rank's replacement takes a live rank's state and every rank redoes the step
// (a StepHook). The failed rank stands idle; MPICH's ULFM calls are not usable here.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

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

// At the start of a group that follows a failure: the fault events and a line on rank 0.
void report_recovery(Group& g, JobState& job);

// The survivors of the pending failure over a new communicator that they alone make
// (MPI_Comm_create_group: the failed ranks take no part); updates job.members.
std::unique_ptr<mpi::Comm> survivors_comm(const mpi::Comm& comm, JobState& job);

// The config of a group after a failure: the test hooks (fault.kill, stall, nan) fired already.
Config without_test_hooks(const Config& c);

}  // namespace gg::gossip
