// gossipgrad: the command-line front end. Usage errors exit 2, runtime failures exit 1.
#include <algorithm>
#include <boost/program_options.hpp>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "gossip/config.hpp"
#include "gossip/mpi.hpp"
#include "gossip/pack_cmd.hpp"
#include "gossip/trainer.hpp"
#include "kernels/models.hpp"
#include "partners/schedule.hpp"
#include "partners/simulator.hpp"

namespace po = boost::program_options;
using gg::gossip::UsageError;

namespace {

constexpr const char* kUsage =
    "gossipgrad: data-parallel training with gossip SGD\n\n"
    "usage:\n"
    "  mpirun -n P gossipgrad train --config FILE [--section.key value ...]\n"
    "  gossipgrad info --model NAME [--input C,H,W] [--classes N] [--width W] [--json]\n"
    "  gossipgrad partners --ranks P [--schedule S] [--rotate] [--steps T] [--seed N] [--json]\n"
    "  gossipgrad pack --input DIR --output DIR [--shard-size MB] [--threads N] [--shuffle SEED]\n"
    "  gossipgrad help | --help | COMMAND --help\n\n"
    "commands:\n"
    "  train   train a model on this rank's share of the data (run under mpirun)\n"
    "  info    print a model's layers, parameter count and forward FLOPs\n"
    "  partners  print who talks to whom at each step, and how fast the schedule mixes\n"
    "  pack    image folder (ImageNet layout) -> tar shards for data.source = shards:DIR\n\n"
    "example: mpirun -n 2 gossipgrad train --config configs/laptop.ini\n";

gg::kernels::Dims parse_dims(const std::string& s) {
  gg::kernels::Dims d;
  std::stringstream in(s);
  std::string part;
  while (std::getline(in, part, ',')) {
    try {
      size_t used = 0;
      const long long v = std::stoll(part, &used);
      if (used != part.size() || v < 1) throw std::invalid_argument(part);
      d.push_back(v);
    } catch (const std::exception&) {
      throw UsageError("--input '" + s + "' must be three positive integers C,H,W");
    }
  }
  if (d.size() != 3) throw UsageError("--input '" + s + "' must be three positive integers C,H,W");
  return d;
}

int cmd_info(const std::vector<std::string>& args) {
  gg::kernels::ModelSpec spec;
  std::string input = "1,28,28";
  bool json = false;
  po::options_description d("info options");
  d.add_options()("help", "this help")("model", po::value(&spec.name)->required(),
                                       "model name (resnet8, cnn)")(
      "input", po::value(&input)->default_value(input), "sample dims C,H,W")(
      "classes", po::value(&spec.classes)->default_value(spec.classes), "output classes")(
      "width", po::value(&spec.width)->default_value(spec.width), "first-stage channels")(
      "json", po::bool_switch(&json), "print JSON");
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(args).options(d).run(), vm);
    if (vm.count("help")) {
      std::cout << "usage: gossipgrad info --model NAME [--json]\n\n" << d;
      return 0;
    }
    po::notify(vm);
  } catch (const po::error& e) {
    throw UsageError(e.what());
  }
  spec.input = parse_dims(input);
  gg::kernels::Graph g = [&] {
    try {
      return gg::kernels::build_model(spec);
    } catch (const std::invalid_argument& e) {
      throw UsageError(e.what());
    }
  }();
  const int64_t flops = 2 * g.forward_macs();
  if (json) {
    nlohmann::json layers = nlohmann::json::array();
    for (const auto& n : g.nodes()) {
      int64_t params = 0;
      for (int p : n.params) params += g.params()[p].size();
      layers.push_back({{"name", n.name},
                        {"op", gg::kernels::op_name(n.op)},
                        {"output", n.out},
                        {"params", params}});
    }
    std::cout << nlohmann::json{{"model", spec.name},
                                {"input", spec.input},
                                {"params", g.param_count()},
                                {"forward_flops", flops},
                                {"layers", layers}}
                     .dump(2)
              << "\n";
    return 0;
  }
  std::printf("%-24s %-16s %-16s %12s\n", "layer", "op", "output", "params");
  for (const auto& n : g.nodes()) {
    int64_t params = 0;
    for (int p : n.params) params += g.params()[p].size();
    std::printf("%-24s %-16s %-16s %12lld\n", n.name.c_str(), gg::kernels::op_name(n.op),
                gg::kernels::to_string(n.out).c_str(), static_cast<long long>(params));
  }
  std::printf("\n%s: %lld parameters, %.3f GFLOPs forward per sample\n", spec.name.c_str(),
              static_cast<long long>(g.param_count()), flops / 1e9);
  return 0;
}

// The step budget for the diffusion search: enough for every schedule at small P (a ring needs
// P - 1 steps), bounded by about 2^33 bitset word operations at large P so the command answers
// in seconds; -1 is reported beyond it.
int diffusion_search_limit(int p) {
  const int64_t words_per_step = int64_t{p} * ((p + 63) / 64);
  const int64_t by_work = (int64_t{1} << 33) / words_per_step;
  return static_cast<int>(
      std::min<int64_t>(100000, std::max<int64_t>(4 * gg::partners::round_length(p), by_work)));
}

int cmd_partners(const std::vector<std::string>& args) {
  namespace gp = gg::partners;
  int64_t ranks = 0;
  int64_t steps = 0;
  std::string kind = "dissemination";
  std::string seed_text = "1";
  bool rotate = false;
  bool json = false;
  po::options_description d("partners options");
  d.add_options()("help", "this help")("ranks", po::value(&ranks)->required(),
                                       "rank count P, 1..65536")(
      "schedule", po::value(&kind)->default_value(kind),
      "dissemination, hypercube (P a power of two), ring or random")(
      "rotate", po::bool_switch(&rotate), "permute the virtual ranks every ceil(log2 P) steps")(
      "steps", po::value(&steps), "steps to print, 1..100000 (default ceil(log2 P), at least 1)")(
      "seed", po::value(&seed_text)->default_value(seed_text),
      "seed of the rotation and of the random schedule")("json", po::bool_switch(&json),
                                                         "print JSON");
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(args).options(d).run(), vm);
    if (vm.count("help")) {
      std::cout << "usage: gossipgrad partners --ranks P [--schedule S] [--rotate] [--steps T] "
                   "[--seed N] [--json]\n\n"
                << d;
      return 0;
    }
    po::notify(vm);
  } catch (const po::error& e) {
    throw UsageError(e.what());
  }
  if (ranks < 1 || ranks > 65536)
    throw UsageError("--ranks " + std::to_string(ranks) + " must be in [1, 65536]");
  uint64_t seed = 0;
  try {
    size_t used = 0;
    if (seed_text.empty() || seed_text[0] == '-') throw std::invalid_argument(seed_text);
    seed = std::stoull(seed_text, &used);
    if (used != seed_text.size()) throw std::invalid_argument(seed_text);
  } catch (const std::exception&) {
    throw UsageError("--seed '" + seed_text + "' must be a non-negative integer");
  }
  gp::Schedule s;
  s.p = static_cast<int>(ranks);
  s.rotate = rotate;
  s.seed = seed;
  try {
    s.kind = gp::parse_kind(kind);
    gp::validate(s);
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
  if (!vm.count("steps"))
    steps = gp::round_length(s.p);
  else if (steps < 1 || steps > 100000)
    throw UsageError("--steps " + std::to_string(steps) + " must be in [1, 100000]");

  const int limit = diffusion_search_limit(s.p);
  const int diffusion = gp::diffusion_steps(s, limit);
  if (json) {
    // Streamed step by step: --ranks 65536 --steps 100000 must not build the document in memory.
    // Keys in the documented order, no others.
    std::cout << "{\"ranks\":" << s.p << ",\"schedule\":" << nlohmann::json(gp::kind_name(s.kind))
              << ",\"steps\":[";
    for (int64_t t = 0; t < steps; ++t) {
      nlohmann::json send = nlohmann::json::array(), recv = nlohmann::json::array();
      for (const gp::Partners& q : gp::step_partners(s, t)) {
        send.push_back(q.send_to);
        recv.push_back(q.recv_from);
      }
      std::cout << (t ? "," : "") << "{\"step\":" << t << ",\"send_to\":" << send.dump()
                << ",\"recv_from\":" << recv.dump() << "}";
    }
    std::cout << "],\"diffusion_steps\":" << diffusion << "}\n";
    return 0;
  }
  // Wide schedules keep the first 8 and the last 2 ranks so a row stays on one line.
  const bool trimmed = s.p > 12;
  std::printf("%s schedule, %d ranks, rotation %s, seed %llu\n", gp::kind_name(s.kind), s.p,
              rotate ? "on" : "off", static_cast<unsigned long long>(seed));
  if (trimmed) std::printf("(ranks 8..%d not shown)\n", s.p - 3);
  std::printf("%6s  rank->send_to\n", "step");
  for (int64_t t = 0; t < steps; ++t) {
    const std::vector<gp::Partners> who = gp::step_partners(s, t);
    std::string row;
    for (int v = 0; v < s.p; ++v) {
      if (trimmed && v == 8) {
        row += " ...";
        v = s.p - 3;
        continue;
      }
      char cell[32];
      std::snprintf(cell, sizeof cell, " %d->%d", v, who[v].send_to);
      row += cell;
    }
    std::printf("%6lld %s\n", static_cast<long long>(t), row.c_str());
  }
  const int round = gp::round_length(s.p);
  std::printf("\n");
  if (diffusion >= 0)
    std::printf("diffusion: every rank holds weight from every rank after %d steps\n", diffusion);
  else
    std::printf("diffusion: not every rank reached within %d steps\n", limit);
  std::printf("deviation from the average after %d steps: %.3e (relative to the start)\n", round,
              gp::deviation_from_average(s, round));
  constexpr int kRounds = 4;
  std::printf("consensus distance shrinks by %.4g per round of %d steps (mean of %d rounds)\n",
              gp::contraction_per_round(s, kRounds), round, kRounds);
  return 0;
}

int cmd_train(const std::vector<std::string>& args, int argc, char** argv) {
  for (const auto& a : args)
    if (a == "--help" || a == "-h") {
      std::cout << gg::gossip::train_help();
      return 0;
    }
  gg::mpi::Environment env(&argc, &argv);
  const gg::mpi::Comm world = gg::mpi::Comm::world();
  const int rank = world.rank();
  try {
    const gg::gossip::Config c = gg::gossip::parse_train_args(args);
    world.barrier();  // every rank validated before rank 0 creates any file
    gg::gossip::run_training(c, world);
    world.barrier();
    return 0;
  } catch (const UsageError& e) {
    // Every rank sees the same usage error; one line from rank 0 is enough.
    if (rank == 0) std::fprintf(stderr, "gossipgrad: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gossipgrad: rank %d: error: %s\n", rank, e.what());
    if (world.size() > 1) MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> all(argv + 1, argv + argc);
  if (all.empty()) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  const std::string cmd = all[0];
  const std::vector<std::string> rest(all.begin() + 1, all.end());
  try {
    if (cmd == "--help" || cmd == "-h" || cmd == "help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (cmd == "train") return cmd_train(rest, argc, argv);
    if (cmd == "info") return cmd_info(rest);
    if (cmd == "partners") return cmd_partners(rest);
    if (cmd == "pack") return gg::gossip::cmd_pack(rest);
    throw UsageError("unknown command '" + cmd + "' (try gossipgrad --help)");
  } catch (const UsageError& e) {
    std::fprintf(stderr, "gossipgrad: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gossipgrad: error: %s\n", e.what());
    return 1;
  }
}
