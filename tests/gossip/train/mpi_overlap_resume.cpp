// Run under mpirun with P ranks: a rank state captured by an overlapped run (gossip.overlap_model)
// holds the weight exchange's correction apart from the weights. A trainer that overlaps takes it
// back as pending; one that does not overlap, or sends no weights, must apply it at once: the
// restored weights are the saved ones plus the correction, bit for bit (the pair average the
// exchange completed), not the saved weights alone.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "gossip/comm/mixing.hpp"
#include "gossip/comm/mpi.hpp"
#include "gossip/resilience/rank_state.hpp"
#include "gossip/train/trainer.hpp"

using namespace gg;

namespace {

const kernels::Dims kInput{1, 12, 12};
constexpr int64_t kClasses = 10, kSteps = 4;

gossip::Config config(const std::string& mode, bool overlap) {
  gossip::Config c;
  c.model.name = "resnet8";
  c.model.width = 4;
  c.train.backend = kernels::Backend::OneDnn;
  c.train.batch = 3;
  c.train.warmup_epochs = 0;
  c.train.eval_batch = 4;
  c.gossip.mode = mode;
  c.gossip.overlap_model = overlap;
  c.gossip.bucket_kb = 1;  // several buckets
  return c;
}

// The state after kSteps steps of an overlapped `model` run, every rank on its own data.
gossip::RankState overlapped_state(const mpi::Comm& world) {
  const gossip::Config c = config("model", true);  // the trainer keeps a reference
  gossip::Trainer t(c, world, kInput, kClasses, kSteps, kSteps);
  std::mt19937 rng(1000 + world.rank());
  std::normal_distribution<float> normal;
  std::vector<float> x(3 * kernels::numel(kInput));
  std::vector<int32_t> y(3);
  for (int64_t s = 0; s < kSteps; ++s) {
    for (float& v : x) v = normal(rng);
    for (int32_t& v : y) v = static_cast<int32_t>(rng() % kClasses);
    t.step(x.data(), y.data());
  }
  gossip::RankState s;
  t.capture_state(s);
  return s;
}

// The weights and pending correction a trainer of `mode` / `overlap` holds after restoring s.
gossip::RankState restored(const mpi::Comm& world, const gossip::RankState& s,
                           const std::string& mode, bool overlap) {
  const gossip::Config c = config(mode, overlap);
  gossip::Trainer t(c, world, kInput, kClasses, kSteps, kSteps);
  t.restore_model(s);
  gossip::RankState out;
  t.capture_state(out);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  mpi::Environment env(&argc, &argv);
  const mpi::Comm world = mpi::Comm::world();
  const gossip::RankState s = overlapped_state(world);
  bool ok = !s.delayed_delta.empty();
  double moved = 0;
  for (float d : s.delayed_delta) moved = std::max(moved, static_cast<double>(std::fabs(d)));
  ok = ok && moved > 0;  // a correction that changes the weights
  std::vector<float> mixed = s.params;
  if (ok) gossip::apply_correction(mixed, s.delayed_delta);

  // Overlapped: the weights as saved, the correction pending as saved.
  const gossip::RankState same = restored(world, s, "model", true);
  const bool pending = same.params == s.params && same.delayed_delta == s.delayed_delta;
  // Not overlapped, and a mode without weight exchange: the correction applied, none pending.
  const gossip::RankState off = restored(world, s, "model", false);
  const bool applied = off.params == mixed && off.delayed_delta.empty();
  const gossip::RankState none = restored(world, s, "allreduce", true);
  const bool applied_allreduce = none.params == mixed && none.delayed_delta.empty();

  double bad = ok && pending && applied && applied_allreduce ? 0 : 1;
  world.allreduce_max(&bad, 1);
  if (world.rank() == 0)
    std::printf(
        "p=%d: correction max |d| %.3g; overlapped restore keeps it pending: %s; restored "
        "without overlap: %s; by allreduce: %s: %s\n",
        world.size(), moved, pending ? "yes" : "no", applied ? "applied" : "NOT applied",
        applied_allreduce ? "applied" : "NOT applied", bad == 0 ? "PASS" : "FAIL");
  return bad == 0 ? 0 : 1;
}
