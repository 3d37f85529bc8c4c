// Neuron apoptosis during distributed training: the ranks agree on the units to remove with one
// small collective (every rank's scores gathered, combined in rank order, so every rank holds the
// same bits and takes the same decision), then each rank shrinks its own model alike
// (Trainer::apoptosis). Also the metrics events of the decisions.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "gossip/comm/mpi.hpp"
#include "gossip/config/config.hpp"
#include "kernels/apoptosis.hpp"
#include "kernels/graph.hpp"

namespace gg::gossip {

// The decision rule and the layer kinds the [apoptosis] keys describe.
kernels::ApoptosisRule apoptosis_rule(const Config& c);
std::vector<kernels::PrunableLayer> apoptosis_layers(const Config& c, const kernels::Graph& g);

// Per prunable layer and unit, the mean over ranks of the outgoing-weight norms of each rank's
// own weights: one allgather of every rank's scores, summed in rank order on every rank.
// A collective.
std::vector<std::vector<double>> agreed_scores(const mpi::Comm& world, const kernels::Graph& g,
                                               const std::vector<float>& params,
                                               const std::vector<kernels::PrunableLayer>& layers);

// The units every rank removes now (choose_removal over agreed_scores). A collective.
kernels::Removal agree_removal(const mpi::Comm& world, const kernels::Graph& g,
                               const std::vector<float>& params, const Config& c);

struct ApoptosisReport {
  int64_t step = 0;  // optimizer steps done when it was decided
  int64_t params_before = 0;
  int64_t params_after = 0;
  std::map<std::string, int64_t> removed;  // units removed, by layer name (layers that lost some)
  std::map<std::string, int64_t> widths;   // units every prunable layer has now
  double seconds = 0;                      // deciding and rebuilding
};

// Metrics of the decisions: each decision becomes one {"event":"apoptosis",...} object once
// `settle` training steps of the shrunk model have run (or training ended), carrying the
// images/s of the steps since the previous decision (before) and of those settle steps (after).
class ApoptosisMetrics {
 public:
  explicit ApoptosisMetrics(int64_t settle) : settle_(settle) {}
  void decided(const ApoptosisReport& r);
  // One training step of `images` images (all ranks) took `seconds`; returns events now ready.
  std::vector<nlohmann::json> step(double seconds, int64_t images);
  std::vector<nlohmann::json> finish();  // the pending decision's event, if any

 private:
  nlohmann::json event() const;
  int64_t settle_;
  bool pending_ = false;
  ApoptosisReport report_;
  double before_images_ = 0, before_seconds_ = 0;  // since the previous decision
  double after_images_ = 0, after_seconds_ = 0;
  int64_t after_steps_ = 0;
  double last_images_per_s_ = 0;
};

}  // namespace gg::gossip
