// `gossipgrad simulate`: the step time and efficiency a config would reach at many rank counts,
// from partners/cost_model with the config's network, model buckets and compute per step.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <sstream>
#include <thread>
#include <utility>

#include "gossip/cli/commands.hpp"
#include "gossip/config/config.hpp"
#include "gossip/train/trainer.hpp"
#include "kernels/loss.hpp"
#include "kernels/models.hpp"
#include "kernels/net.hpp"
#include "kernels/optimizer.hpp"
#include "partners/cost_model.hpp"

namespace gg::gossip {
namespace {

using Clock = std::chrono::steady_clock;

std::vector<int> parse_ranks(const std::string& list) {
  std::vector<int> out;
  std::stringstream s(list);
  std::string item;
  while (std::getline(s, item, ',')) {
    size_t used = 0;
    int p = 0;
    try {
      p = std::stoi(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != item.size() || p < 1 || p > 65536)
      throw UsageError("--ranks " + list + ": '" + item +
                       "' is not a rank count in [1, 65536] (give a list like 2,4,8)");
    out.push_back(p);
  }
  if (out.empty()) throw UsageError("--ranks needs a list of rank counts, like 2,4,8");
  return out;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Forward, backward and update times of one rank, measured here: median of a few steps after a
// warm-up, on synthetic inputs.
void measure(const Config& c, const kernels::ModelSpec& spec, partners::Workload& w) {
  // As the trainer would run here: the cores shared by the ranks of a node.
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int threads =
      c.train.threads > 0 ? c.train.threads : std::max(1, cores / c.network.ranks_per_node);
  omp_set_num_threads(threads);
  if (precision_of(c) == kernels::Precision::Bf16 && backend_of(c) == kernels::Backend::OneDnn &&
      !kernels::bf16_supported())
    throw UsageError(
        "simulate measures the compute here: train.precision = bf16 needs a CPU with AVX512_BF16 "
        "(or AMX); give the target's [simulate] forward_ms, backward_ms and update_ms, or use "
        "fp32");
  kernels::Net net(kernels::build_model(spec), c.train.backend,
                   std::max<int64_t>(1, c.gossip.bucket_kb * 256), c.train.precision);
  kernels::init_params(net.graph(), net.store(), c.train.seed);
  kernels::Sgd sgd(net.graph().param_count(), {0.9f, 1e-4f, false});
  kernels::Executor& ex = net.at_batch(c.train.batch);
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  std::vector<float> x(c.train.batch * kernels::numel(spec.input));
  for (float& v : x) v = normal(rng);
  std::vector<int32_t> y(c.train.batch);
  for (auto& v : y) v = static_cast<int32_t>(rng() % spec.classes);
  std::vector<float> dz(c.train.batch * spec.classes);
  std::vector<double> f, b, u;
  for (int s = 0; s < 5; ++s) {
    const auto t0 = Clock::now();
    const float* z = ex.forward(x.data(), true);
    kernels::softmax_cross_entropy(z, y.data(), c.train.batch, spec.classes, dz.data());
    const auto t1 = Clock::now();
    ex.backward(dz.data(), {});
    const auto t2 = Clock::now();
    sgd.step(net.store().params.data(), net.store().grads.data(), 0.01f);
    const auto t3 = Clock::now();
    if (s < 2) continue;  // warm-up
    f.push_back(std::chrono::duration<double>(t1 - t0).count());
    b.push_back(std::chrono::duration<double>(t2 - t1).count());
    u.push_back(std::chrono::duration<double>(t3 - t2).count());
  }
  w.forward_s = median(f);
  w.backward_s = median(b);
  w.update_s = median(u);
  std::fprintf(stderr, "simulate: measured %s batch %lld here with %d threads\n", spec.name.c_str(),
               static_cast<long long>(c.train.batch), threads);
}

nlohmann::json to_json(const partners::StepPrediction& s) {
  return {{"step_s", s.step_s},
          {"exposed_s", s.exposed_s},
          {"comm_s", s.comm_s},
          {"efficiency", s.efficiency},
          {"images_per_s", s.images_per_s}};
}

// What the command line asks for: the rank counts, the config's own options, and how to print.
struct SimulateRequest {
  std::vector<int> ranks;
  std::vector<std::string> config_args;  // --config FILE --section.key value ...
  bool json = false;
};

constexpr const char* kSimulateHelp =
    "usage: gossipgrad simulate --config FILE --ranks 2,4,...,4096 [--json] "
    "[--section.key value ...]\n\n"
    "Predicts the step time and efficiency of gossip and of ring and Rabenseifner "
    "allreduce at each rank count, from the config's [network] (alpha-beta-gamma "
    "links), its model's gradient buckets, the exact partner schedule and the "
    "trainer's overlap rules. Compute per step comes from [simulate] forward_ms, "
    "backward_ms, update_ms, or is measured here when they are 0. gossip.wire (the "
    "gradients') and gossip.model_wire (the weights') bf16, int8 or int4 send the bytes "
    "those wires send (allreduce in fp32, as MPI and DDP send them); gossipgrad "
    "sends the momentum too; gossip.overlap_model = false exchanges the weights after the "
    "update, exposed; gossip.global_every H adds an fp32 allreduce of the weights every H "
    "steps.\n"
    "Efficiency = compute time / step time (weak scaling, per rank).\n";

// The request, or nothing after printing --help. --ranks and --json are simulate's own; the rest
// goes to the config parser.
std::optional<SimulateRequest> parse_simulate_args(const std::vector<std::string>& args) {
  SimulateRequest r;
  std::string ranks_arg;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--help" || args[i] == "-h") {
      std::cout << kSimulateHelp;
      return std::nullopt;
    }
    if (args[i] == "--json") {
      r.json = true;
    } else if (args[i] == "--ranks") {
      if (i + 1 >= args.size()) throw UsageError("--ranks needs a list of rank counts, like 2,4,8");
      ranks_arg = args[++i];
    } else if (args[i].rfind("--ranks=", 0) == 0) {
      ranks_arg = args[i].substr(8);
    } else {
      r.config_args.push_back(args[i]);
    }
  }
  if (ranks_arg.empty()) throw UsageError("simulate needs --ranks, like --ranks 2,4,8,16");
  r.ranks = parse_ranks(ranks_arg);
  return r;
}

// Whether [simulate] gives the compute per step; it is measured here otherwise.
bool compute_from_config(const Config& c) {
  return c.simulate.forward_ms > 0 || c.simulate.backward_ms > 0;
}

// One rank's step: the model's gradient buckets and its compute times.
partners::Workload make_workload(const Config& c, const kernels::ModelSpec& spec,
                                 const kernels::Graph& g) {
  partners::Workload w;
  w.batch_per_rank = c.train.batch;
  // The gradient buckets in fp32 (allreduce's; gossip's lossy wires are in the GossipMode).
  for (const kernels::Bucket& b :
       kernels::make_buckets(g, std::max<int64_t>(1, c.gossip.bucket_kb * 256)))
    w.bucket_bytes.push_back(b.size() * 4);
  if (compute_from_config(c)) {
    w.forward_s = c.simulate.forward_ms * 1e-3;
    w.backward_s = c.simulate.backward_ms * 1e-3;
    w.update_s = c.simulate.update_ms * 1e-3;
  } else {
    measure(c, spec, w);
  }
  return w;
}

partners::Network make_network(const Config& c) {
  partners::Network net;
  net.inter_latency_s = c.network.inter_latency_us * 1e-6;
  net.inter_bandwidth_Bps = c.network.inter_bandwidth_gbs * 1e9;
  net.intra_latency_s = c.network.intra_latency_us * 1e-6;
  net.intra_bandwidth_Bps = c.network.intra_bandwidth_gbs * 1e9;
  net.mix_bandwidth_Bps = c.network.mix_bandwidth_gbs * 1e9;
  net.ranks_per_node = c.network.ranks_per_node;
  return net;
}

// What every rank count shares: the config, one rank's step, the network and the gossip.
struct Scenario {
  const Config& c;
  const partners::Workload& w;
  const partners::Network& net;
  partners::Kind kind;
  partners::GossipMode mode;
};

// The predictions at one rank count, as JSON and as a line of the table.
struct Row {
  nlohmann::json json;
  std::string line;
};

// "step ms  efficiency" cells of gossip (dashes where it does not run), ring and Rabenseifner,
// and the images per second of gossip, or of the ring where gossip does not run.
std::string table_line(int p, const partners::StepPrediction* gossip,
                       const partners::StepPrediction& ring, const partners::StepPrediction& rab) {
  char cells[3][64];
  if (gossip)
    std::snprintf(cells[0], sizeof cells[0], "%10.2f %7.2f%%", gossip->step_s * 1e3,
                  gossip->efficiency * 100);
  else
    std::snprintf(cells[0], sizeof cells[0], "%10s %8s", "-", "-");
  std::snprintf(cells[1], sizeof cells[1], "%10.2f %7.2f%%", ring.step_s * 1e3,
                ring.efficiency * 100);
  std::snprintf(cells[2], sizeof cells[2], "%10.2f %7.2f%%", rab.step_s * 1e3,
                rab.efficiency * 100);
  char line[256];
  std::snprintf(line, sizeof line, "%6d  %s  %s  %s  %12.0f", p, cells[0], cells[1], cells[2],
                gossip ? gossip->images_per_s : ring.images_per_s);
  return line;
}

// Gossip (from 2 ranks on, unless the config trains with allreduce), ring and Rabenseifner
// allreduce at p ranks.
Row predict_row(const Scenario& sc, int p) {
  Row row{{{"ranks", p}}, ""};
  partners::StepPrediction gossip;
  const bool gossips = p >= 2 && !mixing_of(sc.c).allreduce;
  if (gossips) {
    partners::Schedule s{sc.kind, p, sc.c.gossip.rotate, static_cast<uint64_t>(sc.c.train.seed)};
    try {
      partners::validate(s);
    } catch (const std::invalid_argument& e) {
      throw UsageError("--ranks " + std::to_string(p) + ": " + e.what());
    }
    gossip = partners::predict_gossip(s, sc.mode, sc.net, sc.w, sc.c.simulate.steps);
    row.json["gossip"] = to_json(gossip);
  }
  const auto ring = partners::predict_allreduce(partners::Method::RingAllreduce, p, sc.net, sc.w);
  const auto rab =
      partners::predict_allreduce(partners::Method::RabenseifnerAllreduce, p, sc.net, sc.w);
  row.json["ring_allreduce"] = to_json(ring);
  row.json["rabenseifner_allreduce"] = to_json(rab);
  row.line = table_line(p, gossips ? &gossip : nullptr, ring, rab);
  return row;
}

void print_simulate_json(const Scenario& sc, const kernels::ModelSpec& spec,
                         const kernels::Graph& g, const std::vector<Row>& rows) {
  nlohmann::json list = nlohmann::json::array();
  for (const Row& r : rows) list.push_back(r.json);
  nlohmann::json out = {{"model", spec.name},
                        {"params", g.param_count()},
                        {"batch_per_rank", sc.c.train.batch},
                        {"gradient_bytes", sc.w.total_bytes()},
                        {"buckets", sc.w.bucket_bytes.size()},
                        {"gossip_mode", sc.c.gossip.mode},
                        {"overlap_model", sc.mode.overlap_model},
                        {"global_every", sc.mode.global_every},
                        {"schedule", sc.c.gossip.schedule},
                        {"compute",
                         {{"forward_s", sc.w.forward_s},
                          {"backward_s", sc.w.backward_s},
                          {"update_s", sc.w.update_s},
                          {"source", compute_from_config(sc.c) ? "config" : "measured"}}},
                        {"network",
                         {{"inter_latency_s", sc.net.inter_latency_s},
                          {"inter_bandwidth_Bps", sc.net.inter_bandwidth_Bps},
                          {"intra_latency_s", sc.net.intra_latency_s},
                          {"intra_bandwidth_Bps", sc.net.intra_bandwidth_Bps},
                          {"mix_bandwidth_Bps", sc.net.mix_bandwidth_Bps},
                          {"ranks_per_node", sc.net.ranks_per_node}}},
                        {"rows", list}};
  std::cout << out.dump() << "\n";
}

void print_simulate_table(const Scenario& sc, const kernels::ModelSpec& spec,
                          const kernels::Graph& g, const std::vector<Row>& rows) {
  const Config& c = sc.c;
  std::printf("%s: %lld parameters, %.1f MB of gradients in %zu buckets, batch %lld per rank\n",
              spec.name.c_str(), static_cast<long long>(g.param_count()), sc.w.total_bytes() / 1e6,
              sc.w.bucket_bytes.size(), static_cast<long long>(c.train.batch));
  std::printf("compute per step (%s): forward %.2f ms, backward %.2f ms, update %.2f ms\n",
              compute_from_config(c) ? "from the config" : "measured here", sc.w.forward_s * 1e3,
              sc.w.backward_s * 1e3, sc.w.update_s * 1e3);
  std::printf(
      "network: between nodes %.2f us, %.2f GB/s per node; within %.2f us, %.2f GB/s; mixing "
      "%.1f GB/s; %d ranks per node\n",
      c.network.inter_latency_us, c.network.inter_bandwidth_gbs, c.network.intra_latency_us,
      c.network.intra_bandwidth_gbs, c.network.mix_bandwidth_gbs, c.network.ranks_per_node);
  std::string extra;
  if (sc.mode.model) extra += sc.mode.overlap_model ? ", weights overlapped" : ", weights exposed";
  if (sc.mode.global_every > 0)
    extra += ", a global average every " + std::to_string(sc.mode.global_every) + " steps";
  std::printf("gossip: mode %s, %s schedule%s%s, mean of %d steps\n\n", c.gossip.mode.c_str(),
              text_of(c.gossip.schedule).c_str(), c.gossip.rotate ? " with rotation" : "",
              extra.c_str(), c.simulate.steps);
  std::printf("%6s  %10s %8s  %10s %8s  %10s %8s  %12s\n", "ranks", "gossip ms", "eff", "ring ms",
              "eff", "rabens. ms", "eff", "img/s");
  for (const Row& r : rows) std::printf("%s\n", r.line.c_str());
}

// What the cost model does not model is refused rather than predicted as if it were not set.
void refuse_unmodelled(const Config& c) {
  const Config d;
  const std::pair<bool, std::string> unmodelled[] = {
      {c.gossip.staleness != d.gossip.staleness, "gossip.staleness = 1"},
      {c.gossip.hierarchy != d.gossip.hierarchy,
       "gossip.hierarchy = " + text_of(c.gossip.hierarchy)},
      {c.gossip.model_every != d.gossip.model_every,
       "gossip.model_every = " + std::to_string(c.gossip.model_every)},
      {c.gossip.pipeline_weights != d.gossip.pipeline_weights,
       "gossip.pipeline_weights = true (its cost model has no per-layer forward)"},
      {c.gossip.low_rank != d.gossip.low_rank,
       "gossip.low_rank = " + std::to_string(c.gossip.low_rank) +
           " (its messages follow each layer's shape, not the buckets' bytes)"},
      {c.gossip.transport != d.gossip.transport,
       "gossip.transport = " + text_of(c.gossip.transport) +
           " (its network is bandwidth and latency alone)"},
      {c.gossip.threading != d.gossip.threading,
       "gossip.threading = " + text_of(c.gossip.threading) +
           " (one exchange at a time, as funneled)"},
      {c.train.virtual_ranks != d.train.virtual_ranks,
       "train.virtual_ranks (it predicts real ranks: --ranks gives their counts)"},
      {c.gossip.consensus_bound != d.gossip.consensus_bound,
       "gossip.consensus_bound (when it averages depends on the training: give gossip.global_every "
       "= the steps between the averages of a training run, its summary's consensus_averages, "
       "instead)"}};
  for (const auto& [set, what] : unmodelled)
    if (set)
      throw UsageError("simulate does not model " + what +
                       " (its cost model: staleness 0, no hierarchy, every step's exchange); leave "
                       "it out of the simulated config");
}

}  // namespace

int cmd_simulate(const std::vector<std::string>& args) {
  const std::optional<SimulateRequest> r = parse_simulate_args(args);
  if (!r) return 0;
  const Config c = parse_train_args(r->config_args);  // another cluster's: no check of this machine
  refuse_unmodelled(c);
  const kernels::ModelSpec spec = usual_model_spec(c, 0);
  const kernels::Graph g = kernels::build_model(spec);
  const partners::Workload w = make_workload(c, spec, g);
  const partners::Network net = make_network(c);
  const Algorithm& a = mixing_of(c);
  partners::GossipMode mode{a.grads, a.weights, a.momentum, c.gossip.overlap_model};
  const auto wire = [](Wire kind) -> std::function<int64_t(int64_t)> {
    return [kind](int64_t bytes) { return wire_floats(kind, bytes / 4) * 4; };
  };
  mode.grad_wire = wire(c.gossip.wire);
  mode.model_wire = wire(c.gossip.model_wire);
  if (c.gossip.global_every > 0) {  // weights and statistics in fp32, as the trainer averages them
    mode.global_every = c.gossip.global_every;
    mode.global_bytes = (g.param_count() + g.buffer_count()) * 4;
  }
  const Scenario sc{c, w, net, c.gossip.schedule, mode};
  std::vector<Row> rows;
  for (int p : r->ranks) rows.push_back(predict_row(sc, p));
  if (r->json)
    print_simulate_json(sc, spec, g, rows);
  else
    print_simulate_table(sc, spec, g, rows);
  return 0;
}

}  // namespace gg::gossip
