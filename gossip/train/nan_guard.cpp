// The NaN guard (gossip/train/nan_guard.hpp): snapshots, the agreed check of the loss and the
// weights, and the restores.
#include "gossip/train/nan_guard.hpp"

#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>

#include "gossip/train/agree.hpp"
#include "gossip/train/data.hpp"
#include "gossip/train/trainer.hpp"
#include "kernels/tensor.hpp"

namespace gg::gossip {

bool weights_finite(Trainer& trainer) {
  const kernels::FlatBuffer& params = trainer.store().params;  // checked where it lies
  return kernels::all_finite(params.data(), params.size()) &&
         kernels::all_finite(trainer.store().buffers);
}

NanGuard::NanGuard(const Config& c, const mpi::Comm& world, Trainer& trainer, TrainingData& data)
    : c_(c),
      world_(world),
      trainer_(trainer),
      data_(data),
      agreement_(std::make_unique<LaggedMax>(world)),
      stop_at_(c.train.stop_at) {}

NanGuard::~NanGuard() = default;
NanGuard::NanGuard(NanGuard&&) noexcept = default;

void NanGuard::continue_with(int restores, double lr_scale) {
  lr_scale_ = lr_scale;
  nan_restores_ = restores;
  trainer_.set_lr_scale(lr_scale_);
}

void NanGuard::before_step(int64_t s) {
  if (c_.guard.nan_retries == 0 || (snapshot_ && s % c_.guard.snapshot_every != 0)) return;
  // Weights that became non-finite are no state to go back to. after_step(s - 1) checked them
  // (a collective) when this snapshot was due; the first snapshot checks them here, and a
  // failure is after_step(s)'s to report.
  if (weights_checked_for_ != s) {
    double bad = weights_finite(trainer_) ? 0 : 1;
    world_.allreduce_max(&bad, 1);
    if (bad != 0) {
      weights_bad_ = true;
      return;
    }
  }
  RankState snap;
  trainer_.capture_state(snap);
  snap.step = s;
  snapshot_ = std::move(snap);
}

bool NanGuard::weights_due(int64_t s) const {
  // Before every snapshot, every evaluation and average-model checkpoint (an epoch's end), and
  // every full checkpoint by step count: a non-finite weight can hide from the loss (a weight
  // that no sample's forward reads, or a NaN that arrived from a partner after the forward).
  const int64_t done = s + 1;
  return done % c_.guard.snapshot_every == 0 || done % data_.steps_per_epoch() == 0 ||
         (c_.checkpoint.every > 0 && done % c_.checkpoint.every == 0) || done == stop_at_;
}

bool NanGuard::after_step(int64_t s, double loss, bool last, MetricsWriter& metrics) {
  // Every rank decides alike (a partner's NaN reaches this rank only a step later): the loss
  // every step, the weights when due, in one collective. With guard.lag 1 it runs behind the
  // next step, and that step acts on it; never before a snapshot, evaluation or checkpoint by
  // step count (the weights are due then) nor after the last step.
  const bool check = weights_due(s);
  const bool weights_bad = weights_bad_ || (check && !weights_finite(trainer_));
  weights_bad_ = false;
  if (agreement_->running()) {
    const int64_t before = agreement_->step();
    const double* bad = agreement_->finish();
    // This step's own flags are dropped with it: the state it reached is not kept.
    if (bad[0] != 0 || bad[1] != 0) return act_on(before, bad, metrics);
  }
  const bool behind = c_.guard.lag > 0 && !check && !last;
  agreement_->start(s, {std::isfinite(loss) ? 0. : 1., weights_bad ? 1. : 0.}, behind);
  if (behind) return false;
  const double* bad = agreement_->finish();
  if (check && bad[1] == 0) weights_checked_for_ = s + 1;
  if (bad[0] == 0 && bad[1] == 0) return false;
  return act_on(s, bad, metrics);
}

bool NanGuard::act_on(int64_t s, const double* bad, MetricsWriter& metrics) {
  const char* what = bad[0] != 0 ? "loss" : "weights";
  if (c_.guard.nan_retries == 0 || nan_restores_ >= c_.guard.nan_retries || !snapshot_) {
    std::string msg =
        std::string("the ") + what + " became non-finite at step " + std::to_string(s);
    if (c_.guard.nan_retries > 0)
      msg += " after " + std::to_string(nan_restores_) + " restores (guard.nan_retries)";
    throw std::runtime_error(msg + "; lower train.lr");
  }
  ++nan_restores_;
  lr_scale_ *= c_.guard.lr_factor;
  trainer_.restore_model(*snapshot_);
  trainer_.set_lr_scale(lr_scale_);
  weights_checked_for_ = -1;
  if (world_.rank() == 0) {
    std::printf(
        "gossipgrad: non-finite %s at step %lld: restored the state of step %lld on every "
        "rank, learning rate scaled by %g (restore %d of at most %d)\n",
        what, static_cast<long long>(s), static_cast<long long>(snapshot_->step), lr_scale_,
        nan_restores_, c_.guard.nan_retries);
    std::fflush(stdout);
    metrics.write({{"event", "guard"},
                   {"cause", what},
                   {"step", s},
                   {"restored_step", snapshot_->step},
                   {"lr_scale", lr_scale_},
                   {"restores", nan_restores_}});
  }
  return true;
}

}  // namespace gg::gossip
