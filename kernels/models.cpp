#include "kernels/models.hpp"

#include <cmath>
#include <random>
#include <stdexcept>

namespace gg::kernels {

std::vector<std::string> model_names() { return {"resnet8", "cnn"}; }

namespace {

int conv_bn_relu(Graph& g, const std::string& conv, const std::string& bn, int x, ConvAttr a,
                 bool use_bn, bool relu) {
  a.bias = !use_bn;
  x = g.conv(conv, x, a);
  if (use_bn) x = g.batch_norm(bn, x);
  return relu ? g.relu(x) : x;
}

// torchvision's BasicBlock: conv3x3-bn-relu-conv3x3-bn (+ 1x1 downsample) + identity, relu.
int basic_block(Graph& g, const std::string& p, int x, int64_t out, int64_t stride, bool bn) {
  const int64_t in = g.node(x).out[0];
  int y = conv_bn_relu(g, p + ".conv1", p + ".bn1", x, {out, 3, stride, 1, false}, bn, true);
  y = conv_bn_relu(g, p + ".conv2", p + ".bn2", y, {out, 3, 1, 1, false}, bn, false);
  int shortcut = x;
  if (stride != 1 || in != out)
    shortcut = conv_bn_relu(g, p + ".downsample.0", p + ".downsample.1", x,
                            {out, 1, stride, 0, false}, bn, false);
  return g.relu(g.add(y, shortcut));
}

}  // namespace

Graph build_model(const ModelSpec& s) {
  if (s.input.size() != 3 || s.input[0] < 1 || s.input[1] < 8 || s.input[2] < 8)
    throw std::invalid_argument("model input must be {C,H,W} with H,W >= 8, got " +
                                to_string(s.input));
  if (s.classes < 2) throw std::invalid_argument("model needs at least 2 classes");
  if (s.width < 1 || s.width > 1024)
    throw std::invalid_argument("model width must be in [1, 1024]");
  Graph g(s.input);
  const int64_t w = s.width;
  int x = g.input();
  if (s.name == "resnet8") {
    // A small residual CNN for 28x28/32x32 inputs: stem + three stages of one BasicBlock.
    x = conv_bn_relu(g, "conv1", "bn1", x, {w, 3, 1, 1, false}, s.batch_norm, true);
    x = basic_block(g, "layer1.0", x, w, 1, s.batch_norm);
    x = basic_block(g, "layer2.0", x, 2 * w, 2, s.batch_norm);
    x = basic_block(g, "layer3.0", x, 4 * w, 2, s.batch_norm);
    x = g.global_avg_pool(x);
    x = g.fully_connected("fc", x, {s.classes, true});
  } else if (s.name == "cnn") {
    // A plain CNN: two conv-relu-maxpool stages and two fully connected layers.
    x = conv_bn_relu(g, "conv1", "bn1", x, {w, 3, 1, 1, false}, s.batch_norm, true);
    x = g.max_pool(x, {2, 2, 0});
    x = conv_bn_relu(g, "conv2", "bn2", x, {2 * w, 3, 1, 1, false}, s.batch_norm, true);
    x = g.max_pool(x, {2, 2, 0});
    x = g.relu(g.fully_connected("fc1", x, {8 * w, true}));
    x = g.fully_connected("fc2", x, {s.classes, true});
  } else {
    std::string names;
    for (const auto& n : model_names()) names += (names.empty() ? "" : ", ") + n;
    throw std::invalid_argument("unknown model '" + s.name + "' (available: " + names + ")");
  }
  g.set_output(x);
  return g;
}

void init_params(const Graph& g, ParamStore& store, uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (const TensorSpec& p : g.params()) {
    float* w = store.params.data() + p.offset;
    const Node& n = g.node(p.node);
    const bool is_weight = p.name.size() > 7 && p.name.ends_with(".weight");
    if (n.op == Op::Conv && is_weight) {
      const double fan_out = static_cast<double>(p.dims[0] * p.dims[2] * p.dims[3]);
      std::normal_distribution<float> d(0.f, static_cast<float>(std::sqrt(2.0 / fan_out)));
      for (int64_t i = 0; i < p.size(); ++i) w[i] = d(rng);
    } else if (n.op == Op::BatchNorm) {
      std::fill(w, w + p.size(), is_weight ? 1.f : 0.f);
    } else {
      // PyTorch's default for Linear (and conv bias): U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
      const int64_t in = numel(g.node(n.inputs[0]).out);
      const int64_t fan_in =
          n.op == Op::Conv ? g.node(n.inputs[0]).out[0] * n.conv.kernel * n.conv.kernel : in;
      const float bound = 1.f / std::sqrt(static_cast<float>(fan_in));
      std::uniform_real_distribution<float> d(-bound, bound);
      for (int64_t i = 0; i < p.size(); ++i) w[i] = d(rng);
    }
  }
  for (const TensorSpec& b : g.buffers()) {
    const bool var = b.name.ends_with(".running_var");
    std::fill(store.buffers.begin() + b.offset, store.buffers.begin() + b.offset + b.size(),
              var ? 1.f : 0.f);
  }
}

}  // namespace gg::kernels
