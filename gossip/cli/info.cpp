// `gossipgrad info`: a model's layers with their output shapes, parameters and forward FLOPs, as a
// table or (--json) as JSON.
#include <boost/program_options.hpp>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "gossip/cli/args.hpp"
#include "gossip/cli/commands.hpp"
#include "gossip/config/config.hpp"
#include "kernels/models.hpp"

namespace gg::gossip {
namespace {

namespace gk = gg::kernels;
namespace po = boost::program_options;

constexpr const char* kFlopsNote =
    "forward FLOPs per sample, inference; a multiply-add counts as 2 FLOPs";

gk::Dims parse_dims(const std::string& s) {
  gk::Dims d;
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

// What the command line asks for: the model and whether to print JSON.
struct InfoRequest {
  gk::ModelSpec spec;
  bool json = false;
};

// The request the options name, or nothing after printing --help.
std::optional<InfoRequest> parse_info_args(const std::vector<std::string>& args) {
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
  if (!parse_options(
          args, d,
          "usage: gossipgrad info --model NAME [--input C,H,W] [--classes N] [--width W] "
          "[--json]",
          vm, Prefixes::kTaken))
    return std::nullopt;
  InfoRequest r{gk::default_spec(name), json};
  if (vm.count("input")) r.spec.input = parse_dims(input);
  if (vm.count("classes")) r.spec.classes = classes;
  if (vm.count("width")) {
    if (name != "resnet8" && name != "cnn")
      throw UsageError("--width applies to resnet8 and cnn only, not " + name);
    r.spec.width = width;
  }
  return r;
}

// The model's graph, its counts checked: every count info prints fits in 64 bits (the per-layer
// ones are parts of the totals), else one line instead of a wrapped, negative number.
gk::Graph build_graph(const gk::ModelSpec& spec) {
  try {
    gk::Graph g = gk::build_model(spec);
    g.forward_flops();
    g.forward_macs();
    g.training_useful_macs();
    return g;
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());  // an unknown model, or an input it cannot take
  } catch (const std::overflow_error& e) {
    throw UsageError(spec.name + " at input " + gk::to_string(spec.input) + " with " +
                     std::to_string(spec.classes) + " classes: " + e.what() +
                     ": choose a smaller --input or --classes");
  }
}

int64_t layer_params(const gk::Graph& g, const gk::Node& n) {
  int64_t params = 0;
  for (int p : n.params) params += g.params()[p].size();
  return params;
}

void print_info_json(const gk::ModelSpec& spec, const gk::Graph& g) {
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
                      {"params", layer_params(g, n)},
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
                    {"buffer_tensors", tensors(g.buffers())},
                    {"forward_useful_macs", g.forward_useful_macs()},
                    {"training_useful_macs", g.training_useful_macs()}}
                   .dump(1)
            << "\n";
}

void print_info_table(const gk::ModelSpec& spec, const gk::Graph& g) {
  std::printf("%-32s %-16s %-16s %12s %15s\n", "layer", "op", "output", "params", "FLOPs");
  for (size_t id = 0; id < g.nodes().size(); ++id) {
    const gk::Node& n = g.nodes()[id];
    std::printf("%-32s %-16s %-16s %12lld %15lld\n", n.name.c_str(), gk::op_name(n.op),
                gk::to_string(n.out).c_str(), static_cast<long long>(layer_params(g, n)),
                static_cast<long long>(g.flops(static_cast<int>(id))));
  }
  std::printf("\n%s, input %s, %lld classes: %lld parameters, %.3f GFLOPs forward per sample\n",
              spec.name.c_str(), gk::to_string(spec.input).c_str(),
              static_cast<long long>(g.classes()), static_cast<long long>(g.param_count()),
              static_cast<double>(g.forward_flops()) / 1e9);
  std::printf("(%s; conv and fully connected layers alone: %.3f G multiply-adds)\n", kFlopsNote,
              static_cast<double>(g.forward_macs()) / 1e9);
}

}  // namespace

int cmd_info(const std::vector<std::string>& args) {
  const std::optional<InfoRequest> r = parse_info_args(args);
  if (!r) return 0;
  const gk::Graph g = build_graph(r->spec);
  if (r->json)
    print_info_json(r->spec, g);
  else
    print_info_table(r->spec, g);
  return 0;
}

}  // namespace gg::gossip
