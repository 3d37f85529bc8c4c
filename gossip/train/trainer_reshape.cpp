// Trainer, changing the network's shape: apoptosis removes units (agreed by every rank), a resume
// of a checkpoint taken after a shrink rebuilds the shrunk widths. The network, momentum,
// executors and exchanges are rebuilt alike on every rank (a collective).

#include <chrono>
#include <utility>
#include <vector>

#include "gossip/train/apoptosis.hpp"
#include "gossip/train/trainer.hpp"

namespace gg::gossip {

ApoptosisReport Trainer::apoptosis() {
  const auto t0 = std::chrono::steady_clock::now();
  flush_model();  // scores from the weights as they are after the last update
  ApoptosisReport rep;
  rep.step = step_;
  rep.params_before = graph().param_count();
  const kernels::Removal r = agree_removal(world_, graph(), net_.plain(store().params.data()), c_);
  for (const auto& [node, units] : r)
    rep.removed[graph().node(node).name] = static_cast<int64_t>(units.size());
  shrink(r);
  rep.params_after = graph().param_count();
  for (const kernels::PrunableLayer& l : apoptosis_layers(c_, graph()))
    rep.widths[graph().node(l.node).name] = l.units;
  rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return rep;
}

void Trainer::shrink(const kernels::Removal& r) {
  if (r.empty()) return;
  flush_model();  // a pending weight exchange belongs to the old layout
  const kernels::Shrink s = kernels::plan_shrink(graph(), r);
  state_->to_host(kernels::kVelocity);  // store() below makes the rest current
  std::vector<float> params = s.params(net_.plain(store().params.data()));
  std::vector<float> buffers = s.buffers(store().buffers);
  std::vector<float> velocity = s.params(net_.plain(sgd_.velocity().data()));
  rebuild(s.graph, std::move(params), std::move(buffers), std::move(velocity));
}

void Trainer::rebuild(kernels::Graph g, std::vector<float> params, std::vector<float> buffers,
                      std::vector<float> velocity) {
  const uint64_t dropout_step = train_exec_->dropout_step();
  // The exchanges go first, on every rank alike (freeing their windows is collective): the
  // gradient exchange owns the memory the gradients live in, the model exchange points at the
  // parameters about to be replaced.
  flush_model();   // a weight exchange still due goes out over the old layout first
  state_.reset();  // over the old executor; the caller took its host copies (store())
  exchange_.reset();
  model_exchange_.reset();
  momentum_exchange_.reset();
  train_exec_ = eval_exec_ = nullptr;
  net_.rebuild(std::move(g), std::move(params), std::move(buffers));
  sgd_.set_velocity(net_.from_plain(velocity));  // in the rebuilt network's layout
  make_exchanges();
  train_exec_ = &net_.at_batch(c_.train.batch);
  train_exec_->set_dropout_step(dropout_step);
  make_state();
  attach_gate();
}

void Trainer::reshape(kernels::Graph g) {
  const auto params = static_cast<size_t>(g.param_count());
  const auto buffers = static_cast<size_t>(g.buffer_count());
  rebuild(std::move(g), std::vector<float>(params, 0.f), std::vector<float>(buffers, 0.f),
          std::vector<float>(params, 0.f));
}

}  // namespace gg::gossip
