// Full checkpoints (every rank's exact state) and resume (exact at the same rank count, the
// ranks' average at another). The NaN guard, which a rank's state records, is nan_guard.hpp.
//
// A full checkpoint is a folder `<checkpoint.dir>/ckpt-<step>/`:
//   rank-00000.bin ...  one per rank (RankState, encode_state), each written under a temporary
//                       name, fsynced and renamed
//   config.ini          the resolved config of the run that wrote it
//   MANIFEST.json       written last by rank 0, once every rank's file is durable: step, epoch,
//                       ranks, the model, and each file's size and XXH3-64 checksum
// A folder without a manifest, or with a file whose size or checksum differs, is not a
// checkpoint: resume skips it (saying so) and takes the previous one. The newest
// `checkpoint.keep` complete checkpoints are kept. Ranks must share the checkpoint folder.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gossip/comm/mpi.hpp"
#include "gossip/config/config.hpp"
#include "gossip/resilience/full_checkpoint.hpp"
#include "gossip/resilience/rank_state.hpp"
#include "gossip/train/metrics.hpp"
#include "gossip/train/nan_guard.hpp"
#include "kernels/models.hpp"

namespace gg::gossip {

class Trainer;
class TrainingData;

// How a checkpoint's model differs from the one this run builds ("model.batch_norm true there,
// false here, ..."), naming the settings to change; empty when they are the same model.
std::string model_difference(const kernels::ModelSpec& saved, const kernels::ModelSpec& built);

// The checkpoints of `gossipgrad train`: resume when a group of ranks starts, and full
// checkpoints when due, driven by the step hooks (gossip/train/step_hooks.cpp) at step
// boundaries. It owns the NaN guard, whose state a checkpoint keeps.
class Recovery {
 public:
  Recovery(const Config& c, const mpi::Comm& world, Trainer& trainer, TrainingData& data,
           kernels::ModelSpec model);
  ~Recovery();
  Recovery(Recovery&&) noexcept;

  // checkpoint.resume: restores the newest valid checkpoint into the trainer and the data (a
  // collective). Returns the first step to run (0 without a checkpoint). Throws UsageError for a
  // checkpoint of another model or shuffle mode, std::runtime_error when none is valid.
  int64_t resume();
  bool resumed() const { return resumed_; }
  // Forward recovery: this freshly built trainer (over the survivors) continues with this rank's
  // own state `own`, captured before step `old_step` of a run with `old_per_epoch` steps per
  // epoch; the samples are reassigned from the same point of the same epoch. Before the data
  // start; returns the first step to run, in this run's steps.
  int64_t continue_from(const RankState& own, int64_t old_step, int64_t old_per_epoch);
  // Whether this run wrote a full checkpoint (restart reloads the newest then).
  bool wrote_checkpoint() const { return wrote_any_; }
  // The step of this run at the point of step `step` of a run with `old_per_epoch` steps per
  // epoch: the same point of the same epoch.
  int64_t same_point(int64_t step, int64_t old_per_epoch) const;
  // train.stop_at in this run's steps (another rank count than the job was launched with).
  void plan_stop_at(int64_t step) {
    stop_at_ = step;
    guard_.plan_stop_at(step);
  }
  NanGuard& guard() { return guard_; }

  // After step s and its evaluation: a full checkpoint when one is due, and after the `last`
  // step of training (a collective). Returns true when training must stop here (train.stop_at).
  bool after_step_done(int64_t s, int64_t epoch, bool last, MetricsWriter& metrics);

  // Writes the full checkpoint of the state after `steps` steps (a collective). Throws
  // std::runtime_error, writing and removing nothing, when a rank's weights hold NaN or inf.
  void write_checkpoint(int64_t steps, int64_t epoch);
  // The full checkpoint after `done` steps, written now unless it was already (a collective);
  // returns its folder, or "" without checkpoint.dir.
  std::string checkpoint_now(int64_t done, int64_t epoch, MetricsWriter& metrics);

 private:
  // After the model of `s` is restored: training goes on at `step` with its counters and
  // learning-rate scale, as a resumed run (no fault injected again, no checkpoint removed); its
  // first step also counts unreported_bytes (Trainer::unreported_bytes).
  void continue_at(int64_t step, const RankState& s, int64_t unreported_bytes);
  RankState capture();
  // resume(), step by step (collectives, but the const ones): the folder to resume from (empty:
  // none yet), its manifest checked against this run's model (which takes the checkpoint's
  // widths), and this rank's state in it (the ranks' average at another rank count).
  std::string choose_checkpoint(const std::string& where);
  Manifest open_manifest(const std::string& folder);
  RankState read_states(const std::string& folder, const Manifest& m);
  RankState read_own_state(const std::string& folder, const Manifest& m) const;
  RankState average_states(const std::string& folder, const Manifest& m) const;
  bool time_due();
  // write_checkpoint, step by step (collectives): the folder made (an earlier run's checkpoints
  // removed), this rank's file written (its size and checksum into `digests`), the manifest.
  void make_folder(const std::string& folder);
  void write_own_file(const std::string& folder, std::vector<int64_t>& digests);
  void write_manifest_of(const std::string& folder, int64_t steps, int64_t epoch,
                         const std::vector<int64_t>& digests);

  const Config& c_;
  const mpi::Comm& world_;
  Trainer& trainer_;
  TrainingData& data_;
  const kernels::ModelSpec model_;
  bool resumed_ = false;
  bool wrote_any_ = false;
  int64_t last_written_ = -1;
  double last_write_time_ = 0;  // seconds since start_
  double start_ = 0;
  NanGuard guard_;
  int64_t stop_at_ = 0;  // train.stop_at, in this run's steps
};

}  // namespace gg::gossip
