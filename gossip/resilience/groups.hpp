// A `gossipgrad train` job over successive groups of ranks. A simulated failure ends a group: the
// survivors go on over a new communicator that they alone make (forward), or every rank rebuilds
// (restart). What a group built is parked, not destroyed, when ranks leave it (freeing its
// windows is a collective over the old communicator, which needs the failed ranks); the failed
// ranks wait, idle, for the wake message that the survivors send at the end of training, and then
// every rank frees the parked groups together. JobFailures is what the job carries for all this
// from one group to the next.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "gossip/comm/mpi.hpp"
#include "gossip/resilience/emergency.hpp"
#include "gossip/resilience/faults.hpp"
#include "gossip/resilience/rank_state.hpp"

namespace gg::gossip {

class EmergencyState;

// How the job's time over one group of ranks (one communicator) ended.
enum class Ending {
  Done,     // training finished
  Left,     // this rank failed (simulated) and left the group
  Shrink,   // a member failed: the survivors go on over a new communicator (forward)
  Restart,  // a rank failed: every rank rebuilds and reloads the last checkpoint (restart)
};

// What a training run builds over one group of ranks (gossip/train's GroupObjects: the data, the
// trainer and its recovery). After a forward recovery it is parked, not destroyed: freeing its
// RMA/shared-memory windows is a collective over the old communicator, which needs the failed
// rank, and UCX aborts MPI_Finalize while windows are still allocated.
class GroupResources {
 public:
  virtual ~GroupResources() = default;
};

// A failure being recovered: written as fault events once the new group has its first step.
struct PendingFault {
  int64_t step = 0;
  std::vector<int> ranks;  // the job's original ranks
  std::chrono::steady_clock::time_point t0;
};

// The failure side of a job, carried from one group of ranks to the next.
struct JobFailures {
  FailurePlan plan;
  std::vector<int> members;       // the live group: the job's original ranks, in order
  bool wrote_checkpoint = false;  // a full checkpoint of this job exists (restart reloads it)
  // Forward: this rank's own state before `carry_step`, in a run of `carry_per_epoch`.
  std::optional<RankState> carry;
  int64_t carry_step = 0, carry_per_epoch = 0;
  std::optional<PendingFault> pending;
  std::vector<std::unique_ptr<GroupResources>> parked;
  std::vector<std::unique_ptr<mpi::Comm>> comms;  // the survivors' communicators
  EmergencyState* emergency = nullptr;            // under supervise: the state a real failure saves
  std::optional<RecoveryPlan> real_failure;       // this job continues the survivors of one
  // The rank count whose steps train.max_steps and train.stop_at count: the job's as launched
  // (under supervise, the first attempt's: GG_SUPERVISE_RANKS). At another count they mean the
  // same point of training, so that the planned samples are trained.
  int plan_ranks = 1;

  // A job of `ranks` ranks, every one in the first group; plan_ranks from the supervisor.
  explicit JobFailures(int ranks);
  // This rank's index in the live group, or -1 once it left.
  int group_rank_of(int original) const;
};

// At the boundary before step s: under restart or forward, the failures due end the group (the
// failed ranks leave, the others shrink or restart); nullopt when training goes on. `capture`
// fills this rank's state (a forward recovery carries it; it also settles a pending overlapped
// weight exchange, so that no one waits on a rank that leaves); `me`: this rank in the world.
std::optional<Ending> fail_at_boundary(JobFailures& f, int64_t s, int me, int64_t per_epoch,
                                       const std::function<void(RankState&)>& capture);

// The survivors of the pending failure over a new communicator that they alone make (the failed
// ranks take no part); updates f.members.
std::unique_ptr<mpi::Comm> survivors_comm(const mpi::Comm& comm, JobFailures& f);

// At the end of training, on rank 0 of the last group `comm`: every rank of `world` that left is
// woken, with `error` when the survivors end on a usage error (empty: training is done). A rank
// that left waits for it in wait_for_wake, sleeping rather than polling MPI hard, and gets that
// text back; `poll` runs between its tests (it may throw to stop waiting).
void wake_failed(const mpi::Comm& world, const mpi::Comm& comm, const JobFailures& f,
                 const std::string& error = {});
std::string wait_for_wake(const mpi::Comm& world, const std::function<void()>& poll);

}  // namespace gg::gossip
