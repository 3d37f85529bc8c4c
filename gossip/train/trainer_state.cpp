// Trainer, its state in and out: what a checkpoint, a NaN-guard snapshot or an emergency state
// holds of a rank (capture_state), putting one back (restore_model, rewind, resume_at), the peers
// forgotten after a rank was replaced, and train.init_from.

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "gossip/comm/mixing.hpp"
#include "gossip/train/agree.hpp"
#include "gossip/train/trainer.hpp"
#include "kernels/weights.hpp"

namespace gg::gossip {

void Trainer::capture_state(RankState& s) {
  if (c_.gossip.pipeline_weights) flush_model();  // the weights as mixed after the last update
  // A detached state's host copies made current, the momentum's among them.
  state_->to_host(kernels::kParams | kernels::kBuffers | kernels::kVelocity);
  s.step = step_;
  s.lr_scale = lr_scale_;
  s.dropout_step = train_exec_ ? train_exec_->dropout_step() : 0;
  s.sgd_started = sgd_.started();
  // States leave the run in the plain layout (files, other ranks, other CPUs read them).
  s.params = net_.plain(store().params.data());
  s.buffers = store().buffers;
  s.delayed_delta.clear();
  start_model_exchange();  // the state holds the correction of the last update's exchange
  // The momentum's correction is applied now: nothing reads or moves the momentum before the next
  // update, so the numbers are those of an uninterrupted run.
  if (momentum_exchange_ && c_.gossip.overlap_model) {
    momentum_exchange_->finish_delayed();
    store_written(kernels::kVelocity);
  }
  s.velocity = net_.plain(sgd_.velocity().data());
  if (model_exchange_ && c_.gossip.overlap_model) {
    s.delayed_delta = model_exchange_->delayed_delta();
    if (!s.delayed_delta.empty()) s.delayed_delta = net_.plain(s.delayed_delta.data());
  }
  // After the settling above: it may have measured the pending exchange.
  s.consensus_distance = model_exchange_ ? model_exchange_->distance() : 0;
  s.rank = world_.rank();
  s.ranks = world_.size();
  s.parts.clear();
  const StateLayout layout = state_layout();
  for (const auto& [name, e] : named_exchanges()) {
    const size_t first = s.parts.size();
    e->save_state(s.parts, layout);
    for (size_t i = first; i < s.parts.size(); ++i) s.parts[i].exchange = name;
  }
}

std::vector<std::pair<std::string, BucketExchange*>> Trainer::named_exchanges() const {
  std::vector<std::pair<std::string, BucketExchange*>> all;
  if (exchange_) all.emplace_back(kGradientExchange, exchange_.get());
  if (model_exchange_) all.emplace_back(kWeightExchange, model_exchange_.get());
  if (momentum_exchange_) all.emplace_back(kMomentumExchange, momentum_exchange_.get());
  return all;
}

StateLayout Trainer::state_layout() const {
  return {[this](const float* v, int64_t) { return net_.plain(v); },
          [this](const std::vector<float>& v) { return net_.from_plain(v); }};
}

int64_t Trainer::unreported_bytes() const {
  if (algorithm_.allreduce) return 0;
  int64_t sent = 0;
  for (const BucketExchange* e : exchanges()) sent += e->bytes_sent();
  return sent - sent_bytes_;
}

void Trainer::restore_model(const RankState& s) {
  if (static_cast<int64_t>(s.params.size()) != store().params.size() ||
      static_cast<int64_t>(s.buffers.size()) != store().buffers.size() ||
      s.velocity.size() != sgd_.velocity().size())
    throw std::invalid_argument("the saved state does not fit this model");
  // A weight exchange due or in flight completes (its partner waits for it) and is then replaced.
  start_model_exchange();
  if (c_.gossip.pipeline_weights) flush_model();
  if (momentum_exchange_ && c_.gossip.overlap_model) momentum_exchange_->finish_delayed();
  if (model_exchange_ && c_.gossip.overlap_model)
    model_exchange_->set_delayed_delta(s.delayed_delta.empty() ? s.delayed_delta
                                                               : net_.from_plain(s.delayed_delta));
  if (model_exchange_) model_exchange_->restore_distance(s.consensus_distance);
  // What the exchanges keep (state_part.hpp) is this rank's own: a state of another rank (a
  // rollback's donor, a survivor's under supervise, an average over another rank count) brings
  // none, and every exchange starts again from nothing (what rounding still owed would be paid
  // twice; what a pair shares names its peers by rank in this group). A part of an algorithm this
  // run does not use is left unread, and one this run uses but the state lacks starts from nothing.
  const bool own = own_state(s);
  const StateLayout layout = state_layout();
  for (const auto& [name, e] : named_exchanges()) {
    std::vector<StatePart> mine;
    if (own)
      for (const StatePart& p : s.parts)
        if (p.exchange == name) mine.push_back(p);
    e->load_state(mine, layout);
  }
  net_.from_plain(s.params, store().params.data());
  // A correction pending in a state of an overlapped run, restored by a run that does not overlap
  // (or sends no weights): the pair average it completes is applied now, before the next forward.
  if (!s.delayed_delta.empty() && !(model_exchange_ && c_.gossip.overlap_model))
    apply_correction({store().params.data(), static_cast<size_t>(store().params.size())},
                     net_.from_plain(s.delayed_delta));
  std::copy(s.buffers.begin(), s.buffers.end(), store().buffers.begin());
  net_.from_plain(s.velocity, sgd_.velocity().data());
  sgd_.set_started(s.sgd_started);
  store_written();
}

bool Trainer::own_state(const RankState& s) const {
  return s.ranks == world_.size() && s.rank == world_.rank();
}

void Trainer::resume_at(int64_t step, uint64_t dropout_step, int64_t unreported_bytes) {
  step_ = step;
  sent_bytes_ -= unreported_bytes;  // counted by the first step, as in an uninterrupted run
  if (train_exec_) train_exec_->set_dropout_step(dropout_step);
  set_first_step(step);
}

void Trainer::forget_peers(const std::vector<int>& lost) {
  if (lost.empty()) return;
  for (BucketExchange* e : exchanges()) e->forget_peers(lost);
}

void Trainer::rewind(const RankState& s) {
  restore_model(s);
  const int64_t back = step_ - s.step;
  if (exchange_) exchange_->repeat_steps(back);
  for (WeightExchange* e : after_update())
    e->repeat_steps(cadence_.round(step_) - cadence_.round(s.step));
  step_ = s.step;
  if (train_exec_) train_exec_->set_dropout_step(s.dropout_step);
}

void Trainer::load_initial_weights() {
  // Rank 0 reads the file; its verdict is shared so that every rank fails the same way.
  mpi::RankError error;
  if (world_.rank() == 0) {
    try {
      kernels::load_weights(c_.train.init_from, net_.graph(), net_.store());
    } catch (const std::invalid_argument& e) {  // weights that do not fit the model
      error = {std::string("train.init_from: ") + e.what(), true};
    } catch (const std::exception& e) {  // an unreadable file
      error = {std::string("train.init_from: ") + e.what(), false};
    }
  }
  throw_agreed(world_, error);
}

}  // namespace gg::gossip
