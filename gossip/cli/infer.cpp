// `gossipgrad infer`: eval-mode logits of a model with .npz weights (from gossipgrad export or a
// PyTorch state_dict) for the images in a .npy file, written as .npy.
#include <algorithm>
#include <boost/program_options.hpp>
#include <cstdio>
#include <string>
#include <vector>

#include "gossip/cli/args.hpp"
#include "gossip/cli/commands.hpp"
#include "gossip/config/config.hpp"
#include "kernels/apoptosis.hpp"
#include "kernels/models.hpp"
#include "kernels/net.hpp"
#include "kernels/npz.hpp"
#include "kernels/weights.hpp"

namespace gg::gossip {
namespace {

namespace po = boost::program_options;

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

}  // namespace

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

}  // namespace gg::gossip
