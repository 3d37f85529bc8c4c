// gossipgrad: the command-line front end. Usage errors exit 2, runtime failures exit 1.
#include <boost/program_options.hpp>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "gossip/config.hpp"
#include "gossip/mpi.hpp"
#include "gossip/trainer.hpp"
#include "kernels/models.hpp"

namespace po = boost::program_options;
using gg::gossip::UsageError;

namespace {

constexpr const char* kUsage =
    "gossipgrad: data-parallel training with gossip SGD\n\n"
    "usage:\n"
    "  mpirun -n P gossipgrad train --config FILE [--section.key value ...]\n"
    "  gossipgrad info --model NAME [--input C,H,W] [--classes N] [--width W] [--json]\n"
    "  gossipgrad help | --help | COMMAND --help\n\n"
    "commands:\n"
    "  train   train a model on this rank's share of the data (run under mpirun)\n"
    "  info    print a model's layers, parameter count and forward FLOPs\n\n"
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
    throw UsageError("unknown command '" + cmd + "' (try gossipgrad --help)");
  } catch (const UsageError& e) {
    std::fprintf(stderr, "gossipgrad: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gossipgrad: error: %s\n", e.what());
    return 1;
  }
}
