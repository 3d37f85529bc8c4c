#include "gossip/train/apoptosis.hpp"

#include <chrono>

#include "gossip/comm/wait_watch.hpp"
#include "gossip/train/trainer.hpp"

namespace gg::gossip {

kernels::ApoptosisRule apoptosis_rule(const Config& c) {
  kernels::ApoptosisRule r;
  r.relative = c.apoptosis.criterion == "relative_norm";
  r.threshold = c.apoptosis.threshold;
  r.max_share = c.apoptosis.max_share;
  r.min_keep = c.apoptosis.min_keep;
  return r;
}

std::vector<kernels::PrunableLayer> apoptosis_layers(const Config& c, const kernels::Graph& g) {
  return kernels::prunable_layers(g, c.apoptosis.layers != "fc", c.apoptosis.layers != "conv");
}

std::vector<std::vector<double>> agreed_scores(const mpi::Comm& world, const kernels::Graph& g,
                                               const std::vector<float>& params,
                                               const std::vector<kernels::PrunableLayer>& layers) {
  const auto own = kernels::outgoing_norms(g, params, layers);
  std::vector<double> flat;
  for (const auto& l : own) flat.insert(flat.end(), l.begin(), l.end());
  const int n = static_cast<int>(flat.size()), p = world.size();
  std::vector<double> all(static_cast<size_t>(n) * p);
  // Gathered rather than allreduced: MPI does not promise an allreduce's bits are the same on
  // every rank, and the decision must be.
  const mpi::WatchedWait wait("MPI_Allgather");
  GG_MPI_CHECK(MPI_Allgather(flat.data(), n, MPI_DOUBLE, all.data(), n, MPI_DOUBLE, world.get()));
  std::vector<std::vector<double>> mean(own.size());
  size_t at = 0;
  for (size_t i = 0; i < own.size(); ++i) {
    mean[i].assign(own[i].size(), 0.0);
    for (size_t u = 0; u < own[i].size(); ++u, ++at) {
      double sum = 0;
      for (int r = 0; r < p; ++r) sum += all[static_cast<size_t>(r) * n + at];
      mean[i][u] = sum / p;
    }
  }
  return mean;
}

kernels::Removal agree_removal(const mpi::Comm& world, const kernels::Graph& g,
                               const std::vector<float>& params, const Config& c) {
  const auto layers = apoptosis_layers(c, g);
  return kernels::choose_removal(layers, agreed_scores(world, g, params, layers),
                                 apoptosis_rule(c));
}

// Trainer members that concern apoptosis live here, next to the rest of it.

ApoptosisReport Trainer::apoptosis() {
  const auto t0 = std::chrono::steady_clock::now();
  flush_model();  // scores from the weights as they are after the last update
  ApoptosisReport rep;
  rep.step = step_;
  rep.params_before = graph().param_count();
  const kernels::Removal r = agree_removal(world_, graph(), store().params, c_);
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
  std::vector<float> params = s.params(store().params);
  std::vector<float> buffers = s.buffers(store().buffers);
  std::vector<float> velocity = s.params(sgd_.velocity());
  rebuild(s.graph, std::move(params), std::move(buffers), std::move(velocity));
}

void Trainer::rebuild(kernels::Graph g, std::vector<float> params, std::vector<float> buffers,
                      std::vector<float> velocity) {
  const uint64_t dropout_step = train_exec_->dropout_step();
  // The exchanges go first, on every rank alike (freeing their windows is collective): the
  // gradient exchange owns the memory the gradients live in, the model exchange points at the
  // parameters about to be replaced.
  exchange_.reset();
  model_exchange_.reset();
  train_exec_ = eval_exec_ = nullptr;
  net_.rebuild(std::move(g), std::move(params), std::move(buffers));
  sgd_.set_velocity(std::move(velocity));
  make_exchanges();
  train_exec_ = &net_.at_batch(c_.train.batch);
  eval_exec_ = &net_.at_batch(c_.train.eval_batch);
  train_exec_->set_dropout_step(dropout_step);
}

void Trainer::reshape(kernels::Graph g) {
  const auto params = static_cast<size_t>(g.param_count());
  const auto buffers = static_cast<size_t>(g.buffer_count());
  rebuild(std::move(g), std::vector<float>(params, 0.f), std::vector<float>(buffers, 0.f),
          std::vector<float>(params, 0.f));
}

void ApoptosisMetrics::decided(const ApoptosisReport& r) {
  report_ = r;
  pending_ = true;
  after_images_ = after_seconds_ = 0;
  after_steps_ = 0;
  last_images_per_s_ = before_seconds_ > 0 ? before_images_ / before_seconds_ : 0;
  before_images_ = before_seconds_ = 0;
}

nlohmann::json ApoptosisMetrics::event() const {
  nlohmann::json e = {{"event", "apoptosis"},
                      {"step", report_.step},
                      {"params_before", report_.params_before},
                      {"params", report_.params_after},
                      {"removed", report_.removed},
                      {"widths", report_.widths},
                      {"rebuild_s", report_.seconds},
                      {"images_per_s_before", last_images_per_s_}};
  e["images_per_s"] =
      after_seconds_ > 0 ? nlohmann::json(after_images_ / after_seconds_) : nlohmann::json(nullptr);
  e["images_per_s_steps"] = after_steps_;
  return e;
}

std::vector<nlohmann::json> ApoptosisMetrics::step(double seconds, int64_t images) {
  before_images_ += static_cast<double>(images);
  before_seconds_ += seconds;
  if (!pending_) return {};
  after_images_ += static_cast<double>(images);
  after_seconds_ += seconds;
  if (++after_steps_ < settle_) return {};
  pending_ = false;
  return {event()};
}

std::vector<nlohmann::json> ApoptosisMetrics::finish() {
  if (!pending_) return {};
  pending_ = false;
  return {event()};
}

}  // namespace gg::gossip
