// Virtual ranks (train.virtual_ranks = P): P logical ranks trained in this one process, each with
// what a real rank holds (weights, SGD momentum, gradients, batch-norm running statistics, the
// wire codecs' error-feedback residues, its data shard and augmentation stream) and mixing through
// the same rules (comm/mixing.hpp), wire codecs (comm/wire.hpp) and partner schedule as `mpirun -n
// P` would, so that what P ranks learn is known without P machines. One network computes every
// rank's forward and backward in turn (its buffers swapped in and out): the compute is about that
// of one rank training the same epochs, the memory P times the per-rank state (measured on rank 0
// and refused up front when it would not fit; no thread per rank).
//
// The run is the real one: `gossipgrad train` (run_training, loop.cpp) with its step hooks, its
// metrics and its summary, over a Trainer (trainer.hpp) that holds the P ranks' states and runs
// its one step over them, with virtual exchanges (virtual_exchange.hpp) where a real rank has the
// engine's, and TrainingData holding the P ranks' loaders. What is here: the ranks made (rank 0
// first and measured) and the memory planned, and what a virtual run adds to the real run's
// reports (each rank's log.losses, the losses' spread, each rank's own top-1, the memory). The
// distributed shuffle, checkpoints and fault hooks are refused at the start (gossip/config:
// check_virtual). Its proof: tests/gossip/cli/virtual_ranks.sh compares its per-rank losses
// (log.losses) and every metrics event with a real `mpirun -n 4` run's, bit for bit.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "gossip/config/config.hpp"
#include "gossip/train/data.hpp"
#include "gossip/train/hooks.hpp"
#include "gossip/train/loop.hpp"
#include "gossip/train/metrics.hpp"
#include "gossip/train/trainer.hpp"

namespace gg::gossip {

class VirtualRanks {
 public:
  // Gives `trainer` and `data` their train.virtual_ranks ranks for a run of `total` steps over
  // `epochs` epochs, each starting from the trainer's initial weights. Rank 0 is made first and
  // its memory measured: UsageError, naming the largest P that fits, before the others are made
  // when they would not fit what the machine, the cgroup or the ulimits leave.
  VirtualRanks(const Config& c, Trainer& trainer, TrainingData& data, int64_t total,
               int64_t epochs);
  ~VirtualRanks();  // writes the log.losses lines still held (a run that stops or fails too)
  VirtualRanks(const VirtualRanks&) = delete;
  VirtualRanks& operator=(const VirtualRanks&) = delete;

  // The run's first line (in place of a real run's ranks line) and what the start event adds.
  void announce(int threads) const;
  void add_to_start(nlohmann::json& start) const;
  // Between two ranks' turns in step s (a step of thousands of ranks can take minutes): a SIGTERM
  // or Ctrl-C ends the run there, as on real ranks, with a `stopped` event and one line.
  void between_turns(int64_t s, MetricsWriter& metrics) const;
  // The step hook: every rank's log.losses line, a NaN or inf loss refused, the bytes counted.
  std::unique_ptr<StepHook> hook();
  // The step event's loss_mean, loss_min and loss_max over the ranks.
  void add_to_step(nlohmann::json& step) const;
  // The evaluation after the last step adds each rank's own top-1 on train.rank_eval_samples
  // test samples (min / median / max over the ranks) to its line and event.
  void add_to_eval(bool last, int64_t done, double consensus, std::string& line,
                   nlohmann::json& event, MetricsWriter& metrics);
  // The summary's line, and what its event adds (into `summary`).
  std::string summarise(const RunSummary& s, const std::string& top1,
                        const std::string& metrics_path, nlohmann::json& summary) const;

 private:
  class Hook;
  void add_rank();
  void warm_up();
  void plan_memory();
  void write_losses(bool all);

  const Config& c_;
  Trainer& trainer_;
  TrainingData& data_;
  const int ranks_;
  const int64_t total_, epochs_;
  kernels::Executor* rank_eval_ = nullptr;  // each rank's own top-1 (train.rank_eval_samples)
  std::vector<std::string> losses_;         // each rank's log.losses lines not yet written
  size_t losses_held_ = 0;
  int made_ = 0;  // ranks made so far
  int64_t sent_total_ = 0, steps_ = 0;
  int64_t memory_estimate_ = 0, per_rank_bytes_ = 0;  // plan_memory's
};

}  // namespace gg::gossip
