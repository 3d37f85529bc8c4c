// The NaN guard: a NaN or Inf in any rank's loss or weights sends every rank back to its last
// snapshot with a lower learning rate (guard.nan_retries times at most), so that one bad step does
// not end a long run. Driven by a step hook (gossip/train/step_hooks.cpp) at the step boundaries.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "gossip/comm/mpi.hpp"
#include "gossip/config/config.hpp"
#include "gossip/resilience/rank_state.hpp"
#include "gossip/train/metrics.hpp"

namespace gg::gossip {

class LaggedMax;
class Trainer;
class TrainingData;

// This rank's parameters and running statistics are all finite.
bool weights_finite(Trainer& trainer);

class NanGuard {
 public:
  NanGuard(const Config& c, const mpi::Comm& world, Trainer& trainer, TrainingData& data);
  ~NanGuard();
  NanGuard(NanGuard&&) noexcept;

  // A run that continues from a saved state: the restores it had made and its learning-rate
  // scale (which the trainer takes).
  void continue_with(int restores, double lr_scale);
  // train.stop_at in this run's steps: the weights are checked before it.
  void plan_stop_at(int64_t step) { stop_at_ = step; }
  // The network changed shape (apoptosis): the snapshot is taken afresh.
  void model_changed() { snapshot_.reset(); }
  // The restores so far (part of a rank's state).
  int restores() const { return nan_restores_; }

  // Before step s: the snapshot, when one is due (a collective).
  void before_step(int64_t s);
  // After step s with this rank's loss (a collective, 16 bytes): a NaN/Inf loss on any rank, or
  // a NaN/Inf weight or running statistic on any rank (looked for before every snapshot, epoch
  // end and full checkpoint by step count), restores every rank's last snapshot and lowers the
  // learning rate; returns true then. Throws std::runtime_error naming the step once
  // guard.nan_retries restores are spent (at once with guard.nan_retries 0). With guard.lag 1
  // the collective of step s runs behind step s + 1, whose after_step acts on it (except before
  // a check of the weights and after the `last` step: then at once).
  bool after_step(int64_t s, double loss, bool last, MetricsWriter& metrics);

 private:
  // The agreed flags {loss, weights} of step s, one of them bad: restore or stop.
  bool act_on(int64_t s, const double* bad, MetricsWriter& metrics);
  // Whether after_step(s) looks at the weights.
  bool weights_due(int64_t s) const;

  const Config& c_;
  const mpi::Comm& world_;
  Trainer& trainer_;
  TrainingData& data_;
  std::optional<RankState> snapshot_;
  std::unique_ptr<LaggedMax> agreement_;  // after_step's collective
  bool weights_bad_ = false;          // before_step found them non-finite; after_step reports it
  int64_t weights_checked_for_ = -1;  // after_step found them finite for the snapshot of this step
  int nan_restores_ = 0;
  int64_t stop_at_ = 0;  // train.stop_at, in this run's steps
  double lr_scale_ = 1;
};

}  // namespace gg::gossip
