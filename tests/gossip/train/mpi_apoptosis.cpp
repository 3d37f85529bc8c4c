// Run under mpirun with P ranks. Apoptosis across ranks: every rank, holding its own weights,
// removes exactly the same units, namely those the mean of all ranks' scores picks; and training
// (gossip with windows in shared memory, and allreduce) goes on across a shrink, with the kept
// weights carried over bit for bit and every rank at the same architecture.
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "gossip/comm/mpi.hpp"
#include "gossip/train/apoptosis.hpp"
#include "gossip/train/trainer.hpp"
#include "kernels/apoptosis.hpp"
#include "kernels/models.hpp"

using namespace gg;
using gossip::PruneLayers;

namespace {

int failures = 0;

void check(bool ok, const std::string& what, int rank) {
  if (ok) return;
  ++failures;
  std::fprintf(stderr, "rank %d: FAILED: %s\n", rank, what.c_str());
}

std::string describe(const kernels::Removal& r) {
  std::string s;
  for (const auto& [node, units] : r) {
    s += std::to_string(node) + ":";
    for (int64_t u : units) s += std::to_string(u) + ",";
    s += ";";
  }
  return s;
}

// Whether every rank holds the same string as rank 0 (a collective).
bool same_everywhere(const mpi::Comm& world, const std::string& mine) {
  std::string root = mine;
  world.broadcast(root, 0);
  int64_t differ = root != mine;
  world.allreduce_sum(&differ, 1);
  return differ == 0;
}

kernels::Graph small_cnn() {
  kernels::ModelSpec m;
  m.name = "cnn";
  m.width = 4;
  m.input = {1, 12, 12};
  return kernels::build_model(m);
}

void agreement(const mpi::Comm& world) {
  const int rank = world.rank(), p = world.size();
  const kernels::Graph g = small_cnn();
  gossip::Config c;
  c.apoptosis.threshold = 0.9;
  c.apoptosis.max_share = 0.5;
  c.apoptosis.min_keep = 2;
  // Each rank its own weights.
  kernels::ParamStore own(g);
  kernels::init_params(g, own, 100 + rank);
  const kernels::Removal r = gossip::agree_removal(world, g, own.params, c);
  check(!r.empty(), "the rule removes some units", rank);
  check(same_everywhere(world, describe(r)), "every rank removes the same units", rank);
  // What the mean of every rank's scores picks, computed here from every rank's weights.
  const auto layers = gossip::apoptosis_layers(c, g);
  std::vector<std::vector<double>> mean;
  for (int q = 0; q < p; ++q) {
    kernels::ParamStore s(g);
    kernels::init_params(g, s, 100 + q);
    const auto n = kernels::outgoing_norms(g, s.params, layers);
    if (mean.empty()) mean.assign(n.size(), {});
    for (size_t i = 0; i < n.size(); ++i) {
      mean[i].resize(n[i].size(), 0.0);
      for (size_t u = 0; u < n[i].size(); ++u) mean[i][u] += n[i][u];
    }
  }
  for (auto& l : mean)
    for (double& v : l) v /= p;
  const kernels::Removal want = kernels::choose_removal(layers, mean, gossip::apoptosis_rule(c));
  check(describe(want) == describe(r), "the removal is the one the ranks' mean scores pick", rank);
  // Only fc1 for layers = fc.
  c.apoptosis.layers = PruneLayers::Fc;
  const kernels::Removal fc = gossip::agree_removal(world, g, own.params, c);
  check(fc.size() == 1 && g.node(fc.begin()->first).name == "fc1", "layers = fc: only fc1", rank);
}

void training_across_a_shrink(const mpi::Comm& world, const std::string& mode) {
  const int rank = world.rank();
  const kernels::Dims input{1, 12, 12};
  const int64_t classes = 10, batch = 6, steps = 12;
  gossip::Config c;
  c.model.name = "cnn";
  c.model.width = 4;
  c.train.batch = batch;
  c.train.lr = 0.05;
  c.train.base_batch = 16;
  c.train.warmup_epochs = 0;
  c.train.eval_batch = 4;
  c.gossip.mode = mode;
  c.gossip.overlap_model = false;  // nothing pending: the shrink carries weights over as they are
  c.gossip.bucket_kb = 1;          // several buckets
  c.gossip.consensus_every = 0;
  c.apoptosis.threshold = 0.9;
  c.apoptosis.max_share = 0.5;
  c.apoptosis.min_keep = 2;
  gossip::Trainer t(c, world, input, classes, 2 * steps, steps);

  std::mt19937 rng(7 + rank);  // each rank its own data
  std::normal_distribution<float> normal;
  std::vector<float> x(batch * kernels::numel(input));
  std::vector<int32_t> y(batch);
  const auto train = [&](int64_t n) {
    double loss = 0;
    for (int64_t s = 0; s < n; ++s) {
      for (float& v : x) v = normal(rng);
      for (int32_t& v : y) v = static_cast<int32_t>(rng() % classes);
      // A learnable signal: the label shifts the mean of the image.
      for (int64_t b = 0; b < batch; ++b)
        for (int64_t i = 0; i < 144; ++i) x[b * 144 + i] += 0.3f * static_cast<float>(y[b] - 4.5f);
      loss = t.step(x.data(), y.data()).loss;
    }
    return loss;
  };
  train(steps);
  const kernels::Graph before = t.graph();
  const std::vector<float> params = t.store().params, buffers = t.store().buffers;
  const kernels::Removal r = gossip::agree_removal(world, before, params, c);
  const kernels::Shrink plan = kernels::plan_shrink(before, r);
  const gossip::ApoptosisReport rep = t.apoptosis();
  const std::string tag = " (" + mode + ")";
  check(rep.params_before == before.param_count() && rep.params_after < rep.params_before,
        "the report counts fewer parameters" + tag, rank);
  check(t.graph().param_count() == plan.graph.param_count(), "the trainer's graph is shrunk" + tag,
        rank);
  check(t.store().params == plan.params(params), "kept weights carried over bit for bit" + tag,
        rank);
  check(t.store().buffers == plan.buffers(buffers), "kept running statistics carried over" + tag,
        rank);
  check(static_cast<int64_t>(t.store().grads.size()) == plan.graph.param_count(),
        "the gradient buffer has the new size" + tag, rank);
  check(same_everywhere(world, std::to_string(t.graph().param_count())),
        "every rank has the same architecture" + tag, rank);
  const double loss = train(steps);
  check(std::isfinite(loss) && loss < 5.0, "training goes on after the shrink" + tag, rank);
  if (mode == "allreduce") {
    // Ranks that start equal stay equal under allreduce, across the shrink too.
    std::vector<float> avg = t.store().params;
    world.allreduce_sum(avg.data(), static_cast<int64_t>(avg.size()));
    double worst = 0;
    for (size_t i = 0; i < avg.size(); ++i)
      worst = std::max(worst,
                       std::fabs(static_cast<double>(avg[i]) / world.size() - t.store().params[i]));
    check(worst < 1e-5, "allreduce keeps the ranks' weights equal across a shrink", rank);
  }
  // A second decision on the shrunk network works as well.
  t.apoptosis();
  check(std::isfinite(train(2)), "a second shrink" + tag, rank);
}

}  // namespace

int main(int argc, char** argv) {
  mpi::Environment env(&argc, &argv);
  const mpi::Comm world = mpi::Comm::world();
  try {
    agreement(world);
    training_across_a_shrink(world, "both");
    training_across_a_shrink(world, "allreduce");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", world.rank(), e.what());
    return 1;
  }
  int64_t total = failures;
  world.allreduce_sum(&total, 1);
  if (world.rank() == 0)
    std::printf("apoptosis under mpirun (p=%d): %s\n", world.size(), total == 0 ? "ok" : "FAILED");
  return total == 0 ? 0 : 1;
}
