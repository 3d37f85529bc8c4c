// Apoptosis across ranks (gossip/train/apoptosis.hpp): the rule from the config, and every rank's
// unit scores gathered so that all remove the same units.
#include "gossip/train/apoptosis.hpp"

#include <chrono>

namespace gg::gossip {

kernels::ApoptosisRule apoptosis_rule(const Config& c) {
  kernels::ApoptosisRule r;
  r.relative = apoptosis_relative(c);
  r.threshold = c.apoptosis.threshold;
  r.max_share = c.apoptosis.max_share;
  r.min_keep = c.apoptosis.min_keep;
  return r;
}

std::vector<kernels::PrunableLayer> apoptosis_layers(const Config& c, const kernels::Graph& g) {
  return kernels::prunable_layers(g, apoptosis_prunes_conv(c), apoptosis_prunes_fc(c));
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
  world.allgather(flat.data(), n, all.data());
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
