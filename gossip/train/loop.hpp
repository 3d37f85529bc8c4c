// The whole `gossipgrad train` job: data, the training loop with its hooks (progress, evaluation
// and checkpoints, NaN guard, apoptosis, simulated failures), and the final summary.
#pragma once

#include <cstdint>

#include "gossip/comm/mpi.hpp"
#include "gossip/config/config.hpp"

namespace gg::gossip {

struct RunSummary {
  // The test accuracy of the last evaluation, after step eval_step (-1: never evaluated, e.g.
  // stopped within the first epoch or no evaluation data: reported as "not evaluated", null).
  double final_top1 = 0;
  double final_top5 = 0;
  int64_t eval_step = -1;
  double wall_seconds = 0;
  double images_per_second = 0;  // training images of all ranks per second of training
  int64_t steps = 0;
  int64_t skipped_samples = 0;  // failed to decode
};

// Trains as the config says, on every rank of `world` (a collective); progress and metrics on
// rank 0. Throws UsageError for what the user must change, std::runtime_error otherwise.
RunSummary run_training(const Config& c, const mpi::Comm& world);

}  // namespace gg::gossip
