// What one `gossipgrad train` job carries from one group of ranks to the next (a failure may end a
// group: the survivors go on over a new communicator, or every rank restarts), and what a group
// builds: the data, the trainer and its recovery, with the numbers every phase of a step needs.
// Internal to gossip/train.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <fstream>
#include <memory>
#include <optional>
#include <vector>

#include "gossip/comm/mpi.hpp"
#include "gossip/config/config.hpp"
#include "gossip/resilience/emergency.hpp"
#include "gossip/resilience/faults.hpp"
#include "gossip/resilience/rank_state.hpp"
#include "gossip/train/data.hpp"
#include "gossip/train/loop.hpp"
#include "gossip/train/metrics.hpp"
#include "gossip/train/recovery.hpp"
#include "gossip/train/stop_signals.hpp"
#include "gossip/train/trainer.hpp"

namespace gg::gossip {

class EmergencyState;

using Clock = std::chrono::steady_clock;
inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// How the job's time over one group of ranks (one communicator) ended.
enum class Ending {
  Done,     // training finished
  Left,     // this rank failed (simulated) and left the group
  Shrink,   // a member failed: the survivors go on over a new communicator (forward)
  Restart,  // a rank failed: every rank rebuilds and reloads the last checkpoint (restart)
};

// What a training run builds over one group of ranks. After a forward recovery it is parked, not
// destroyed: freeing its RMA/shared-memory windows is a collective over the old communicator,
// which needs the failed rank, and UCX aborts MPI_Finalize while windows are still allocated.
struct GroupObjects {
  std::unique_ptr<TrainingData> data;
  std::unique_ptr<Trainer> trainer;
  std::unique_ptr<Recovery> recovery;
  ~GroupObjects() {
    recovery.reset();
    trainer.reset();
    data.reset();
  }
};

// A failure being recovered: written as fault events once the new group has its first step.
struct PendingFault {
  int64_t step = 0;
  std::vector<int> ranks;  // the job's original ranks
  Clock::time_point t0;
};

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

// State carried from one group of ranks to the next, and the job's totals.
struct JobState {
  explicit JobState(const mpi::Comm& w) : world(w) {}
  const mpi::Comm& world;
  std::deque<Config> configs;  // one per group (the objects keep a reference)
  FailurePlan failures;
  std::vector<int> members;  // the live group: the job's original ranks, in order
  MetricsWriter metrics;
  std::string metrics_path;  // log.metrics as this job writes it (a fresh run folder's file)
  std::unique_ptr<std::ofstream> samples;  // log.samples
  RunSummary summary;
  Clock::time_point t_start;
  double train_seconds = 0, comm_seconds = 0, images = 0, last_print = 0;
  // Seconds spent in evaluation and checkpoints between steps: not training time (run_step
  // leaves them out of the step that follows).
  double untimed_seconds = 0;
  bool started = false;
  bool wrote_checkpoint = false;  // a full checkpoint of this job exists (restart reloads it)
  // Forward: this rank's own state before `carry_step`, in a run of `carry_per_epoch`.
  std::optional<RankState> carry;
  int64_t carry_step = 0, carry_per_epoch = 0;
  std::optional<PendingFault> pending;
  std::vector<std::unique_ptr<GroupObjects>> parked;
  std::vector<std::unique_ptr<mpi::Comm>> comms;  // the survivors' communicators
  StopSignals* stop_signals = nullptr;
  EmergencyState* emergency = nullptr;       // under supervise: the state a real failure saves
  std::optional<RecoveryPlan> real_failure;  // this job continues the survivors of one
  // The rank count whose steps train.max_steps and train.stop_at count: the job's as launched
  // (under supervise, the first attempt's: GG_SUPERVISE_RANKS). At another count they mean the
  // same point of training, so that the planned samples are trained.
  int plan_ranks = 1;
  // This rank's index in the live group, or -1 once it left.
  int group_rank_of(int original) const;
};

// One group's objects and the numbers of its run, as every phase of the loop sees them.
struct Group {
  const Config& c;
  const mpi::Comm& comm;
  TrainingData& data;
  Trainer& trainer;
  Recovery& recovery;
  int threads = 1;
  int ranks_on_node = 1;  // on this rank's node
  int64_t per_epoch = 0;  // steps per epoch
  int64_t total = 0;      // steps of the whole run
  int64_t epochs = 0;
  int64_t first = 0;          // the first step this group runs
  double planned_epochs = 0;  // train.max_steps or train.epochs, in epochs (of any rank count)
  int64_t global_batch = 0;
  bool lead = false;  // rank 0 of the group: prints and writes metrics
};

}  // namespace gg::gossip
