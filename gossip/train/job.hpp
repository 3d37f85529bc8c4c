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
#include "gossip/resilience/groups.hpp"
#include "gossip/train/data.hpp"
#include "gossip/train/loop.hpp"
#include "gossip/train/metrics.hpp"
#include "gossip/train/recovery.hpp"
#include "gossip/train/stop_signals.hpp"
#include "gossip/train/trainer.hpp"
#include "gossip/train/virtual.hpp"

namespace gg::gossip {

using Clock = std::chrono::steady_clock;
inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// What a training run builds over one group of ranks; parked after a forward recovery (see
// GroupResources).
struct GroupObjects : GroupResources {
  std::unique_ptr<TrainingData> data;
  std::unique_ptr<Trainer> trainer;
  std::unique_ptr<Recovery> recovery;
  std::unique_ptr<VirtualRanks> held;  // train.virtual_ranks: the ranks this process holds
  ~GroupObjects() override {
    held.reset();
    recovery.reset();
    trainer.reset();
    data.reset();
  }
};

// State carried from one group of ranks to the next, and the job's totals.
struct JobState {
  explicit JobState(const mpi::Comm& w) : world(w), failures(w.size()) {}
  const mpi::Comm& world;
  std::deque<Config> configs;  // one per group (the objects keep a reference)
  JobFailures failures;        // the failure side: groups, parking, what a recovery carries
  MetricsWriter metrics;
  std::string metrics_path;  // log.metrics as this job writes it (a fresh run folder's file)
  std::unique_ptr<std::ofstream> samples;  // log.samples
  std::unique_ptr<std::ofstream> losses;   // log.losses
  RunSummary summary;
  Clock::time_point t_start;
  double train_seconds = 0, comm_seconds = 0, images = 0, last_print = 0;
  // Seconds spent in evaluation and checkpoints between steps: not training time (run_step
  // leaves them out of the step that follows).
  double untimed_seconds = 0;
  bool started = false;
  StopSignals* stop_signals = nullptr;
};

// One group's objects and the numbers of its run, as every phase of the loop sees them.
struct Group {
  const Config& c;
  const mpi::Comm& comm;
  TrainingData& data;
  Trainer& trainer;
  Recovery& recovery;
  VirtualRanks* held = nullptr;  // train.virtual_ranks (then comm is this process alone)
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
