// Run under mpirun with P ranks: P ranks training with allreduce on their slices of a global
// batch must follow the same trajectory as one process training on the whole global batch.
// Batch norm is off: with it, each rank normalises over its own slice (as in PyTorch DDP), which
// is a different computation from one batch norm over the global batch.
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "gossip/comm/mpi.hpp"
#include "gossip/train/trainer.hpp"

using namespace gg;

int main(int argc, char** argv) {
  mpi::Environment env(&argc, &argv);
  const mpi::Comm world = mpi::Comm::world();
  const mpi::Comm self = mpi::Comm::self();
  const int rank = world.rank(), p = world.size();
  const int64_t local = 3, global = local * p, steps = 6, classes = 10;
  const kernels::Dims input{1, 12, 12};
  const int64_t sample = kernels::numel(input);

  gossip::Config c;
  c.model.name = "resnet8";
  c.model.width = 4;
  c.model.batch_norm = false;
  c.train.backend = kernels::Backend::OneDnn;
  c.train.lr = 0.4;
  c.train.base_batch = 64;
  c.train.momentum = 0.9;
  c.train.weight_decay = 5e-4;
  c.train.warmup_epochs = 0;
  c.train.eval_batch = 4;
  c.gossip.mode = "allreduce";
  c.gossip.bucket_kb = 1;  // several buckets, so the overlap path is exercised
  c.train.batch = local;
  gossip::Config single = c;
  single.train.batch = global;

  gossip::Trainer dist(c, world, input, classes, steps, steps);
  gossip::Trainer one(single, self, input, classes, steps, steps);
  const std::vector<float> init = one.store().params;

  std::mt19937 rng(12345);  // same stream on every rank
  std::normal_distribution<float> normal;
  std::vector<float> x(global * sample);
  std::vector<int32_t> y(global);
  for (int64_t s = 0; s < steps; ++s) {
    for (float& v : x) v = normal(rng);
    for (int32_t& v : y) v = static_cast<int32_t>(rng() % classes);
    dist.step(x.data() + rank * local * sample, y.data() + rank * local);
    one.step(x.data(), y.data());
  }

  double max_diff = 0, moved = 0;
  const auto& a = dist.store().params;
  const auto& b = one.store().params;
  for (int64_t i = 0; i < a.size(); ++i) {
    max_diff = std::max(max_diff, static_cast<double>(std::fabs(a[i] - b[i])));
    moved = std::max(moved, static_cast<double>(std::fabs(b[i] - init[i])));
  }
  world.allreduce_max(&max_diff, 1);
  const bool ok = max_diff <= 1e-5 && moved > 1e-2;
  if (rank == 0)
    std::printf(
        "p=%d: %lld params, %lld steps, max |allreduce - single| = %.3g, max change = %.3g: %s\n",
        p, static_cast<long long>(a.size()), static_cast<long long>(steps), max_diff, moved,
        ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}
