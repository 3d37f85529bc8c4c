// gossipgrad: the command-line front end. Usage errors exit 2, runtime failures exit 1.
#include <algorithm>
#include <boost/program_options.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gossip/cli/pack.hpp"
#include "gossip/cli/simulate.hpp"
#include "gossip/comm/mpi.hpp"
#include "gossip/config/config.hpp"
#include "gossip/resilience/checkpoint.hpp"
#include "gossip/resilience/supervise.hpp"
#include "gossip/train/loop.hpp"
#include "gossip/train/preflight.hpp"
#include "gossip/train/stop_signals.hpp"
#include "gossip/train/trainer.hpp"
#include "kernels/apoptosis.hpp"
#include "kernels/models.hpp"
#include "kernels/net.hpp"
#include "kernels/npz.hpp"
#include "kernels/weights.hpp"
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
    "  gossipgrad export --checkpoint DIR --output W.npz [--overwrite]\n"
    "  gossipgrad infer --model NAME --weights W.npz --input X.npy --output Y.npy [--classes N]\n"
    "                   [--backend onednn|reference|cuda] [--batch B] [--overwrite]\n"
    "  gossipgrad partners --ranks P [--schedule S] [--rotate] [--steps T] [--seed N] [--json]\n"
    "  gossipgrad simulate --config FILE --ranks 2,4,...,4096 [--json] [--section.key value ...]\n"
    "  gossipgrad pack --input DIR --output DIR [--shard-size MB] [--threads N] [--shuffle SEED]\n"
    "  gossipgrad supervise [--max-restarts N] [--shrink-on-failure] -- mpirun -n P gossipgrad "
    "train ...\n"
    "  gossipgrad help | --help | COMMAND --help\n\n"
    "commands:\n"
    "  train   train a model on this rank's share of the data (run under mpirun)\n"
    "  info    print a model's layers, parameter count and forward FLOPs\n"
    "  export  write a checkpoint's model as .npz with torchvision state_dict names\n"
    "  infer   logits (eval mode) of a model with .npz weights for the images in a .npy file\n"
    "  partners  print who talks to whom at each step, and how fast the schedule mixes\n"
    "  simulate  predict step time and efficiency of gossip vs allreduce at many rank counts\n"
    "  pack    image folder (ImageNet layout) -> tar shards for data.source = shards:DIR\n"
    "  supervise  run a training job, restarting it from its latest checkpoint when it dies\n\n"
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
  namespace gk = gg::kernels;
  std::string name, input;
  int64_t classes = 0, width = 0;
  bool json = false;
  po::options_description d("info options");
  std::string names;
  for (const auto& n : gk::model_names()) names += (names.empty() ? "" : ", ") + n;
  d.add_options()("help", "this help")("model", po::value(&name)->required(),
                                       ("model name: " + names).c_str())(
      "input", po::value(&input),
      "sample dims C,H,W (default 3,224,224 for the torchvision models, 1,28,28 otherwise)")(
      "classes", po::value(&classes), "output classes (default 1000, or 10 for the small nets)")(
      "width", po::value(&width), "first-stage channels of resnet8 and cnn (default 16)")(
      "json", po::bool_switch(&json), "print JSON");
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(args).options(d).run(), vm);
    if (vm.count("help")) {
      std::cout << "usage: gossipgrad info --model NAME [--input C,H,W] [--classes N] [--width W] "
                   "[--json]\n\n"
                << d;
      return 0;
    }
    po::notify(vm);
  } catch (const po::error& e) {
    throw UsageError(e.what());
  }
  gk::ModelSpec spec = gk::default_spec(name);
  if (vm.count("input")) spec.input = parse_dims(input);
  if (vm.count("classes")) spec.classes = classes;
  if (vm.count("width")) {
    if (name != "resnet8" && name != "cnn")
      throw UsageError("--width applies to resnet8 and cnn only, not " + name);
    spec.width = width;
  }
  const gk::Graph g = [&] {
    try {
      return gk::build_model(spec);
    } catch (const std::invalid_argument& e) {
      throw UsageError(e.what());
    }
  }();
  const auto layer_params = [&](const gk::Node& n) {
    int64_t params = 0;
    for (int p : n.params) params += g.params()[p].size();
    return params;
  };
  constexpr const char* kFlopsNote =
      "forward FLOPs per sample, inference; a multiply-add counts as 2 FLOPs";
  if (json) {
    using Json = nlohmann::ordered_json;  // keys in the order written
    Json layers = Json::array();
    for (size_t id = 0; id < g.nodes().size(); ++id) {
      const gk::Node& n = g.nodes()[id];
      Json inputs = Json::array();
      for (int in : n.inputs) inputs.push_back(g.node(in).name);
      layers.push_back({{"name", n.name},
                        {"op", gk::op_name(n.op)},
                        {"inputs", inputs},
                        {"output", n.out},
                        {"params", layer_params(n)},
                        {"flops", g.flops(static_cast<int>(id))}});
    }
    const auto tensors = [](const std::vector<gk::TensorSpec>& specs) {
      Json list = Json::array();
      for (const gk::TensorSpec& t : specs) list.push_back({{"name", t.name}, {"shape", t.dims}});
      return list;
    };
    std::cout << Json{{"model", spec.name},
                      {"input", spec.input},
                      {"classes", g.classes()},
                      {"params", g.param_count()},
                      {"buffers", g.buffer_count()},
                      {"forward_flops", g.forward_flops()},
                      {"forward_macs", g.forward_macs()},
                      {"flops_note", kFlopsNote},
                      {"layers", layers},
                      {"param_tensors", tensors(g.params())},
                      {"buffer_tensors", tensors(g.buffers())}}
                     .dump(1)
              << "\n";
    return 0;
  }
  std::printf("%-32s %-16s %-16s %12s %15s\n", "layer", "op", "output", "params", "FLOPs");
  for (size_t id = 0; id < g.nodes().size(); ++id) {
    const gk::Node& n = g.nodes()[id];
    std::printf("%-32s %-16s %-16s %12lld %15lld\n", n.name.c_str(), gk::op_name(n.op),
                gk::to_string(n.out).c_str(), static_cast<long long>(layer_params(n)),
                static_cast<long long>(g.flops(static_cast<int>(id))));
  }
  std::printf("\n%s, input %s, %lld classes: %lld parameters, %.3f GFLOPs forward per sample\n",
              spec.name.c_str(), gk::to_string(spec.input).c_str(),
              static_cast<long long>(g.classes()), static_cast<long long>(g.param_count()),
              static_cast<double>(g.forward_flops()) / 1e9);
  std::printf("(%s; conv and fully connected layers alone: %.3f G multiply-adds)\n", kFlopsNote,
              static_cast<double>(g.forward_macs()) / 1e9);
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

namespace fs = std::filesystem;

// Parses a subcommand's options. Returns false after printing the help for --help.
bool parse_options(const std::vector<std::string>& args, const po::options_description& d,
                   const std::string& usage, po::variables_map& vm) {
  try {
    po::store(
        po::command_line_parser(args)
            .options(d)
            .style(po::command_line_style::unix_style & ~po::command_line_style::allow_guessing)
            .run(),
        vm);
    if (vm.count("help")) {
      std::cout << usage << "\n\n" << d;
      return false;
    }
    po::notify(vm);
  } catch (const po::error& e) {
    throw UsageError(e.what());
  }
  return true;
}

void require_input_file(const std::string& path, const std::string& option) {
  if (!fs::exists(path)) throw UsageError(option + " " + path + " does not exist");
  if (fs::is_directory(path)) throw UsageError(option + " " + path + " is a folder, not a file");
}

void require_output_file(const std::string& path, bool overwrite, const std::string& option) {
  if (path.empty()) throw UsageError(option + " must name a file");
  if (fs::is_directory(path)) throw UsageError(option + " " + path + " is a folder");
  if (fs::exists(path) && !overwrite)
    throw UsageError(option + " " + path +
                     " already exists: choose a new path or pass --overwrite");
  const fs::path parent = fs::path(path).parent_path();
  if (!parent.empty() && !fs::is_directory(parent))
    throw UsageError(option + " " + path + ": the folder " + parent.string() + " does not exist");
}

int cmd_export(const std::vector<std::string>& args) {
  std::string dir, output;
  bool overwrite = false;
  po::options_description d("export options");
  d.add_options()("help", "this help")("checkpoint", po::value(&dir)->required(),
                                       "checkpoint folder written by gossipgrad train")(
      "output", po::value(&output)->required(),
      ".npz to write, with torchvision state_dict names (loads into PyTorch with "
      "load_state_dict)")("overwrite", po::bool_switch(&overwrite),
                          "replace an existing output file");
  po::variables_map vm;
  if (!parse_options(args, d,
                     "usage: gossipgrad export --checkpoint DIR --output W.npz [--overwrite]", vm))
    return 0;
  require_output_file(output, overwrite, "--output");
  const gg::gossip::CheckpointMeta meta = gg::gossip::read_checkpoint_meta(dir);
  const std::string weights = (fs::path(dir) / gg::gossip::kCheckpointModel).string();
  require_input_file(weights, "--checkpoint " + dir + ":");
  const std::string meta_path = (fs::path(dir) / gg::gossip::kCheckpointMeta).string();
  gg::kernels::Graph g = [&] {
    try {
      // A model shrunk by apoptosis: the base model at the widths meta.json records.
      return gg::kernels::apply_widths(gg::kernels::build_model(meta.model), meta.widths);
    } catch (const std::invalid_argument& e) {
      throw std::runtime_error(meta_path + ": " + e.what());
    }
  }();
  gg::kernels::ParamStore store(g);
  try {
    gg::kernels::load_weights(weights, g, store);
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(std::string(e.what()) + " (it does not match " + meta_path + ")");
  }
  gg::kernels::save_weights(output, g, store.params, store.buffers, meta.step);
  std::printf("exported %s (epoch %lld, step %lld, %lld parameters) from %s to %s\n",
              meta.model.name.c_str(), static_cast<long long>(meta.epoch),
              static_cast<long long>(meta.step), static_cast<long long>(g.param_count()),
              dir.c_str(), output.c_str());
  return 0;
}

// The first-stage width of the small nets, read off the first convolution in the weights;
// `fallback` for models whose first layer does not scale with the width.
int64_t width_from_weights(gg::kernels::ModelSpec spec, const gg::kernels::NpzEntries& w,
                           int64_t fallback) {
  spec.width = 1;
  const gg::kernels::Graph g1 = gg::kernels::build_model(spec);
  spec.width = 2;
  const gg::kernels::Graph g2 = gg::kernels::build_model(spec);
  const gg::kernels::TensorSpec& p1 = g1.params().front();
  const gg::kernels::TensorSpec& p2 = g2.params().front();
  if (p1.name != p2.name || p2.dims[0] != 2 * p1.dims[0]) return fallback;
  const gg::kernels::NpyArray* a = gg::kernels::find_array(w, p1.name);
  if (!a || a->shape.empty() || a->shape[0] < 1 || a->shape[0] % p1.dims[0] != 0) return fallback;
  return a->shape[0] / p1.dims[0];
}

// The class count: the output dimension of the last layer's weight in the weights file.
int64_t classes_from_weights(const gg::kernels::ModelSpec& spec, const gg::kernels::NpzEntries& w,
                             int64_t fallback) {
  const gg::kernels::Graph g = gg::kernels::build_model(spec);
  const gg::kernels::Node& out = g.node(g.output());
  if (out.params.empty()) return fallback;
  const gg::kernels::NpyArray* a = gg::kernels::find_array(w, g.params()[out.params[0]].name);
  return a && !a->shape.empty() && a->shape[0] >= 2 ? a->shape[0] : fallback;
}

int cmd_infer(const std::vector<std::string>& args) {
  gg::kernels::ModelSpec spec;
  std::string weights, input, output, backend_name = "onednn";
  int64_t batch = 32;
  bool overwrite = false;
  po::options_description d("infer options");
  // clang-format off
  d.add_options()
    ("help", "this help")
    ("model", po::value(&spec.name)->required(), "model name (see gossipgrad --help)")
    ("weights", po::value(&weights)->required(),
     ".npz with torchvision state_dict names (gossipgrad export, or numpy.savez of a PyTorch "
     "state_dict)")
    ("input", po::value(&input)->required(), ".npy of float32 images, shape (N, C, H, W)")
    ("output", po::value(&output)->required(), ".npy to write: float32 logits, shape (N, classes)")
    ("classes", po::value(&spec.classes), "output classes (default: read off the weights)")
    ("width", po::value(&spec.width), "first-stage channels of the small nets (default: read off "
     "the weights)")
    ("batch_norm", po::value(&spec.batch_norm), "small nets with batch norm (default: whether the "
     "weights hold running statistics)")
    ("backend", po::value(&backend_name)->default_value(backend_name), "onednn, reference or cuda")
    ("batch", po::value(&batch)->default_value(batch), "images per forward pass [1, 65536]")
    ("overwrite", po::bool_switch(&overwrite), "replace an existing output file");
  // clang-format on
  po::variables_map vm;
  if (!parse_options(args, d,
                     "usage: gossipgrad infer --model NAME --weights W.npz --input X.npy --output "
                     "Y.npy [--classes N] [--backend onednn|reference|cuda] [--batch B]",
                     vm))
    return 0;
  require_input_file(weights, "--weights");
  require_input_file(input, "--input");
  require_output_file(output, overwrite, "--output");
  if (batch < 1 || batch > 65536)
    throw UsageError("--batch " + std::to_string(batch) + " must be in [1, 65536]");
  const gg::kernels::Backend backend = [&] {
    try {
      return gg::kernels::parse_backend(backend_name);
    } catch (const std::invalid_argument& e) {
      throw UsageError(std::string("--backend: ") + e.what());
    }
  }();

  gg::kernels::NpyArray x = gg::kernels::read_npy(input);
  if (!x.is_float() || x.shape.size() != 4)
    throw UsageError("--input " + input + " holds " + gg::kernels::npy_type_name(x.type) + " " +
                     gg::kernels::to_string(x.shape) +
                     ": expected float32 images of shape (N, C, H, W)");
  spec.input = {x.shape[1], x.shape[2], x.shape[3]};
  const gg::kernels::NpzEntries w = gg::kernels::read_npz(weights);
  try {
    if (!vm.count("batch_norm"))
      spec.batch_norm = std::any_of(
          w.begin(), w.end(), [](const auto& e) { return e.first.ends_with(".running_var"); });
    if (!vm.count("width")) spec.width = width_from_weights(spec, w, spec.width);
    if (!vm.count("classes")) spec.classes = classes_from_weights(spec, w, spec.classes);
    // Weights of a model shrunk by apoptosis carry its layers' widths.
    gg::kernels::Graph base = gg::kernels::build_model(spec);
    const auto widths = gg::kernels::widths_in_weights(base, w);
    gg::kernels::Net net(gg::kernels::apply_widths(base, widths), backend, int64_t{1} << 40);
    gg::kernels::import_weights(net.graph(), net.store(), w, weights);

    const int64_t n = x.shape[0], per = gg::kernels::numel(spec.input), k = spec.classes;
    std::vector<float> y(n * k);
    for (int64_t at = 0; at < n; at += batch) {
      const int64_t m = std::min(batch, n - at);
      const float* logits = net.at_batch(m).forward(x.f.data() + at * per, false);
      std::copy(logits, logits + m * k, y.begin() + at * k);
    }
    gg::kernels::write_npy(output, gg::kernels::NpyArray::floats({n, k}, std::move(y)));
    std::printf("%lld images %s -> %s (%s, %s backend) -> %s logits %s\n",
                static_cast<long long>(n), gg::kernels::to_string(spec.input).c_str(),
                spec.name.c_str(), weights.c_str(), gg::kernels::backend_name(backend),
                output.c_str(), gg::kernels::to_string({n, k}).c_str());
  } catch (const std::invalid_argument& e) {
    // An unknown model, an input it cannot take, or weights that do not fit it.
    throw UsageError(e.what());
  }
  return 0;
}

// --dry-run: the config validated (what concerns this machine only warns: another cluster's
// config names its own paths and backend) and printed resolved, as INI; nothing runs, nothing is
// written.
int dry_run(std::vector<std::string> args) {
  args.erase(std::remove(args.begin(), args.end(), "--dry-run"), args.end());
  const gg::gossip::Config c = gg::gossip::parse_train_args(args);
  try {
    gg::gossip::check_this_machine(c);
    gg::gossip::check_run_files(c);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "gossipgrad: warning: not on this machine: %s\n", e.what());
  }
  std::cout << "# gossipgrad train, resolved settings"
            << (c.config_path.empty() ? "" : " of " + c.config_path) << "\n"
            << gg::gossip::to_ini(c);
  return 0;
}

int cmd_train(const std::vector<std::string>& args, int argc, char** argv) {
  for (const auto& a : args)
    if (a == "--help" || a == "-h") {
      std::cout << gg::gossip::train_help();
      return 0;
    }
  if (std::find(args.begin(), args.end(), "--dry-run") != args.end()) return dry_run(args);
  gg::mpi::Environment env(&argc, &argv);
  const gg::mpi::Comm world = gg::mpi::Comm::world();
  const int rank = world.rank();
  try {
    const gg::gossip::Config c = gg::gossip::parse_train_args(args);
    gg::gossip::check_this_machine(c);
    gg::gossip::check_run_files(c);
    world.barrier();  // every rank validated before rank 0 creates any file
    gg::gossip::run_training(c, world);
    world.barrier();
    return 0;
  } catch (const gg::gossip::StopRequested& e) {
    // Every rank stopped at the same step boundary: one line, and MPI ends normally.
    if (rank == 0) std::fprintf(stderr, "gossipgrad: %s\n", e.what());
    return 128 + e.signal;
  } catch (const UsageError& e) {
    // Every rank sees the same usage error; one line from rank 0 is enough.
    if (rank == 0) std::fprintf(stderr, "gossipgrad: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gossipgrad: rank %d: error: %s\n", rank, e.what());
    std::fflush(stderr);
    // mpirun drops output still in flight when the abort tears the job down: give it a moment.
    if (world.size() > 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
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
    if (cmd == "export") return cmd_export(rest);
    if (cmd == "infer") return cmd_infer(rest);
    if (cmd == "simulate") return gg::gossip::run_simulate(rest);
    if (cmd == "pack") return gg::gossip::cmd_pack(rest);
    if (cmd == "supervise") return gg::gossip::cmd_supervise(rest);
    throw UsageError("unknown command '" + cmd + "' (try gossipgrad --help)");
  } catch (const UsageError& e) {
    std::fprintf(stderr, "gossipgrad: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gossipgrad: error: %s\n", e.what());
    return 1;
  }
}
