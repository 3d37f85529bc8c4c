// Tests for the reference backend, the oracle every other backend is compared with: gradients
// against central differences of the loss for every layer kind, and forwards against hand values.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kernels/executor.hpp"
#include "kernels/graph.hpp"
#include "kernels/loss.hpp"
#include "kernels/reference/reference_executor.hpp"
#include "tests/kernels/backend_conformance.hpp"

using namespace gg::kernels;
using namespace gg::test;

namespace {

// The head every layer under test gets: few classes keep the finite differences cheap.
constexpr int64_t kClasses = 3;

// Inputs kept away from ReLU's kink: |v| in [0.1, 1]. A probe perturbation of eps moves a value by
// at most eps * max|v| = eps, far less than 0.1.
std::vector<float> away_from_zero(int64_t n, Rng& r) {
  std::vector<float> v(n);
  for (float& e : v) e = r.uniform(0.1f, 1.f) * (r.below(2) ? 1.f : -1.f);
  return v;
}

// A graph compiled on the reference backend with random parameters, a batch and labels.
struct Net {
  Net(Graph graph, int64_t batch_size, uint32_t seed)
      : g(std::move(graph)), batch(batch_size), store(g), rng(seed) {
    init_random(g, store, rng, RunningStats::Neutral);
    ex = compile(g, Backend::Reference, batch, store, make_buckets(g, 1));
    x.resize(batch * numel(g.input_dims()));
    for (float& v : x) v = rng.uniform(-1.f, 1.f);
    labels.resize(batch);
    for (int32_t& l : labels)
      l = static_cast<int32_t>(rng.below(static_cast<uint32_t>(g.classes())));
  }
  Net(const Net&) = delete;
  Net& operator=(const Net&) = delete;

  double loss() {
    if (fixed_dropout_step) ex->set_dropout_step(*fixed_dropout_step);
    const float* z = ex->forward(x.data(), true);
    return softmax_cross_entropy(z, labels.data(), batch, g.classes(), nullptr).loss;
  }

  std::vector<float> analytic_gradients() {
    if (fixed_dropout_step) ex->set_dropout_step(*fixed_dropout_step);
    const float* z = ex->forward(x.data(), true);
    std::vector<float> dz(batch * g.classes());
    softmax_cross_entropy(z, labels.data(), batch, g.classes(), dz.data());
    ex->backward(dz.data(), {});
    return store.grads;
  }

  Graph g;
  int64_t batch;
  ParamStore store;
  Rng rng;
  std::unique_ptr<Executor> ex;
  std::vector<float> x;
  std::vector<int32_t> labels;
  // Every training forward draws the same dropout masks, so that the loss is a function of the
  // parameters alone and finite differences mean something.
  std::optional<uint64_t> fixed_dropout_step;
};

struct GradCheck {
  float eps = 1e-2f;
  // Skip elements whose one-sided differences disagree: a ReLU kink lies within eps of them and
  // no difference quotient there means anything. Only for nets whose inputs the test cannot keep
  // off the kinks; the layer tests choose their inputs and run without it.
  bool skip_kinks = false;
};

// Central differences of the loss against backward, for every element of every parameter. An
// element's error is measured against its own size plus a floor of 2% of its tensor's largest
// gradient: the float forward limits the difference quotient to about 1e-4 absolute, while a
// wrong term or index moves elements by the order of that largest gradient. The tensor-wide error
// is also bounded, relative to the gradient's norm.
void check_gradients(Net& net, GradCheck opt = {}) {
  const std::vector<float> analytic = net.analytic_gradients();
  const double l_mid = net.loss();
  for (const TensorSpec& t : net.g.params()) {
    double largest = 0, norm2 = 0, err2 = 0;
    for (int64_t i = 0; i < t.size(); ++i) {
      const double a = analytic[t.offset + i];
      largest = std::max(largest, std::abs(a));
      norm2 += a * a;
    }
    const double floor = 0.02 * largest + 1e-4;
    double worst = 0, worst_num = 0, worst_ana = 0;
    int64_t worst_at = -1, skipped = 0;
    for (int64_t i = 0; i < t.size(); ++i) {
      float& w = net.store.params[t.offset + i];
      const float saved = w;
      w = saved + opt.eps;
      const float up = w;
      const double l_up = net.loss();
      w = saved - opt.eps;
      const float down = w;
      const double l_down = net.loss();
      w = saved;
      const double num = (l_up - l_down) / static_cast<double>(up - down);
      const double ana = analytic[t.offset + i];
      if (opt.skip_kinks) {
        const double forward = (l_up - l_mid) / static_cast<double>(up - saved);
        const double backward = (l_mid - l_down) / static_cast<double>(saved - down);
        if (std::abs(forward - backward) > 0.05 * (std::abs(num) + floor)) {
          ++skipped;
          continue;
        }
      }
      err2 += (num - ana) * (num - ana);
      const double err = std::abs(num - ana) / (std::abs(ana) + floor);
      if (err > worst) {
        worst = err;
        worst_at = i;
        worst_num = num;
        worst_ana = ana;
      }
    }
    const double norm_err = std::sqrt(err2) / (std::sqrt(norm2) + 1e-4);
    INFO(t.name << "[" << worst_at << "]: numeric " << worst_num << ", backward " << worst_ana
                << " (largest |grad| " << largest << ", relative norm error " << norm_err << ", "
                << skipped << " of " << t.size() << " skipped at kinks)");
    CHECK(worst < 2e-2);
    CHECK(norm_err < 1e-2);
    CHECK(skipped <= t.size() / 4);  // kinks are rare; skipping most would prove nothing
  }
}

}  // namespace

TEST_CASE("conv gradients match finite differences for every stride, padding and bias",
          "[reference][gradcheck]") {
  struct Case {
    int64_t kernel, stride, pad;
    bool bias;
  };
  const Case c = GENERATE(values<Case>({{3, 1, 0, false},
                                        {3, 1, 0, true},
                                        {3, 1, 1, false},
                                        {3, 1, 1, true},
                                        {3, 2, 0, false},
                                        {3, 2, 0, true},
                                        {3, 2, 1, false},
                                        {3, 2, 1, true},
                                        {1, 2, 0, false}}));
  INFO("kernel " << c.kernel << " stride " << c.stride << " pad " << c.pad << " bias " << c.bias);
  Graph g({2, 6, 6});
  const int y = g.conv(
      "conv", probe(g, g.input()),
      {.out_channels = 3, .kernel = c.kernel, .stride = c.stride, .pad = c.pad, .bias = c.bias});
  Net net(with_head(std::move(g), y, kClasses), 3, 11);
  make_identity_probe(net.g, net.store);
  check_gradients(net);
}

TEST_CASE("batch norm training gradients match finite differences through the batch statistics",
          "[reference][gradcheck]") {
  SECTION("on a {C,H,W} tensor") {
    Graph g({3, 4, 4});
    const int y = g.batch_norm("bn", probe(g, g.input()));
    Net net(with_head(std::move(g), y, kClasses), 4, 12);
    make_identity_probe(net.g, net.store);
    check_gradients(net);
  }
  SECTION("on a {F} feature vector") {
    Graph g({2, 3, 3});
    const int f = g.fully_connected("fc", probe(g, g.input()), {.out_features = 5});
    const int y = g.batch_norm("bn", f);
    Net net(with_head(std::move(g), y, kClasses), 6, 13);
    make_identity_probe(net.g, net.store);
    check_gradients(net);
  }
}

TEST_CASE("relu gradients match finite differences away from the kink", "[reference][gradcheck]") {
  Graph g({2, 5, 5});
  const int y = g.relu(probe(g, g.input()));
  Net net(with_head(std::move(g), y, kClasses), 3, 14);
  make_identity_probe(net.g, net.store);
  net.x = away_from_zero(static_cast<int64_t>(net.x.size()), net.rng);
  check_gradients(net);
}

TEST_CASE("max pool gradients match finite differences", "[reference][gradcheck]") {
  const PoolAttr a = GENERATE(values<PoolAttr>({{2, 2, 0}, {3, 2, 1}, {3, 1, 1}}));
  INFO("kernel " << a.kernel << " stride " << a.stride << " pad " << a.pad);
  Graph g({2, 6, 6});
  const int y = g.max_pool(probe(g, g.input()), a);
  Net net(with_head(std::move(g), y, kClasses), 3, 15);
  make_identity_probe(net.g, net.store);
  net.x = distinct_per_plane(3 * 2, 36, net.rng);
  check_gradients(net);
}

TEST_CASE("avg pool gradients match finite differences", "[reference][gradcheck]") {
  const PoolAttr a = GENERATE(values<PoolAttr>({{2, 2, 0}, {3, 2, 1}, {3, 1, 1}}));
  INFO("kernel " << a.kernel << " stride " << a.stride << " pad " << a.pad);
  Graph g({2, 7, 7});
  const int y = g.avg_pool(probe(g, g.input()), a);
  Net net(with_head(std::move(g), y, kClasses), 3, 16);
  make_identity_probe(net.g, net.store);
  check_gradients(net);
}

TEST_CASE("global avg pool gradients match finite differences", "[reference][gradcheck]") {
  Graph g({3, 4, 5});
  const int y = g.global_avg_pool(probe(g, g.input()));
  Net net(with_head(std::move(g), y, kClasses), 3, 17);
  make_identity_probe(net.g, net.store);
  check_gradients(net);
}

TEST_CASE("fully connected gradients match finite differences on a flattened input",
          "[reference][gradcheck]") {
  const bool bias = GENERATE(false, true);
  INFO("bias " << bias);
  Graph g({2, 3, 4});
  const int y = g.fully_connected("fc", probe(g, g.input()), {.out_features = 4, .bias = bias});
  Net net(with_head(std::move(g), y, kClasses), 3, 18);
  make_identity_probe(net.g, net.store);
  check_gradients(net);
}

TEST_CASE("add sums the gradients of a tensor consumed by several nodes",
          "[reference][gradcheck]") {
  SECTION("residual: the probe feeds both a conv and the add") {
    Graph g({2, 5, 5});
    const int t = probe(g, g.input());
    const int y = g.add(g.conv("conv", t, {.out_channels = 2, .kernel = 3, .pad = 1}), t);
    Net net(with_head(std::move(g), y, kClasses), 3, 19);
    make_identity_probe(net.g, net.store);
    check_gradients(net);
  }
  SECTION("the same tensor on both inputs of an add") {
    Graph g({2, 4, 4});
    const int t = probe(g, g.input());
    const int y = g.add(t, t);
    Net net(with_head(std::move(g), y, kClasses), 3, 20);
    make_identity_probe(net.g, net.store);
    check_gradients(net);
  }
  SECTION("three consumers: the head also reads the tensor through a second path") {
    Graph g({2, 4, 4});
    const int t = probe(g, g.input());
    const int a = g.add(g.conv("conv", t, {.out_channels = 2, .kernel = 1, .pad = 0}), t);
    const int y = g.add(a, t);
    Net net(with_head(std::move(g), y, kClasses), 3, 21);
    make_identity_probe(net.g, net.store);
    check_gradients(net);
  }
}

TEST_CASE("a residual block (conv, bn, relu, add, gap, fc) matches finite differences end to end",
          "[reference][gradcheck]") {
  Graph g({2, 4, 4});
  const int stem = g.relu(g.batch_norm("bn0", g.conv("conv0", g.input(), {.out_channels = 3})));
  const int a = g.relu(g.batch_norm("bn1", g.conv("conv1", stem, {.out_channels = 3})));
  const int b = g.batch_norm("bn2", g.conv("conv2", a, {.out_channels = 3}));
  const int pooled = g.global_avg_pool(g.relu(g.add(b, stem)));
  Net net(with_head(std::move(g), pooled, 4), 2, 22);
  // The ReLU inputs here are not chosen by the test, so a few sit within a step of their kink.
  check_gradients(net, {.eps = 2e-3f, .skip_kinks = true});
}

TEST_CASE("conv computes cross-correlation with {O,I,k,k} weights, bias, stride and zero padding",
          "[reference]") {
  // x: one sample, one channel, 3x3 holding 1..9.
  const std::vector<float> x = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  SECTION("2x2 asymmetric kernel, stride 1, no padding, bias") {
    Graph g({1, 3, 3});
    const int y =
        g.conv("conv", g.input(), {.out_channels = 1, .kernel = 2, .pad = 0, .bias = true});
    g.set_output(g.fully_connected("head", y, {.out_features = 4, .bias = false}));
    ParamStore s(g);
    const float w[] = {1, 2, 3, 4};
    std::copy(w, w + 4, param(g, s, "conv.weight"));
    param(g, s, "conv.bias")[0] = 0.5f;
    float* head = param(g, s, "head.weight");
    for (int i = 0; i < 4; ++i) head[i * 4 + i] = 1.f;
    auto ex = make_reference_executor(g, 1, s, make_buckets(g, 1));
    const float* z = ex->forward(x.data(), false);
    // y[0,0] = 1*1 + 2*2 + 3*4 + 4*5 = 37; a flipped (true) convolution would give 23.
    CHECK(std::vector<float>(z, z + 4) == std::vector<float>{37.5f, 47.5f, 67.5f, 77.5f});
  }
  SECTION("3x3 ones kernel, stride 2, padding 1") {
    Graph g({1, 3, 3});
    const int y =
        g.conv("conv", g.input(), {.out_channels = 1, .kernel = 3, .stride = 2, .pad = 1});
    g.set_output(g.fully_connected("head", y, {.out_features = 4, .bias = false}));
    ParamStore s(g);
    std::fill_n(param(g, s, "conv.weight"), 9, 1.f);
    float* head = param(g, s, "head.weight");
    for (int i = 0; i < 4; ++i) head[i * 4 + i] = 1.f;
    auto ex = make_reference_executor(g, 1, s, make_buckets(g, 1));
    const float* z = ex->forward(x.data(), false);
    CHECK(std::vector<float>(z, z + 4) == std::vector<float>{12, 16, 24, 28});
  }
  SECTION("1x1 kernel mixes channels as y[o] = sum_c w[o,c] x[c], per sample") {
    Graph g({2, 1, 1});
    const int y = g.conv("conv", g.input(), {.out_channels = 2, .kernel = 1, .pad = 0});
    g.set_output(g.fully_connected("head", y, {.out_features = 2, .bias = false}));
    ParamStore s(g);
    const float w[] = {1, 2, 3, 4};  // w[0,1] = 2: out channel 0 reads in channel 1 twice
    std::copy(w, w + 4, param(g, s, "conv.weight"));
    float* head = param(g, s, "head.weight");
    head[0] = head[3] = 1.f;
    auto ex = make_reference_executor(g, 2, s, make_buckets(g, 1));
    const std::vector<float> in = {1, 10, 2, 20};  // sample 0: (1, 10), sample 1: (2, 20)
    const float* z = ex->forward(in.data(), false);
    CHECK(std::vector<float>(z, z + 4) == std::vector<float>{21, 43, 42, 86});
  }
}

TEST_CASE("max pool takes the window maximum and padding never wins", "[reference]") {
  Graph g({1, 4, 4});
  SECTION("2x2 windows, stride 2") {
    g.set_output(g.fully_connected("head", g.max_pool(g.input(), {2, 2, 0}),
                                   {.out_features = 4, .bias = false}));
    ParamStore s(g);
    for (int i = 0; i < 4; ++i) param(g, s, "head.weight")[i * 4 + i] = 1.f;
    auto ex = make_reference_executor(g, 1, s, make_buckets(g, 1));
    const std::vector<float> x = {1, 5, 2, 0,  //
                                  3, 4, 8, 1,  //
                                  9, 0, 3, 3,  //
                                  2, 7, 6, 4};
    const float* z = ex->forward(x.data(), false);
    CHECK(std::vector<float>(z, z + 4) == std::vector<float>{5, 8, 9, 6});
  }
  SECTION("3x3 windows, stride 2, padding 1 on an all-negative input") {
    g.set_output(g.fully_connected("head", g.max_pool(g.input(), {3, 2, 1}),
                                   {.out_features = 4, .bias = false}));
    ParamStore s(g);
    for (int i = 0; i < 4; ++i) param(g, s, "head.weight")[i * 4 + i] = 1.f;
    auto ex = make_reference_executor(g, 1, s, make_buckets(g, 1));
    std::vector<float> x(16);
    for (int i = 0; i < 16; ++i) x[i] = -1.f - static_cast<float>(i);  // -1 .. -16
    const float* z = ex->forward(x.data(), false);
    // Windows cover rows/cols {-1,0,1} and {1,2,3}; a zero padding would have won every window.
    CHECK(std::vector<float>(z, z + 4) == std::vector<float>{-1, -2, -5, -6});
  }
}

TEST_CASE("max pool sends the gradient to the first maximum in scan order", "[reference]") {
  // Channel 0 holds the pooled values, with ties; channel 1 holds each pixel's index. The probe
  // conv passes channel 0 through (weight {1, 0}), so d probe.weight[0,1] = sum over windows of
  // dlogit * (index of the pixel that received the gradient).
  Graph g({2, 4, 4});
  const int t = g.conv("probe", g.input(), {.out_channels = 1, .kernel = 1, .pad = 0});
  g.set_output(
      g.fully_connected("head", g.max_pool(t, {2, 2, 0}), {.out_features = 4, .bias = false}));
  ParamStore s(g);
  param(g, s, "probe.weight")[0] = 1.f;
  for (int i = 0; i < 4; ++i) param(g, s, "head.weight")[i * 4 + i] = 1.f;
  auto ex = make_reference_executor(g, 1, s, make_buckets(g, 1));
  std::vector<float> x = {7, 7, 1, 2,   //  window 0: four-way tie, first is 0
                          7, 7, 3, 3,   //  window 1: tie at 6 and 7
                          0, 5, 4, 4,   //  window 2: single max at 13
                          1, 9, 4, 4};  //  window 3: four-way tie, first is 10
  for (int i = 0; i < 16; ++i) x.push_back(static_cast<float>(i));
  ex->forward(x.data(), true);
  // Radix 16 keeps each window's pixel index apart in the one summed gradient.
  const std::vector<float> dlogits = {1, 16, 256, 4096};
  ex->backward(dlogits.data(), {});
  CHECK(s.grads[spec(g, "probe.weight").offset + 1] == 0 + 16 * 6 + 256 * 13 + 4096 * 10);
}

TEST_CASE("avg pool divides by the full kernel area, padding included", "[reference]") {
  Graph g({1, 3, 3});
  g.set_output(g.fully_connected("head", g.avg_pool(g.input(), {3, 2, 1}),
                                 {.out_features = 4, .bias = false}));
  ParamStore s(g);
  for (int i = 0; i < 4; ++i) param(g, s, "head.weight")[i * 4 + i] = 1.f;
  auto ex = make_reference_executor(g, 1, s, make_buckets(g, 1));
  const std::vector<float> x(9, 1.f);
  const float* z = ex->forward(x.data(), false);
  // Every window covers 4 real ones and 5 padded zeros.
  for (int i = 0; i < 4; ++i) CHECK(z[i] == Approx(4.0 / 9.0));
}

TEST_CASE("global avg pool averages each channel of each sample", "[reference]") {
  Graph g({2, 2, 2});
  g.set_output(
      g.fully_connected("head", g.global_avg_pool(g.input()), {.out_features = 2, .bias = false}));
  ParamStore s(g);
  param(g, s, "head.weight")[0] = param(g, s, "head.weight")[3] = 1.f;
  auto ex = make_reference_executor(g, 2, s, make_buckets(g, 1));
  const std::vector<float> x = {1, 2, 3, 4, 10, 20, 30, 40, -1, -1, -1, -1, 0, 0, 0, 8};
  const float* z = ex->forward(x.data(), false);
  CHECK(std::vector<float>(z, z + 4) == std::vector<float>{2.5f, 25, -1, 2});
}

TEST_CASE("fully connected computes x W^T + b on the flattened input", "[reference]") {
  Graph g({1, 1, 3});
  g.set_output(g.fully_connected("fc", g.input(), {.out_features = 2}));
  ParamStore s(g);
  const float w[] = {1, 2, 3, -1, 0, 1};  // W is {2, 3}: row o holds output o's weights
  std::copy(w, w + 6, param(g, s, "fc.weight"));
  param(g, s, "fc.bias")[0] = 0.5f;
  param(g, s, "fc.bias")[1] = -0.5f;
  auto ex = make_reference_executor(g, 2, s, make_buckets(g, 1));
  const std::vector<float> x = {1, 1, 1, 1, 2, 3};
  const float* z = ex->forward(x.data(), false);
  CHECK(std::vector<float>(z, z + 4) == std::vector<float>{6.5f, -0.5f, 14.5f, 1.5f});
}

TEST_CASE("batch norm in eval mode normalises with the running statistics and leaves them alone",
          "[reference]") {
  Graph g({2, 1, 2});
  const int y = g.batch_norm("bn", g.input());
  g.set_output(g.fully_connected("head", y, {.out_features = 4, .bias = false}));
  ParamStore s(g);
  for (int i = 0; i < 4; ++i) param(g, s, "head.weight")[i * 4 + i] = 1.f;
  const float gamma[] = {2.f, 0.5f}, beta[] = {1.f, -1.f}, mean[] = {0.5f, -1.f},
              var[] = {4.f, 0.25f};
  std::copy(gamma, gamma + 2, param(g, s, "bn.weight"));
  std::copy(beta, beta + 2, param(g, s, "bn.bias"));
  std::copy(mean, mean + 2, buffer(g, s, "bn.running_mean"));
  std::copy(var, var + 2, buffer(g, s, "bn.running_var"));
  const std::vector<float> before = s.buffers;
  auto ex = make_reference_executor(g, 2, s, make_buckets(g, 1));
  const std::vector<float> x = {2.5f, -1.5f, 0.f, 1.f, 4.5f, 0.5f, -2.f, -1.5f};
  const float* z = ex->forward(x.data(), false);
  for (int n = 0; n < 2; ++n)
    for (int c = 0; c < 2; ++c)
      for (int i = 0; i < 2; ++i) {
        const int at = (n * 2 + c) * 2 + i;
        const double want = gamma[c] * (x[at] - mean[c]) / std::sqrt(var[c] + 1e-5) + beta[c];
        INFO("sample " << n << " channel " << c << " pixel " << i);
        CHECK(z[at] == Approx(want).epsilon(1e-6));
      }
  CHECK(z[0] == Approx(3.0).epsilon(1e-4));  // 2 * (2.5 - 0.5) / 2 + 1, by hand
  CHECK(s.buffers == before);
}

TEST_CASE("batch norm training forward uses biased batch variance and updates running statistics",
          "[reference]") {
  Graph g({2, 1, 3});
  const int y = g.batch_norm("bn", g.input(), {.eps = 1e-5f, .momentum = 0.25f});
  g.set_output(g.fully_connected("head", y, {.out_features = 6, .bias = false}));
  ParamStore s(g);
  for (int i = 0; i < 6; ++i) param(g, s, "head.weight")[i * 6 + i] = 1.f;
  std::fill_n(param(g, s, "bn.weight"), 2, 1.f);
  const float old_mean[] = {1.f, 2.f}, old_var[] = {3.f, 4.f};
  std::copy(old_mean, old_mean + 2, buffer(g, s, "bn.running_mean"));
  std::copy(old_var, old_var + 2, buffer(g, s, "bn.running_var"));
  auto ex = make_reference_executor(g, 2, s, make_buckets(g, 1));
  // Channel 0 holds 1..6 (mean 3.5, biased var 35/12, unbiased 3.5); channel 1 holds 0,0,0,0,0,6
  // (mean 1, biased var 5, unbiased 6).
  const std::vector<float> x = {1, 2, 3, 0, 0, 0, 4, 5, 6, 0, 0, 6};
  const float* z = ex->forward(x.data(), true);
  CHECK(z[0] == Approx((1 - 3.5) / std::sqrt(35.0 / 12 + 1e-5)).epsilon(1e-5));
  CHECK(z[3] == Approx((0 - 1) / std::sqrt(5 + 1e-5)).epsilon(1e-5));
  CHECK(buffer(g, s, "bn.running_mean")[0] == Approx(0.75 * 1 + 0.25 * 3.5));
  CHECK(buffer(g, s, "bn.running_mean")[1] == Approx(0.75 * 2 + 0.25 * 1));
  CHECK(buffer(g, s, "bn.running_var")[0] == Approx(0.75 * 3 + 0.25 * 3.5));
  CHECK(buffer(g, s, "bn.running_var")[1] == Approx(0.75 * 4 + 0.25 * 6));
  SECTION("a second training forward applies the update again, from the new values") {
    ex->forward(x.data(), true);
    CHECK(buffer(g, s, "bn.running_mean")[0] ==
          Approx(0.75 * (0.75 * 1 + 0.25 * 3.5) + 0.25 * 3.5));
  }
}

namespace {

// conv, bn, relu, conv, residual add, relu, gap, fc: seven parameters over five nodes.
Graph residual_net() {
  Graph g({2, 6, 6});
  const int a =
      g.relu(g.batch_norm("bn1", g.conv("conv1", g.input(), {.out_channels = 4, .bias = true})));
  const int b = g.conv("conv2", a, {.out_channels = 4});
  g.set_output(
      g.fully_connected("fc", g.global_avg_pool(g.relu(g.add(b, a))), {.out_features = 3}));
  return g;
}

}  // namespace

TEST_CASE("bucket callbacks fire once each, in bucket order, after their gradients are final",
          "[reference]") {
  const int64_t bucket_elements = GENERATE(1, 40, 1000000);
  INFO("bucket_elements " << bucket_elements);
  const Graph g = residual_net();
  const std::vector<Bucket> buckets = make_buckets(g, bucket_elements);
  ParamStore s(g);
  Rng r(30);
  init_random(g, s, r, RunningStats::Neutral);
  auto ex = make_reference_executor(g, 2, s, buckets);
  std::vector<float> x(2 * 72);
  for (float& v : x) v = r.uniform(-1.f, 1.f);
  ex->forward(x.data(), true);
  const std::vector<float> dlogits = {0.1f, -0.3f, 0.2f, -0.25f, 0.05f, 0.2f};
  check_bucket_callbacks(*ex, s.grads, buckets, dlogits.data(), spec(g, "conv1.weight").offset);
}

TEST_CASE("backward overwrites the gradients instead of accumulating", "[reference]") {
  const Graph g = residual_net();
  ParamStore s(g);
  Rng r(31);
  init_random(g, s, r, RunningStats::Neutral);
  auto ex = make_reference_executor(g, 2, s, make_buckets(g, 1));
  std::vector<float> x(2 * 72);
  for (float& v : x) v = r.uniform(-1.f, 1.f);
  const std::vector<float> dlogits = {0.1f, -0.3f, 0.2f, -0.25f, 0.05f, 0.2f};
  ex->forward(x.data(), true);
  check_backward_overwrites(*ex, s.grads, x.data(), dlogits.data(), {});
}

TEST_CASE("backward without a preceding training forward throws logic_error", "[reference]") {
  const Graph g = residual_net();
  ParamStore s(g);
  auto ex = make_reference_executor(g, 2, s, make_buckets(g, 1));
  const std::vector<float> x(2 * 72, 0.5f);
  const std::vector<float> dlogits(6, 0.1f);
  check_backward_needs_training_forward(*ex, x.data(), dlogits.data(), {});
}

TEST_CASE("compile on the reference backend gives the same logits as make_reference_executor",
          "[reference]") {
  const Graph g = residual_net();
  ParamStore s(g);
  Rng r(32);
  init_random(g, s, r, RunningStats::Neutral);
  std::vector<float> x(2 * 72);
  for (float& v : x) v = r.uniform(-1.f, 1.f);
  auto a = make_reference_executor(g, 2, s, make_buckets(g, 1));
  auto b = compile(g, Backend::Reference, 2, s, make_buckets(g, 1));
  const float* za = a->forward(x.data(), false);
  const std::vector<float> logits(za, za + 6);
  const float* zb = b->forward(x.data(), false);
  CHECK(std::vector<float>(zb, zb + 6) == logits);
  CHECK(b->batch() == 2);
}

TEST_CASE("ceil-mode max pool gradients match finite differences, edge windows included",
          "[reference][gradcheck]") {
  struct Case {
    int64_t in;
    PoolAttr a;
  };
  // 7 -> 4 and 4 -> 2 with a last window hanging off the input; 5 -> 3 where ceil's extra window
  // is dropped; 2 -> 1 with a window larger than the input; inception's stride-1 pool.
  const Case c = GENERATE(values<Case>({{7, {3, 2, 0, true}},
                                        {4, {3, 2, 0, true}},
                                        {5, {2, 2, 1, true}},
                                        {2, {3, 2, 0, true}},
                                        {6, {3, 1, 1, true}},
                                        {7, {2, 2, 0, true}}}));
  INFO("in " << c.in << " kernel " << c.a.kernel << " stride " << c.a.stride << " pad " << c.a.pad);
  Graph g({2, c.in, c.in});
  const int y = g.max_pool(probe(g, g.input()), c.a);
  Net net(with_head(std::move(g), y, kClasses), 3, 40);
  make_identity_probe(net.g, net.store);
  net.x = distinct_per_plane(3 * 2, c.in * c.in, net.rng);
  check_gradients(net);
}

TEST_CASE("concat gradients match finite differences", "[reference][gradcheck]") {
  SECTION("three branches of different widths") {
    Graph g({2, 4, 4});
    const int p = probe(g, g.input());
    const int a = g.conv("a", p, {.out_channels = 3, .kernel = 1, .pad = 0});
    const int b = g.conv("b", p, {.out_channels = 1, .kernel = 3, .pad = 1});
    const int y = g.concat({a, p, b});
    Net net(with_head(std::move(g), y, kClasses), 3, 41);
    make_identity_probe(net.g, net.store);
    check_gradients(net);
  }
  SECTION("the same tensor twice, next to the graph input") {
    Graph g({2, 4, 4});
    const int p = probe(g, g.input());
    const int y = g.concat({p, g.input(), p});
    Net net(with_head(std::move(g), y, kClasses), 3, 42);
    make_identity_probe(net.g, net.store);
    check_gradients(net);
  }
}

TEST_CASE("dropout gradients match finite differences under a fixed mask",
          "[reference][gradcheck]") {
  const float p = GENERATE(0.f, 0.3f, 0.6f);
  INFO("p " << p);
  Graph g({2, 4, 4});
  const int y = g.dropout(probe(g, g.input()), {.p = p, .seed = 9});
  Net net(with_head(std::move(g), y, kClasses), 3, 43);
  make_identity_probe(net.g, net.store);
  net.fixed_dropout_step = 4;
  check_gradients(net);
}

TEST_CASE("LRN gradients match finite differences", "[reference][gradcheck]") {
  struct Case {
    int64_t channels;
    LrnAttr a;
  };
  // Large alpha so that the normalisation matters; windows wider than the channel count.
  const Case c = GENERATE(values<Case>({{4, {.size = 3, .alpha = 0.5f, .beta = 0.75f, .k = 2.f}},
                                        {5, {.size = 5, .alpha = 1.f, .beta = 0.75f, .k = 1.f}},
                                        {2, {.size = 5, .alpha = 2.f, .beta = 0.5f, .k = 1.f}},
                                        {3, {.size = 1, .alpha = 1.f, .beta = 1.f, .k = 0.5f}}}));
  INFO("channels " << c.channels << " size " << c.a.size);
  Graph g({c.channels, 3, 3});
  const int y = g.lrn(probe(g, g.input()), c.a);
  Net net(with_head(std::move(g), y, kClasses), 3, 44);
  make_identity_probe(net.g, net.store);
  check_gradients(net);
}

TEST_CASE(
    "an inception block (branches, ceil max pool, concat, dropout) matches finite "
    "differences end to end",
    "[reference][gradcheck]") {
  Graph g({3, 5, 5});
  const int stem = g.relu(g.batch_norm("bn0", g.conv("conv0", g.input(), {.out_channels = 4})));
  const int b1 = g.conv("b1", stem, {.out_channels = 2, .kernel = 1, .pad = 0});
  const int b2 =
      g.conv("b2", g.relu(g.conv("b2r", stem, {.out_channels = 2, .kernel = 1, .pad = 0})),
             {.out_channels = 3});
  const int b4 =
      g.conv("b4", g.max_pool(stem, {3, 1, 1, true}), {.out_channels = 2, .kernel = 1, .pad = 0});
  const int cat = g.max_pool(g.concat({b1, b2, b4}), {2, 2, 0, true});
  const int y = g.dropout(g.global_avg_pool(cat), {.p = 0.25f, .seed = 3});
  Net net(with_head(std::move(g), y, 4), 2, 45);
  net.fixed_dropout_step = 0;
  check_gradients(net, {.eps = 1e-3f, .skip_kinks = true});
}

TEST_CASE("ceil-mode max pool gives PyTorch's values on windows hanging off the input",
          "[reference]") {
  // torch.nn.functional.max_pool2d(torch.arange(1., 17.).view(1, 1, 4, 4), 3, 2, 0,
  // ceil_mode=True) is [[11, 12], [15, 16]]: the second window covers rows and columns 2..4.
  Graph g({1, 4, 4});
  g.set_output(g.fully_connected("head", g.max_pool(g.input(), {3, 2, 0, true}),
                                 {.out_features = 4, .bias = false}));
  ParamStore s(g);
  for (int i = 0; i < 4; ++i) param(g, s, "head.weight")[i * 4 + i] = 1.f;
  auto ex = make_reference_executor(g, 1, s, make_buckets(g, 1));
  std::vector<float> x(16);
  for (int i = 0; i < 16; ++i) x[i] = static_cast<float>(i + 1);
  const float* z = ex->forward(x.data(), false);
  CHECK(std::vector<float>(z, z + 4) == std::vector<float>{11, 12, 15, 16});
}

TEST_CASE("concat stacks the inputs' channels per sample, in input order", "[reference]") {
  Graph g({1, 1, 2});
  const int y = g.concat({g.input(), g.input()});
  g.set_output(g.fully_connected("head", y, {.out_features = 4, .bias = false}));
  ParamStore s(g);
  for (int i = 0; i < 4; ++i) param(g, s, "head.weight")[i * 4 + i] = 1.f;
  auto ex = make_reference_executor(g, 2, s, make_buckets(g, 1));
  const std::vector<float> x = {1, 2, 3, 4};  // sample 0: (1, 2), sample 1: (3, 4)
  const float* z = ex->forward(x.data(), false);
  CHECK(std::vector<float>(z, z + 8) == std::vector<float>{1, 2, 1, 2, 3, 4, 3, 4});
}

TEST_CASE("LRN gives PyTorch's nn.LocalResponseNorm values", "[reference]") {
  // torch.nn.LocalResponseNorm(3, alpha=0.5, beta=0.75, k=2.)(x) for x of shape (1, 4, 1, 2)
  // holding the values below (channel-major), as printed by PyTorch 1.13.
  const std::vector<float> x = {1, -2, 3, 0.5f, -1.5f, 2.5f, 4, -0.5f};
  const std::vector<double> want = {0.37739524245262146, -0.9473345875740051, 1.0524485111236572,
                                    0.18554385006427765, -0.3667118549346924, 1.0636591911315918,
                                    1.1888563632965088,  -0.21488426625728607};
  Graph g({4, 1, 2});
  const int y = g.lrn(g.input(), {.size = 3, .alpha = 0.5f, .beta = 0.75f, .k = 2.f});
  g.set_output(g.fully_connected("head", y, {.out_features = 8, .bias = false}));
  ParamStore s(g);
  for (int i = 0; i < 8; ++i) param(g, s, "head.weight")[i * 8 + i] = 1.f;
  auto ex = make_reference_executor(g, 1, s, make_buckets(g, 1));
  const float* z = ex->forward(x.data(), false);
  for (int i = 0; i < 8; ++i) {
    INFO("element " << i);
    CHECK(z[i] == Approx(want[i]).epsilon(1e-6));
  }
}

TEST_CASE("dropout: identity in eval, the seeded inverted mask in training", "[reference]") {
  Graph g({3, 4, 4});
  const DropoutAttr a{.p = 0.5f, .seed = 21};
  const int d = g.dropout(g.input(), a);
  g.set_output(g.fully_connected("head", d, {.out_features = 48, .bias = false}));
  ParamStore s(g);
  for (int i = 0; i < 48; ++i) param(g, s, "head.weight")[i * 48 + i] = 1.f;
  auto ex = make_reference_executor(g, 2, s, make_buckets(g, 1));
  std::vector<float> x(96);
  for (int i = 0; i < 96; ++i) x[i] = 0.25f * static_cast<float>(i + 1);
  const float* z = ex->forward(x.data(), false);
  CHECK(std::vector<float>(z, z + 96) == x);
  CHECK(ex->dropout_step() == 0);  // eval forwards draw no mask
  for (uint64_t step = 0; step < 2; ++step) {
    INFO("step " << step);
    z = ex->forward(x.data(), true);
    int zeros = 0;
    for (int i = 0; i < 96; ++i) {
      CHECK(z[i] == x[i] * dropout_multiplier(a, d, step, i));
      zeros += z[i] == 0.f;
    }
    CHECK(zeros > 20);
    CHECK(zeros < 76);
  }
  CHECK(ex->dropout_step() == 2);
}
