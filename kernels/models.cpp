#include "kernels/models.hpp"

#include <algorithm>
#include <cmath>
#include <random>
#include <stdexcept>

namespace gg::kernels {

namespace {

struct ResNetVariant {
  const char* name;
  ResNetShape shape;
};

// torchvision's resnetNN(): blocks per stage and block kind.
const std::vector<ResNetVariant>& resnets() {
  static const std::vector<ResNetVariant> v = {{"resnet18", {{2, 2, 2, 2}, false, 64}},
                                               {"resnet34", {{3, 4, 6, 3}, false, 64}},
                                               {"resnet50", {{3, 4, 6, 3}, true, 64}},
                                               {"resnet101", {{3, 4, 23, 3}, true, 64}},
                                               {"resnet152", {{3, 8, 36, 3}, true, 64}}};
  return v;
}

bool is_torchvision(const std::string& name) {
  return name == "googlenet" || std::any_of(resnets().begin(), resnets().end(),
                                            [&](const ResNetVariant& r) { return name == r.name; });
}

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

// torchvision's Bottleneck (v1.5): conv1x1-bn-relu, conv3x3 (stride here)-bn-relu,
// conv1x1 (4x planes)-bn, + identity or 1x1 downsample, relu.
int bottleneck_block(Graph& g, const std::string& p, int x, int64_t planes, int64_t stride) {
  const int64_t in = g.node(x).out[0], out = 4 * planes;
  int y = conv_bn_relu(g, p + ".conv1", p + ".bn1", x, {planes, 1, 1, 0, false}, true, true);
  y = conv_bn_relu(g, p + ".conv2", p + ".bn2", y, {planes, 3, stride, 1, false}, true, true);
  y = conv_bn_relu(g, p + ".conv3", p + ".bn3", y, {out, 1, 1, 0, false}, true, false);
  int shortcut = x;
  if (stride != 1 || in != out)
    shortcut = conv_bn_relu(g, p + ".downsample.0", p + ".downsample.1", x,
                            {out, 1, stride, 0, false}, true, false);
  return g.relu(g.add(y, shortcut));
}

// torchvision's BasicConv2d: conv without bias, batch norm with eps 0.001, ReLU.
int basic_conv(Graph& g, const std::string& p, int x, int64_t out, int64_t kernel,
               int64_t stride = 1, int64_t pad = 0) {
  x = g.conv(p + ".conv", x, {out, kernel, stride, pad, false});
  return g.relu(g.batch_norm(p + ".bn", x, {.eps = 1e-3f}));
}

// torchvision's Inception block: 1x1 | 1x1 -> 3x3 | 1x1 -> 3x3 (torchvision's "5x5" branch really
// is 3x3) | 3x3 max pool (stride 1, ceil mode) -> 1x1, concatenated along channels.
struct InceptionWidths {
  int64_t c1, c3_reduce, c3, c5_reduce, c5, pool_proj;
};
int inception(Graph& g, const std::string& p, int x, const InceptionWidths& w) {
  const int b1 = basic_conv(g, p + ".branch1", x, w.c1, 1);
  int b2 = basic_conv(g, p + ".branch2.0", x, w.c3_reduce, 1);
  b2 = basic_conv(g, p + ".branch2.1", b2, w.c3, 3, 1, 1);
  int b3 = basic_conv(g, p + ".branch3.0", x, w.c5_reduce, 1);
  b3 = basic_conv(g, p + ".branch3.1", b3, w.c5, 3, 1, 1);
  int b4 = g.max_pool(x, {3, 1, 1, true}, p + ".branch4.0");
  b4 = basic_conv(g, p + ".branch4.1", b4, w.pool_proj, 1);
  return g.concat({b1, b2, b3, b4}, p);
}

void check_spec(const ModelSpec& s) {
  if (s.input.size() != 3 || s.input[0] < 1 || s.input[1] < 1 || s.input[2] < 1)
    throw std::invalid_argument("model input must be {C,H,W} with every dimension >= 1, got " +
                                to_string(s.input));
  if (s.classes < 2) throw std::invalid_argument("model needs at least 2 classes");
}

// Builds with `build`; if the input is too small for the net's windows, says how large it must
// be: the smallest square input that builds (only searched on that error path).
template <typename Build>
Graph fitted(const ModelSpec& s, const Build& build) {
  try {
    return build(s);
  } catch (const std::invalid_argument&) {
    ModelSpec t = s;
    for (int64_t side = 1; side <= 4096; ++side) {
      t.input = {s.input[0], side, side};
      try {
        build(t);
      } catch (const std::invalid_argument&) {
        continue;
      }
      throw std::invalid_argument(s.name + " needs an input of at least " + std::to_string(side) +
                                  "x" + std::to_string(side) + ", got " + to_string(s.input));
    }
    throw;
  }
}

}  // namespace

std::vector<std::string> model_names() {
  std::vector<std::string> names = {"resnet8", "cnn"};
  for (const ResNetVariant& r : resnets()) names.push_back(r.name);
  names.push_back("googlenet");
  return names;
}

ModelSpec default_spec(const std::string& name) {
  ModelSpec s;
  s.name = name;
  if (is_torchvision(name)) {
    s.input = {3, 224, 224};
    s.classes = 1000;
  }
  return s;
}

Graph build_resnet(const ModelSpec& s, const ResNetShape& shape) {
  check_spec(s);
  if (shape.blocks.empty() || shape.width < 1 ||
      std::any_of(shape.blocks.begin(), shape.blocks.end(), [](int b) { return b < 1; }))
    throw std::invalid_argument("resnet needs at least one stage, blocks >= 1 and width >= 1");
  return fitted(s, [&](const ModelSpec& m) {
    Graph g(m.input);
    g.set_weight_init(WeightInit::KaimingFanOut);
    int x = conv_bn_relu(g, "conv1", "bn1", g.input(), {shape.width, 7, 2, 3, false}, true, true);
    x = g.max_pool(x, {3, 2, 1}, "maxpool");
    for (size_t stage = 0; stage < shape.blocks.size(); ++stage) {
      const int64_t planes = shape.width << stage;
      for (int b = 0; b < shape.blocks[stage]; ++b) {
        const std::string p = "layer" + std::to_string(stage + 1) + "." + std::to_string(b);
        const int64_t stride = stage > 0 && b == 0 ? 2 : 1;
        x = shape.bottleneck ? bottleneck_block(g, p, x, planes, stride)
                             : basic_block(g, p, x, planes, stride, true);
      }
    }
    x = g.global_avg_pool(x, "avgpool");
    g.set_output(g.fully_connected("fc", x, {m.classes, true}));
    return g;
  });
}

Graph build_googlenet(const ModelSpec& s, int64_t d) {
  check_spec(s);
  if (d < 1) throw std::invalid_argument("googlenet width divisor must be >= 1");
  const auto c = [d](int64_t channels) { return std::max<int64_t>(1, channels / d); };
  const auto widths = [&](int64_t c1, int64_t c3r, int64_t c3, int64_t c5r, int64_t c5,
                          int64_t pp) {
    return InceptionWidths{c(c1), c(c3r), c(c3), c(c5r), c(c5), c(pp)};
  };
  return fitted(s, [&](const ModelSpec& m) {
    Graph g(m.input);
    g.set_weight_init(WeightInit::TruncatedNormal);
    int x = basic_conv(g, "conv1", g.input(), c(64), 7, 2, 3);
    x = g.max_pool(x, {3, 2, 0, true}, "maxpool1");
    x = basic_conv(g, "conv2", x, c(64), 1);
    x = basic_conv(g, "conv3", x, c(192), 3, 1, 1);
    x = g.max_pool(x, {3, 2, 0, true}, "maxpool2");
    x = inception(g, "inception3a", x, widths(64, 96, 128, 16, 32, 32));
    x = inception(g, "inception3b", x, widths(128, 128, 192, 32, 96, 64));
    x = g.max_pool(x, {3, 2, 0, true}, "maxpool3");
    x = inception(g, "inception4a", x, widths(192, 96, 208, 16, 48, 64));
    x = inception(g, "inception4b", x, widths(160, 112, 224, 24, 64, 64));
    x = inception(g, "inception4c", x, widths(128, 128, 256, 24, 64, 64));
    x = inception(g, "inception4d", x, widths(112, 144, 288, 32, 64, 64));
    x = inception(g, "inception4e", x, widths(256, 160, 320, 32, 128, 128));
    x = g.max_pool(x, {2, 2, 0, true}, "maxpool4");
    x = inception(g, "inception5a", x, widths(256, 160, 320, 32, 128, 128));
    x = inception(g, "inception5b", x, widths(384, 192, 384, 48, 128, 128));
    x = g.global_avg_pool(x, "avgpool");
    x = g.dropout(x, {0.2f, m.seed}, "dropout");
    g.set_output(g.fully_connected("fc", x, {m.classes, true}));
    return g;
  });
}

Graph build_model(const ModelSpec& s) {
  for (const ResNetVariant& r : resnets())
    if (s.name == r.name) return build_resnet(s, r.shape);
  if (s.name == "googlenet") return build_googlenet(s);
  if (s.name != "resnet8" && s.name != "cnn") {
    std::string names;
    for (const auto& n : model_names()) names += (names.empty() ? "" : ", ") + n;
    throw std::invalid_argument("unknown model '" + s.name + "' (available: " + names + ")");
  }
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
    x = g.global_avg_pool(x, "avgpool");
    x = g.fully_connected("fc", x, {s.classes, true});
  } else {
    // A plain CNN: two conv-relu-maxpool stages and two fully connected layers.
    x = conv_bn_relu(g, "conv1", "bn1", x, {w, 3, 1, 1, false}, s.batch_norm, true);
    x = g.max_pool(x, {2, 2, 0}, "maxpool1");
    x = conv_bn_relu(g, "conv2", "bn2", x, {2 * w, 3, 1, 1, false}, s.batch_norm, true);
    x = g.max_pool(x, {2, 2, 0}, "maxpool2");
    x = g.relu(g.fully_connected("fc1", x, {8 * w, true}));
    x = g.fully_connected("fc2", x, {s.classes, true});
  }
  g.set_output(x);
  return g;
}

void init_params(const Graph& g, ParamStore& store, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const bool truncated = g.weight_init() == WeightInit::TruncatedNormal;
  for (const TensorSpec& p : g.params()) {
    float* w = store.params.data() + p.offset;
    const Node& n = g.node(p.node);
    const bool is_weight = p.name.size() > 7 && p.name.ends_with(".weight");
    if (truncated && is_weight && (n.op == Op::Conv || n.op == Op::FullyConnected)) {
      // torch.nn.init.trunc_normal_(w, mean 0, std 0.01, a -2, b 2): redraw outside [a, b].
      std::normal_distribution<float> d(0.f, 0.01f);
      for (int64_t i = 0; i < p.size(); ++i) {
        float v = d(rng);
        while (v < -2.f || v > 2.f) v = d(rng);
        w[i] = v;
      }
    } else if (n.op == Op::Conv && is_weight) {
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
