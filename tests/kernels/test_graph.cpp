#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/executor.hpp"
#include "kernels/graph.hpp"
#include "kernels/loss.hpp"
#include "kernels/models.hpp"

using namespace gg::kernels;

TEST_CASE("shape inference follows PyTorch's floor arithmetic") {
  Graph g({3, 32, 32});
  const int c = g.conv("c", g.input(), {8, 7, 2, 3, false});
  CHECK(g.node(c).out == Dims{8, 16, 16});
  const int p = g.max_pool(c, {3, 2, 1});
  CHECK(g.node(p).out == Dims{8, 8, 8});
  const int a = g.avg_pool(p, {2, 2, 0});
  CHECK(g.node(a).out == Dims{8, 4, 4});
  CHECK(g.node(g.global_avg_pool(a)).out == Dims{8, 1, 1});
  CHECK_THROWS_AS(g.add(c, p), std::invalid_argument);
  CHECK_THROWS_AS(g.conv("bad", p, {4, 9, 1, 0, false}), std::invalid_argument);
}

TEST_CASE("parameters are laid out contiguously in node order with torchvision names") {
  Graph g = build_model({"resnet8", {1, 28, 28}, 10, 16, true});
  int64_t offset = 0;
  for (const TensorSpec& t : g.params()) {
    CHECK(t.offset == offset);
    offset += t.size();
  }
  CHECK(offset == g.param_count());
  CHECK(g.params().front().name == "conv1.weight");
  CHECK(g.params().back().name == "fc.bias");
  bool has_downsample = false;
  for (const TensorSpec& t : g.params()) has_downsample |= t.name == "layer2.0.downsample.0.weight";
  CHECK(has_downsample);
  CHECK(g.buffers().size() == 2 * 9);  // running mean and var of 9 batch norms
}

TEST_CASE("resnet8 has the parameter count of its PyTorch twin") {
  // conv1 1*16*9 + bn 32; layer1: 2*(16*16*9) + 2*32; layer2: 16*32*9 + 32*32*9 + 2*64 +
  // downsample 16*32 + 64; layer3: 32*64*9 + 64*64*9 + 2*128 + 32*64 + 128; fc 64*10 + 10.
  const int64_t expected =
      144 + 32 + 4608 + 64 + 4608 + 9216 + 128 + 512 + 64 + 18432 + 36864 + 256 + 2048 + 128 + 650;
  CHECK(build_model({"resnet8", {1, 28, 28}, 10, 16, true}).param_count() == expected);
}

TEST_CASE("buckets cover every parameter once, in backward order, without splitting one") {
  Graph g = build_model({"resnet8", {1, 28, 28}, 10, 8, true});
  for (int64_t cap : {1, 100, 1000, 1 << 20}) {
    const auto buckets = make_buckets(g, cap);
    REQUIRE(!buckets.empty());
    CHECK(buckets.front().end == g.param_count());
    CHECK(buckets.back().begin == 0);
    for (size_t i = 1; i < buckets.size(); ++i) CHECK(buckets[i].end == buckets[i - 1].begin);
    for (const TensorSpec& t : g.params()) {
      int owners = 0;
      for (const Bucket& b : buckets) owners += t.offset >= b.begin && t.offset + t.size() <= b.end;
      CHECK(owners == 1);
    }
    if (cap == 1) CHECK(buckets.size() == g.params().size());
    if (cap == (1 << 20)) CHECK(buckets.size() == 1);
  }
}

TEST_CASE("softmax cross-entropy: known values, top-k and padding rows") {
  const float logits[] = {0, 0, 0, 2, 1, 0, 5, 5, 5};
  const int32_t labels[] = {1, 0, -1};
  float d[9];
  const LossResult r = softmax_cross_entropy(logits, labels, 3, 3, d);
  const double l0 = std::log(3.0);
  const double l1 = -(2 - std::log(std::exp(2.0) + std::exp(1.0) + 1.0));
  CHECK(r.loss == Approx((l0 + l1) / 2));
  CHECK(r.correct == 1);  // row 1 is right; row 0 is a tie, which argmax gives to class 0
  CHECK(d[6] == 0.f);
  CHECK(d[0] == Approx(1.0 / 3 / 2));
  CHECK(d[1] == Approx((1.0 / 3 - 1) / 2));
}

TEST_CASE("unknown models and bad inputs are clear errors") {
  CHECK_THROWS_WITH(build_model({"vgg99", {1, 28, 28}, 10, 16, true}),
                    Catch::Contains("unknown model 'vgg99'"));
  CHECK_THROWS_AS(build_model({"resnet8", {1, 4, 4}, 10, 16, true}), std::invalid_argument);
}

TEST_CASE("torchvision models have torchvision's parameter counts at 1000 classes") {
  struct Case {
    const char* name;
    int64_t params;
  };
  const Case c = GENERATE(values<Case>({{"resnet18", 11689512},
                                        {"resnet34", 21797672},
                                        {"resnet50", 25557032},
                                        {"resnet101", 44549160},
                                        {"resnet152", 60192808},
                                        {"googlenet", 6624904}}));
  INFO(c.name);
  const Graph g = build_model(default_spec(c.name));
  CHECK(g.input_dims() == Dims{3, 224, 224});
  CHECK(g.classes() == 1000);
  CHECK(g.param_count() == c.params);
}

TEST_CASE("torchvision models use torchvision's state_dict names, in its order") {
  SECTION("resnet50: bottleneck v1.5 with the downsample after conv3/bn3") {
    const Graph g = build_model(default_spec("resnet50"));
    std::vector<std::string> names;
    for (const TensorSpec& t : g.params()) names.push_back(t.name);
    const std::vector<std::string> head(names.begin(), names.begin() + 17);
    CHECK(head == std::vector<std::string>{
                      "conv1.weight", "bn1.weight", "bn1.bias", "layer1.0.conv1.weight",
                      "layer1.0.bn1.weight", "layer1.0.bn1.bias", "layer1.0.conv2.weight",
                      "layer1.0.bn2.weight", "layer1.0.bn2.bias", "layer1.0.conv3.weight",
                      "layer1.0.bn3.weight", "layer1.0.bn3.bias", "layer1.0.downsample.0.weight",
                      "layer1.0.downsample.1.weight", "layer1.0.downsample.1.bias",
                      "layer1.1.conv1.weight", "layer1.1.bn1.weight"});
    CHECK(names[names.size() - 2] == "fc.weight");
    CHECK(names.back() == "fc.bias");
    CHECK(g.buffers()[0].name == "bn1.running_mean");
    CHECK(g.buffers()[1].name == "bn1.running_var");
    bool found = false;
    for (const TensorSpec& t : g.buffers()) found |= t.name == "layer1.0.downsample.1.running_mean";
    CHECK(found);
    // v1.5: the stride sits on the 3x3 conv, the 1x1 convs keep stride 1.
    for (const Node& n : g.nodes()) {
      if (n.name == "layer2.0.conv1") CHECK(n.conv.stride == 1);
      if (n.name == "layer2.0.conv2") CHECK((n.conv.stride == 2 && n.conv.kernel == 3));
      if (n.name == "layer2.0.downsample.0") CHECK((n.conv.stride == 2 && n.conv.kernel == 1));
      if (n.name == "layer4.2.bn3") CHECK(n.out == Dims{2048, 7, 7});
    }
  }
  SECTION("resnet18: basic blocks, downsample only where the shape changes") {
    const Graph g = build_model(default_spec("resnet18"));
    std::vector<std::string> names;
    for (const TensorSpec& t : g.params()) names.push_back(t.name);
    const auto has = [&](const std::string& n) {
      return std::find(names.begin(), names.end(), n) != names.end();
    };
    CHECK_FALSE(has("layer1.0.downsample.0.weight"));
    CHECK(has("layer2.0.downsample.0.weight"));
    CHECK_FALSE(has("layer2.1.downsample.0.weight"));
    CHECK_FALSE(has("layer1.0.conv3.weight"));
  }
  SECTION("googlenet: BasicConv2d conv/bn pairs, inception branches, no aux heads") {
    const Graph g = build_model(default_spec("googlenet"));
    std::vector<std::string> names;
    for (const TensorSpec& t : g.params()) names.push_back(t.name);
    const std::vector<std::string> head(names.begin(), names.begin() + 10);
    CHECK(head == std::vector<std::string>{"conv1.conv.weight", "conv1.bn.weight", "conv1.bn.bias",
                                           "conv2.conv.weight", "conv2.bn.weight", "conv2.bn.bias",
                                           "conv3.conv.weight", "conv3.bn.weight", "conv3.bn.bias",
                                           "inception3a.branch1.conv.weight"});
    const auto at = [&](const std::string& n) {
      return std::find(names.begin(), names.end(), n) - names.begin();
    };
    CHECK(at("inception3a.branch1.bn.bias") < at("inception3a.branch2.0.conv.weight"));
    CHECK(at("inception3a.branch2.1.conv.weight") < at("inception3a.branch3.0.conv.weight"));
    CHECK(at("inception3a.branch3.1.bn.bias") < at("inception3a.branch4.1.conv.weight"));
    CHECK(at("inception5b.branch4.1.bn.bias") == static_cast<long>(names.size()) - 3);
    CHECK(names.back() == "fc.bias");
    for (const std::string& n : names) CHECK(n.find("aux") == std::string::npos);
    for (const Node& n : g.nodes()) {
      // torchvision's "5x5" branch really uses a 3x3 kernel.
      if (n.name == "inception3a.branch3.1.conv") CHECK((n.conv.kernel == 3 && n.conv.pad == 1));
      if (n.op == Op::BatchNorm) CHECK(n.bn.eps == 1e-3f);
      if (n.op == Op::MaxPool) CHECK(n.pool.ceil_mode);
      if (n.name == "maxpool1") CHECK(n.out == Dims{64, 56, 56});  // floor mode would give 55
      if (n.name == "inception5b") CHECK(n.out == Dims{1024, 7, 7});
      if (n.op == Op::Dropout) CHECK(n.dropout.p == 0.2f);
    }
  }
}

TEST_CASE("ceil-mode pooling follows PyTorch's output size rule") {
  struct Case {
    int64_t in, kernel, stride, pad, ceil_out, floor_out;
  };
  // floor_out 0: the window does not fit in floor mode.
  const Case c = GENERATE(values<Case>({{112, 3, 2, 0, 56, 55},
                                        {4, 3, 2, 0, 2, 1},
                                        {5, 2, 2, 1, 3, 3},  // ceil's extra window would start
                                                             // in the right padding: dropped
                                        {2, 3, 2, 0, 1, 0},  // window larger than the input
                                        {14, 2, 2, 0, 7, 7},
                                        {7, 3, 1, 1, 7, 7}}));
  INFO("in " << c.in << " kernel " << c.kernel << " stride " << c.stride << " pad " << c.pad);
  Graph g({2, c.in, c.in});
  const int y = g.max_pool(g.input(), {c.kernel, c.stride, c.pad, true});
  CHECK(g.node(y).out == Dims{2, c.ceil_out, c.ceil_out});
  if (c.floor_out > 0)
    CHECK(g.node(g.max_pool(g.input(), {c.kernel, c.stride, c.pad, false})).out ==
          Dims{2, c.floor_out, c.floor_out});
  else
    CHECK_THROWS_AS(g.max_pool(g.input(), {c.kernel, c.stride, c.pad, false}),
                    std::invalid_argument);
}

TEST_CASE("concat, dropout and LRN check their inputs and attributes") {
  Graph g({4, 6, 6});
  const int a = g.conv("a", g.input(), {3, 3, 1, 1, false});
  const int b = g.conv("b", g.input(), {5, 1, 1, 0, false});
  const int cat = g.concat({a, b, a}, "cat");
  CHECK(g.node(cat).out == Dims{11, 6, 6});
  CHECK(g.node(cat).name == "cat");
  CHECK_THROWS_AS(g.concat({a}), std::invalid_argument);
  CHECK_THROWS_AS(g.concat({a, g.max_pool(b, {2, 2, 0})}), std::invalid_argument);
  CHECK_THROWS_AS(g.dropout(a, {.p = 1.f}), std::invalid_argument);
  CHECK_THROWS_AS(g.dropout(a, {.p = -0.1f}), std::invalid_argument);
  CHECK(g.node(g.dropout(a, {.p = 0.f})).out == Dims{3, 6, 6});
  CHECK_THROWS_WITH(g.lrn(a, {.size = 4}), Catch::Contains("odd"));
  CHECK_THROWS_AS(g.lrn(g.fully_connected("f", a, {4, true}), {}), std::invalid_argument);
  CHECK_THROWS_AS(g.lrn(a, {.size = 3, .k = 0.f}), std::invalid_argument);
  CHECK_THROWS_WITH(g.avg_pool(a, {3, 2, 0, true}), Catch::Contains("ceil_mode"));
}

TEST_CASE("dropout masks are seeded, deterministic and drop a fraction p, scaled by 1/(1-p)") {
  const DropoutAttr a{.p = 0.2f, .seed = 7};
  const int64_t n = 100000;
  int64_t zeros = 0, others = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float m = dropout_multiplier(a, 3, 5, i);
    zeros += m == 0.f;
    others += m != 0.f && m != 1.f / 0.8f;
  }
  CHECK(others == 0);
  CHECK(static_cast<double>(zeros) / n == Approx(0.2).margin(0.01));
  int same_step = 0, other_step = 0, other_node = 0, other_seed = 0;
  for (int64_t i = 0; i < 1000; ++i) {
    const float m = dropout_multiplier(a, 3, 5, i);
    same_step += m == dropout_multiplier(a, 3, 5, i);
    other_step += m == dropout_multiplier(a, 3, 6, i);
    other_node += m == dropout_multiplier(a, 4, 5, i);
    other_seed += m == dropout_multiplier({.p = 0.2f, .seed = 8}, 3, 5, i);
  }
  CHECK(same_step == 1000);
  // Independent masks agree where both keep or both drop: 0.8^2 + 0.2^2 = 68% of the time.
  CHECK(other_step < 800);
  CHECK(other_node < 800);
  CHECK(other_seed < 800);
  CHECK(dropout_multiplier({.p = 0.f}, 0, 0, 0) == 1.f);
}

TEST_CASE("forward FLOPs count a multiply-add as 2 and match the known multiply-add counts") {
  // Conv and fully connected multiply-adds of torchvision's models at 224x224 (as counted by
  // forward hooks on PyTorch's modules).
  CHECK(build_model(default_spec("resnet50")).forward_macs() == 4089184256);
  CHECK(build_model(default_spec("resnet18")).forward_macs() == 1814073344);
  CHECK(build_model(default_spec("googlenet")).forward_macs() == 1498376192);
  Graph g({2, 4, 4});
  const int c = g.conv("c", g.input(), {3, 3, 1, 1, true});  // 3*4*4 outputs, fan-in 18
  const int bn = g.batch_norm("bn", c);                      // 48 elements
  const int r = g.relu(bn);                                  // 48
  const int p = g.max_pool(r, {2, 2, 0, false});             // 12 outputs, 4 each
  const int cat = g.concat({p, p});                          // free
  const int l = g.lrn(cat, {.size = 3});                     // 24 elements, 2*3+3 each
  const int f = g.fully_connected("fc", l, {5, true});       // 5 outputs, fan-in 24
  g.set_output(f);
  CHECK(g.flops(c) == 48 * (2 * 18 + 1));
  CHECK(g.flops(bn) == 96);
  CHECK(g.flops(r) == 48);
  CHECK(g.flops(p) == 48);
  CHECK(g.flops(cat) == 0);
  CHECK(g.flops(l) == 24 * 9);
  CHECK(g.flops(f) == 5 * (2 * 24 + 1));
  CHECK(g.forward_flops() == 48 * 37 + 96 + 48 + 48 + 24 * 9 + 5 * 49);
  CHECK(g.forward_macs() == 48 * 18 + 5 * 24);
}

TEST_CASE("useful multiply-adds leave out the taps on a convolution's zero padding") {
  Graph g({2, 4, 4});
  // 3x3, stride 1, pad 1 over 4 positions: 2 + 3 + 3 + 2 = 10 taps inside per axis (of 12).
  const int a = g.conv("a", g.input(), {3, 3, 1, 1, false});
  // 7x7, stride 2, pad 3 over 4 inputs, 2 outputs: windows [-3, 4) and [-1, 6): 4 + 4 inside.
  const int b = g.conv("b", a, {5, 7, 2, 3, false});
  const int f = g.fully_connected("fc", b, {6, true});  // no padding: 6 x 5*2*2
  g.set_output(f);
  CHECK(g.forward_macs() == 3 * 2 * 9 * 16 + 5 * 3 * 49 * 4 + 6 * 20);
  CHECK(g.forward_useful_macs() == 3 * 2 * 10 * 10 + 5 * 3 * 8 * 8 + 6 * 20);
  // Training: three passes each, but no backward-data for "a", which reads the input.
  CHECK(g.training_useful_macs() == 2 * 3 * 2 * 10 * 10 + 3 * (5 * 3 * 8 * 8 + 6 * 20));
  // Without padding the two counts agree.
  Graph h({2, 5, 5});
  h.set_output(h.fully_connected("fc", h.conv("c", h.input(), {4, 3, 2, 0, false}), {3, true}));
  CHECK(h.forward_useful_macs() == h.forward_macs());
  // ResNet-50 at 224: the padding taps are a few percent of the direct count.
  const Graph r = build_model(default_spec("resnet50"));
  CHECK(r.forward_useful_macs() < r.forward_macs());
  CHECK(r.forward_useful_macs() > r.forward_macs() * 9 / 10);
}

TEST_CASE("torchvision models take any input and class count, and name the smallest input") {
  const Graph g = build_model({.name = "resnet50", .input = {1, 64, 48}, .classes = 7});
  CHECK(g.classes() == 7);
  CHECK(g.params().front().dims == Dims{64, 1, 7, 7});
  CHECK(build_model({.name = "googlenet", .input = {3, 15, 15}, .classes = 10}).classes() == 10);
  CHECK_THROWS_WITH(build_model({.name = "googlenet", .input = {3, 14, 40}, .classes = 10}),
                    Catch::Contains("googlenet needs an input of at least 15x15"));
  CHECK_THROWS_AS(build_model({.name = "resnet18", .input = {3, 224}, .classes = 10}),
                  std::invalid_argument);
  CHECK_THROWS_AS(build_model({.name = "resnet18", .input = {3, 32, 32}, .classes = 1}),
                  std::invalid_argument);
}

TEST_CASE("init follows torchvision: Kaiming fan-out for ResNet, truncated normal for GoogLeNet") {
  const auto stats = [](const float* w, int64_t n) {
    double sum = 0, sq = 0, largest = 0;
    for (int64_t i = 0; i < n; ++i) {
      sum += w[i];
      sq += static_cast<double>(w[i]) * w[i];
      largest = std::max(largest, std::abs(static_cast<double>(w[i])));
    }
    return std::tuple{sum / n, std::sqrt(sq / n - (sum / n) * (sum / n)), largest};
  };
  const auto find = [](const Graph& g, const std::string& name) {
    for (const TensorSpec& t : g.params())
      if (t.name == name) return t;
    throw std::invalid_argument(name);
  };
  SECTION("googlenet") {
    const Graph g = build_googlenet({.name = "googlenet", .input = {3, 32, 32}, .classes = 10}, 4);
    ParamStore s(g);
    init_params(g, s, 5);
    const TensorSpec w = find(g, "inception4e.branch2.1.conv.weight");
    const auto [mean, sd, largest] = stats(s.params.data() + w.offset, w.size());
    CHECK(mean == Approx(0).margin(1e-3));
    CHECK(sd == Approx(0.01).epsilon(0.05));
    CHECK(largest < 0.07);
    const TensorSpec fc = find(g, "fc.weight");
    CHECK(std::get<1>(stats(s.params.data() + fc.offset, fc.size())) == Approx(0.01).epsilon(0.1));
    const TensorSpec bias = find(g, "fc.bias");  // PyTorch's default: U(+-1/sqrt(256))
    CHECK(std::get<2>(stats(s.params.data() + bias.offset, bias.size())) <= 1.0 / 16);
    CHECK(std::get<2>(stats(s.params.data() + bias.offset, bias.size())) > 0.02);
    const TensorSpec gamma = find(g, "conv1.bn.weight");
    CHECK(std::all_of(s.params.data() + gamma.offset, s.params.data() + gamma.offset + gamma.size(),
                      [](float v) { return v == 1.f; }));
  }
  SECTION("resnet") {
    const Graph g = build_resnet({.name = "r", .input = {3, 32, 32}, .classes = 10},
                                 {.blocks = {1, 1}, .bottleneck = true, .width = 16});
    ParamStore s(g);
    init_params(g, s, 5);
    const TensorSpec w = find(g, "layer2.0.conv2.weight");  // 32 out channels, 3x3: fan-out 288
    CHECK(std::get<1>(stats(s.params.data() + w.offset, w.size())) ==
          Approx(std::sqrt(2.0 / 288)).epsilon(0.05));
  }
}

TEST_CASE("graph counts that do not fit 64 bits throw instead of wrapping") {
  // resnet50 at 3 x 10^7 x 10^7: about 1.6e19 FLOPs (issue 31: printed as -2.08e18).
  ModelSpec big = default_spec("resnet50");
  big.input = {3, 10000000, 10000000};
  const Graph g = build_model(big);
  CHECK_THROWS_AS(g.forward_flops(), std::overflow_error);
  // An input of more than 2^63 elements, or a classifier of more than 2^63 weights.
  CHECK_THROWS_AS(Graph(Dims{3, 8, 400000000000000000}), std::overflow_error);
  ModelSpec wide = default_spec("resnet8");
  wide.classes = 9000000000000000000;
  CHECK_THROWS_AS(build_model(wide), std::overflow_error);
  // Where they fit they are exact: the sum of the layers.
  big.input = {3, 1000000, 1000000};
  const Graph h = build_model(big);
  int64_t sum = 0;
  for (size_t i = 0; i < h.nodes().size(); ++i) sum += h.flops(static_cast<int>(i));
  CHECK(h.forward_flops() == sum);
  CHECK(sum > 0);
}
