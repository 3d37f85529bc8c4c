// `gossipgrad infer`: eval-mode logits of a model with .npz weights (from gossipgrad export or a
// PyTorch state_dict) for the images in a .npy file, written as .npy.
#include <algorithm>
#include <boost/program_options.hpp>
#include <cstdio>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "gossip/cli/args.hpp"
#include "gossip/cli/commands.hpp"
#include "gossip/config/config.hpp"
#include "kernels/apoptosis.hpp"
#include "kernels/models.hpp"
#include "kernels/net.hpp"
#include "kernels/npz.hpp"
#include "kernels/tensor.hpp"
#include "kernels/weights.hpp"

namespace gg::gossip {
namespace {

namespace gk = gg::kernels;
namespace po = boost::program_options;

// What the command line asks for. The model's input comes from the images; its width, class
// count and batch norm, unless given, from the weights.
struct InferRequest {
  gk::ModelSpec spec;
  bool width_given = false, classes_given = false, batch_norm_given = false;
  std::string weights, input, output;
  gk::Backend backend{};
  int64_t batch = 32;
};

// The request, its files checked, or nothing after printing --help.
std::optional<InferRequest> parse_infer_args(const std::vector<std::string>& args) {
  InferRequest r;
  std::string backend_name = "onednn";
  bool overwrite = false;
  po::options_description d("infer options");
  // clang-format off
  d.add_options()
    ("help", "this help")
    ("model", po::value(&r.spec.name)->required(), "model name (see gossipgrad --help)")
    ("weights", po::value(&r.weights)->required(),
     ".npz with torchvision state_dict names (gossipgrad export, or numpy.savez of a PyTorch "
     "state_dict)")
    ("input", po::value(&r.input)->required(), ".npy of float32 images, shape (N, C, H, W)")
    ("output", po::value(&r.output)->required(),
     ".npy to write: float32 logits, shape (N, classes)")
    ("classes", po::value(&r.spec.classes), "output classes (default: read off the weights)")
    ("width", po::value(&r.spec.width), "first-stage channels of the small nets (default: read off "
     "the weights)")
    ("batch_norm", po::value(&r.spec.batch_norm), "small nets with batch norm (default: whether "
     "the weights hold running statistics)")
    ("backend", po::value(&backend_name)->default_value(backend_name), "onednn, reference or cuda")
    ("batch", po::value(&r.batch)->default_value(r.batch), "images per forward pass [1, 65536]")
    ("overwrite", po::bool_switch(&overwrite), "replace an existing output file");
  // clang-format on
  po::variables_map vm;
  if (!parse_options(args, d,
                     "usage: gossipgrad infer --model NAME --weights W.npz --input X.npy --output "
                     "Y.npy [--classes N] [--backend onednn|reference|cuda] [--batch B]",
                     vm))
    return std::nullopt;
  r.width_given = vm.count("width") > 0;
  r.classes_given = vm.count("classes") > 0;
  r.batch_norm_given = vm.count("batch_norm") > 0;
  require_input_file(r.weights, "--weights");
  require_input_file(r.input, "--input");
  require_distinct_output({"--output", r.output}, {{"--weights", r.weights}, {"--input", r.input}});
  require_output_file(r.output, overwrite, "--output");
  if (r.batch < 1 || r.batch > 65536)
    throw UsageError("--batch " + std::to_string(r.batch) + " must be in [1, 65536]");
  try {
    r.backend = gk::parse_backend(backend_name);
  } catch (const std::invalid_argument& e) {
    throw UsageError(std::string("--backend: ") + e.what());
  }
  return r;
}

// A file the command line names that is no valid .npy or .npz (truncated, Fortran-ordered, of
// another dtype, corrupt): the user's input, refused with the option that names it (exit 2).
template <typename Read>
auto read_named(const std::string& option, Read read) {
  try {
    return read();
  } catch (const gk::NpyError& e) {
    throw UsageError(option + " " + e.what());
  }
}

gk::NpyArray read_images(const std::string& input) {
  gk::NpyArray x = read_named("--input", [&] { return gk::read_npy(input); });
  if (!x.is_float() || x.shape.size() != 4)
    throw UsageError("--input " + input + " holds " + gk::npy_type_name(x.type) + " " +
                     gk::to_string(x.shape) + ": expected float32 images of shape (N, C, H, W)");
  return x;
}

// The first-stage width of the small nets, read off the first convolution in the weights;
// `fallback` for models whose first layer does not scale with the width.
int64_t width_from_weights(gk::ModelSpec spec, const gk::NpzEntries& w, int64_t fallback) {
  spec.width = 1;
  const gk::Graph g1 = gk::build_model(spec);
  spec.width = 2;
  const gk::Graph g2 = gk::build_model(spec);
  const gk::TensorSpec& p1 = g1.params().front();
  const gk::TensorSpec& p2 = g2.params().front();
  if (p1.name != p2.name || p2.dims[0] != 2 * p1.dims[0]) return fallback;
  const gk::NpyArray* a = gk::find_array(w, p1.name);
  if (!a || a->shape.empty() || a->shape[0] < 1 || a->shape[0] % p1.dims[0] != 0) return fallback;
  return a->shape[0] / p1.dims[0];
}

// The class count: the output dimension of the last layer's weight in the weights file.
int64_t classes_from_weights(const gk::ModelSpec& spec, const gk::NpzEntries& w, int64_t fallback) {
  const gk::Graph g = gk::build_model(spec);
  const gk::Node& out = g.node(g.output());
  if (out.params.empty()) return fallback;
  const gk::NpyArray* a = gk::find_array(w, g.params()[out.params[0]].name);
  return a && !a->shape.empty() && a->shape[0] >= 2 ? a->shape[0] : fallback;
}

// Weights that give NaN logits are refused as train.init_from refuses them.
gk::NpzEntries read_weights(const std::string& path) {
  gk::NpzEntries w = read_named("--weights", [&] { return gk::read_npz(path); });
  for (const auto& [name, a] : w)
    if (a.is_float() && !gk::all_finite(a.f))
      throw UsageError("--weights " + path + ": '" + name +
                       "' holds NaN or inf: every logit would be NaN (was the model they came "
                       "from diverging?)");
  return w;
}

bool small_net(const std::string& name) { return name == "resnet8" || name == "cnn"; }

// --width and --batch_norm against the weights: the weights of an unshrunk model of another
// width, or with(out) running statistics, would load (as a shrunk model) or fail naming the
// weights; the option is the culprit.
void check_given_shape(const InferRequest& r, const gk::NpzEntries& w, bool holds_stats) {
  if ((r.width_given || r.batch_norm_given) && !small_net(r.spec.name))
    throw UsageError(std::string(r.width_given ? "--width" : "--batch_norm") +
                     " applies to resnet8 and cnn only, not " + r.spec.name);
  if (r.batch_norm_given && r.spec.batch_norm != holds_stats)
    throw UsageError(std::string("--batch_norm ") + (r.spec.batch_norm ? "true" : "false") +
                     ": the weights " + r.weights + " hold " + (holds_stats ? "" : "no ") +
                     "batch-norm running statistics; leave --batch_norm out to read it off them");
  if (!r.width_given) return;
  if (r.spec.width < 1)
    throw UsageError("--width " + std::to_string(r.spec.width) + " must be at least 1");
  gk::ModelSpec held = r.spec;
  held.width = width_from_weights(r.spec, w, -1);
  if (held.width < 1 || held.width == r.spec.width) return;
  // Unshrunk weights of another width: every layer as wide as that width makes it.
  if (!gk::widths_in_weights(gk::build_model(held), w).empty()) return;
  const gk::Graph asked = gk::build_model(r.spec);
  const gk::TensorSpec& first = asked.params().front();
  throw UsageError("--width " + std::to_string(r.spec.width) + ": the weights " + r.weights +
                   " are of width " + std::to_string(held.width) + " ('" + first.name +
                   "' has shape " + gk::to_string(gk::find_array(w, first.name)->shape) +
                   ", width " + std::to_string(r.spec.width) + " has " + gk::to_string(first.dims) +
                   "); leave --width out to read it off them");
}

// Images of a shape the weights were not made for: the first tensor whose shape follows the
// input's (the first convolution's channels, a flattening layer's features) names --input, not
// the weights. Only where every name fits: weights of another model are the weights' fault.
void check_images_fit(const InferRequest& r, const gk::Graph& g,
                      const std::map<std::string, int64_t>& widths, const gk::NpzEntries& w) {
  gk::ModelSpec other = r.spec;
  other.input = {r.spec.input[0] + 1, 2 * r.spec.input[1], 2 * r.spec.input[2]};
  const gk::Graph moved = gk::apply_widths(gk::build_model(other), widths);
  for (const gk::TensorSpec& t : g.params())
    if (!gk::find_array(w, t.name)) return;
  for (size_t k = 0; k < g.params().size(); ++k) {
    const gk::TensorSpec& t = g.params()[k];
    const gk::NpyArray* a = gk::find_array(w, t.name);
    if (a->shape == t.dims) continue;
    if (k >= moved.params().size() || moved.params()[k].dims == t.dims) return;
    throw UsageError("--input " + r.input + " holds images of shape " +
                     gk::to_string(r.spec.input) + ", which the weights " + r.weights +
                     " do not take: '" + t.name + "' has shape " + gk::to_string(a->shape) +
                     ", these images need " + gk::to_string(t.dims));
  }
}

// Batch norm, width and class count that the command line left open, read off the weights.
void complete_spec(InferRequest& r, const gk::NpzEntries& w) {
  const auto names = gk::model_names();
  if (std::find(names.begin(), names.end(), r.spec.name) != names.end()) {
    try {
      gk::build_model(r.spec);
    } catch (const std::invalid_argument& e) {  // the model exists: the images do not fit it
      throw UsageError("--input " + r.input + ": " + e.what());
    }
  }
  const bool holds_stats = std::any_of(
      w.begin(), w.end(), [](const auto& e) { return e.first.ends_with(".running_var"); });
  check_given_shape(r, w, holds_stats);
  if (!r.batch_norm_given) r.spec.batch_norm = holds_stats;
  if (!r.width_given) r.spec.width = width_from_weights(r.spec, w, r.spec.width);
  if (!r.classes_given) {
    r.spec.classes = classes_from_weights(r.spec, w, r.spec.classes);
  } else if (const int64_t held = classes_from_weights(r.spec, w, -1);
             held > 0 && held != r.spec.classes) {
    // Found before the model is allocated: --classes 1000000000 is not a bad_alloc.
    throw UsageError("--classes " + std::to_string(r.spec.classes) + ": the weights " + r.weights +
                     " hold " + std::to_string(held) +
                     " classes; leave --classes out to read it off them");
  }
}

// The logits of the n images in x, `batch` at a time: n x classes floats.
std::vector<float> logits_of(gk::Net& net, const gk::NpyArray& x, const gk::ModelSpec& spec,
                             int64_t batch) {
  const int64_t n = x.shape[0], per = gk::numel(spec.input), k = spec.classes;
  std::vector<float> y(n * k);
  for (int64_t at = 0; at < n; at += batch) {
    const int64_t m = std::min(batch, n - at);
    const float* logits = net.at_batch(m).forward(x.f.data() + at * per, false);
    std::copy(logits, logits + m * k, y.begin() + at * k);
  }
  return y;
}

// The model with the weights, run over the images; the logits written to the output file.
void infer(InferRequest& r, const gk::NpyArray& x, const gk::NpzEntries& w) {
  complete_spec(r, w);
  // Weights of a model shrunk by apoptosis carry its layers' widths.
  gk::Graph base = gk::build_model(r.spec);
  const auto widths = gk::widths_in_weights(base, w);
  gk::Graph g = gk::apply_widths(base, widths);
  check_images_fit(r, g, widths, w);
  gk::Net net(std::move(g), r.backend, int64_t{1} << 40);
  gk::import_weights(net.graph(), net.store(), w, r.weights);

  const int64_t n = x.shape[0], k = r.spec.classes;
  gk::write_npy(r.output, gk::NpyArray::floats({n, k}, logits_of(net, x, r.spec, r.batch)));
  std::printf("%lld images %s -> %s (%s, %s backend) -> %s logits %s\n", static_cast<long long>(n),
              gk::to_string(r.spec.input).c_str(), r.spec.name.c_str(), r.weights.c_str(),
              gk::backend_name(r.backend), r.output.c_str(), gk::to_string({n, k}).c_str());
}

}  // namespace

int cmd_infer(const std::vector<std::string>& args) {
  std::optional<InferRequest> r = parse_infer_args(args);
  if (!r) return 0;
  const gk::NpyArray x = read_images(r->input);
  r->spec.input = {x.shape[1], x.shape[2], x.shape[3]};
  const gk::NpzEntries w = read_weights(r->weights);
  try {
    infer(*r, x, w);
  } catch (const std::invalid_argument& e) {
    // An unknown model, an input it cannot take, or weights that do not fit it.
    throw UsageError(e.what());
  } catch (const std::overflow_error& e) {  // counts beyond 64 bits (--classes, the image size)
    throw UsageError(e.what());
  }
  return 0;
}

}  // namespace gg::gossip
