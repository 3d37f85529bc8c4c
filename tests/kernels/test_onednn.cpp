// Tests for the oneDNN backend against the reference backend, the oracle: every layer kind,
// forward and backward, on shapes that steer oneDNN into its blocked layouts and out of them
// (channel counts that are and are not multiples of 8 and 16), the model zoo, bucket callbacks,
// several training steps, and the executor contract.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "kernels/executor.hpp"
#include "kernels/graph.hpp"
#include "kernels/loss.hpp"
#include "kernels/models.hpp"
#include "kernels/optimizer.hpp"
#include "tests/kernels/backend_conformance.hpp"

using namespace gg::kernels;
using namespace gg::test;

namespace {

// Tolerances (see compare_tensor). The reference accumulates in double; oneDNN accumulates in
// float, in blocked and vectorised orders of its own. Measured, the two backends differ by about
// 1e-6 of a tensor's scale in forwards and 1e-5 in gradients.
constexpr double kForwardTol = 1e-4;
constexpr double kGradTol = 5e-4;
constexpr double kTrainingTol = 2e-3;
constexpr Target kOneDnn{.backend = Backend::OneDnn,
                         .precision = Precision::Fp32,
                         .forward_tol = kForwardTol,
                         .grad_tol = kGradTol,
                         .training_tol = kTrainingTol};

// The head every layer under test gets.
constexpr int64_t kClasses = 5;

}  // namespace

TEST_CASE("onednn conv matches the reference for every kernel, stride, padding, bias and width",
          "[onednn]") {
  struct Case {
    int64_t in, out, kernel, stride, pad;
    bool bias;
  };
  // Channel counts 1, 3, 5 (plain layouts) and 8, 16, 24 (blocked), in and out, every kernel
  // size with each stride, with and without padding and bias.
  const Case c = GENERATE(values<Case>({{1, 8, 3, 1, 1, false},
                                        {3, 16, 3, 2, 1, true},
                                        {8, 8, 1, 1, 0, false},
                                        {16, 24, 1, 2, 0, true},
                                        {24, 16, 3, 1, 0, true},
                                        {3, 8, 7, 2, 3, false},
                                        {8, 3, 7, 1, 3, true},
                                        {16, 16, 3, 1, 1, false},
                                        {5, 24, 3, 2, 0, false},
                                        {24, 1, 3, 1, 1, true},
                                        {16, 5, 7, 2, 0, true}}));
  const int64_t batch = GENERATE(1, 3, 8);
  INFO("in " << c.in << " out " << c.out << " kernel " << c.kernel << " stride " << c.stride
             << " pad " << c.pad << " bias " << c.bias << " batch " << batch);
  Graph g({c.in, 9, 9});
  const int y = g.conv("conv", probe(g, g.input()),
                       {.out_channels = c.out,
                        .kernel = c.kernel,
                        .stride = c.stride,
                        .pad = c.pad,
                        .bias = c.bias});
  Twin t(kOneDnn, with_head(std::move(g), y, kClasses), batch, 100);
  t.check_train_step();
}

TEST_CASE("onednn conv on Winograd matches the reference, forward and both backward passes",
          "[onednn]") {
  // Batch 16, 3x3 stride 1, fp32: oneDNN 2.6 picks its Winograd kernel for the forward at 64
  // channels, 28x28 and 14x14, on AVX-512 (the executor lets it from 32 inputs and 64 outputs:
  // winograd_pays); the executor then asks for it in backward-data and backward-weights too
  // (ONEDNN_VERBOSE=1 shows jit_wino_4x3 in all three here).
  const std::pair<int64_t, int64_t> shape =
      GENERATE(std::pair<int64_t, int64_t>{64, 28}, std::pair<int64_t, int64_t>{64, 14});
  const auto [channels, size] = shape;
  INFO("channels " << channels << " size " << size);
  Graph g({channels, size, size});
  const int y = g.conv("conv", probe(g, g.input()),
                       {.out_channels = channels, .kernel = 3, .stride = 1, .pad = 1});
  Twin t(kOneDnn, with_head(std::move(g), y, kClasses), 16, 101);
  t.check_train_step();
}

TEST_CASE("onednn batch norm training matches the reference: output, running stats, gradients",
          "[onednn]") {
  SECTION("on a {C,H,W} tensor") {
    const int64_t channels = GENERATE(1, 3, 8, 16, 24);
    const int64_t batch = GENERATE(1, 3, 8);
    INFO("channels " << channels << " batch " << batch);
    Graph g({channels, 5, 6});
    const int y = g.batch_norm("bn", probe(g, g.input(), false), {.eps = 1e-5f, .momentum = 0.3f});
    Twin t(kOneDnn, with_head(std::move(g), y, kClasses), batch, 200);
    t.check_train_step();
    // A second step: the running statistics move on from the updated values on both backends.
    t.check_train_step();
  }
  SECTION("on a {F} feature vector") {
    const int64_t features = GENERATE(3, 16, 24);
    const int64_t batch = GENERATE(3, 8);  // batch 1: one value per channel, which training rejects
    INFO("features " << features << " batch " << batch);
    Graph g({3, 4, 4});
    const int f = g.fully_connected("fc", probe(g, g.input(), false),
                                    {.out_features = features, .bias = false});
    const int y = g.batch_norm("bn", f);
    Twin t(kOneDnn, with_head(std::move(g), y, kClasses), batch, 201);
    t.check_train_step();
    t.check_train_step();
  }
}

TEST_CASE("onednn batch norm eval forward uses the running stats and leaves them unchanged",
          "[onednn]") {
  const int64_t channels = GENERATE(3, 16);
  const int64_t batch = GENERATE(1, 8);
  INFO("channels " << channels << " batch " << batch);
  Graph g({channels, 5, 5});
  const int y = g.batch_norm("bn", probe(g, g.input(), false));
  Twin t(kOneDnn, with_head(std::move(g), y, kClasses), batch, 300);
  // The running statistics are random, so batch statistics in their place would not match.
  t.check_forward(false);
  // After a training forward has moved them, eval reads the moved values.
  t.check_forward(true);
  t.check_forward(false);
}

TEST_CASE("onednn relu in place (one consumer) matches the reference forward and backward",
          "[onednn]") {
  const int64_t channels = GENERATE(3, 16);
  const int64_t batch = GENERATE(1, 3);
  INFO("channels " << channels << " batch " << batch);
  SECTION("the relu output feeds a conv, whose weight gradient reads the relu output") {
    Graph g({channels, 6, 6});
    const int r = g.relu(probe(g, g.input()));
    const int y = g.conv("conv", r, {.out_channels = 8, .kernel = 3, .pad = 1});
    Twin t(kOneDnn, with_head(std::move(g), y, kClasses), batch, 400);
    t.check_train_step();
  }
  SECTION("two relus in a row, both in place over the same buffer") {
    Graph g({channels, 6, 6});
    const int y = g.relu(g.relu(probe(g, g.input())));
    Twin t(kOneDnn, with_head(std::move(g), y, kClasses), batch, 401);
    t.check_train_step();
  }
}

TEST_CASE("onednn relu out of place (input read twice) keeps its input and matches the reference",
          "[onednn]") {
  const int64_t channels = GENERATE(3, 16);
  const int64_t batch = GENERATE(1, 3);
  INFO("channels " << channels << " batch " << batch);
  SECTION("the relu input also feeds the add") {
    Graph g({channels, 6, 6});
    const int p = probe(g, g.input());
    const int y = g.add(g.relu(p), p);
    Twin t(kOneDnn, with_head(std::move(g), y, kClasses), batch, 500);
    t.check_train_step();
  }
  SECTION("a relu on the graph input, which the caller owns") {
    Graph g({channels, 6, 6});
    const int y = g.conv("conv", g.relu(g.input()), {.out_channels = 4, .kernel = 3, .pad = 1});
    Twin t(kOneDnn, with_head(std::move(g), y, kClasses), batch, 501);
    t.check_train_step();
    const std::vector<float> x = t.x;
    t.ex->forward(t.x.data(), true);
    CHECK(t.x == x);  // the relu did not run in place over the caller's input
  }
}

TEST_CASE("onednn max pool matches the reference forward and backward", "[onednn]") {
  const PoolAttr a = GENERATE(values<PoolAttr>({{2, 2, 0}, {3, 2, 1}, {3, 1, 1}, {2, 1, 1}}));
  const int64_t channels = GENERATE(3, 16);
  const int64_t batch = GENERATE(1, 3, 8);
  INFO("kernel " << a.kernel << " stride " << a.stride << " pad " << a.pad << " channels "
                 << channels << " batch " << batch);
  Graph g({channels, 7, 7});
  const int y = g.max_pool(probe(g, g.input()), a);
  Twin t(kOneDnn, with_head(std::move(g), y, kClasses), batch, 600);
  // An identity probe hands the pool the input exactly, and distinct values per plane leave no
  // near-ties for rounding to break differently on the two backends.
  make_identity_probe(t.g, t.ref_store);
  t.sync();
  t.x = distinct_per_plane(batch * channels, 49, t.rng);
  t.check_train_step();
}

TEST_CASE("onednn avg pool counts padding in the divisor, as the reference does", "[onednn]") {
  const PoolAttr a = GENERATE(values<PoolAttr>({{2, 2, 0}, {3, 2, 1}, {3, 1, 1}, {2, 1, 1}}));
  const int64_t channels = GENERATE(3, 16);
  const int64_t batch = GENERATE(1, 3, 8);
  INFO("kernel " << a.kernel << " stride " << a.stride << " pad " << a.pad << " channels "
                 << channels << " batch " << batch);
  Graph g({channels, 7, 7});
  const int y = g.avg_pool(probe(g, g.input()), a);
  Twin t(kOneDnn, with_head(std::move(g), y, kClasses), batch, 700);
  t.check_train_step();
}

TEST_CASE("onednn global avg pool matches the reference forward and backward", "[onednn]") {
  const int64_t channels = GENERATE(1, 3, 16, 24);
  const int64_t batch = GENERATE(1, 3, 8);
  INFO("channels " << channels << " batch " << batch);
  Graph g({channels, 5, 7});
  const int y = g.global_avg_pool(probe(g, g.input()));
  Twin t(kOneDnn, with_head(std::move(g), y, kClasses), batch, 800);
  t.check_train_step();
}

TEST_CASE("onednn fully connected matches the reference on {C,H,W} and on {F} inputs", "[onednn]") {
  const bool bias = GENERATE(false, true);
  const int64_t batch = GENERATE(1, 3, 8);
  INFO("bias " << bias << " batch " << batch);
  SECTION("on a {C,H,W} input behind a conv (flattened in NCHW order)") {
    const int64_t channels = GENERATE(3, 16);
    INFO("channels " << channels);
    Graph g({channels, 4, 5});
    const int y = g.fully_connected("fc", probe(g, g.input()), {.out_features = 7, .bias = bias});
    Twin t(kOneDnn, with_head(std::move(g), y, kClasses), batch, 900);
    t.check_train_step();
  }
  SECTION("on the {C,H,W} graph input itself") {
    Graph g({16, 3, 3});
    const int in = g.input();
    Twin t(kOneDnn, with_head(std::move(g), in, kClasses), batch, 901);
    t.check_train_step();
  }
  SECTION("on a {F} input: fc, fc, head") {
    Graph g({3, 4, 4});
    const int f1 =
        g.fully_connected("fc1", probe(g, g.input()), {.out_features = 24, .bias = bias});
    const int f2 = g.fully_connected("fc2", f1, {.out_features = 9, .bias = bias});
    Twin t(kOneDnn, with_head(std::move(g), f2, kClasses), batch, 902);
    t.check_train_step();
  }
  SECTION("on a {F} graph input") {
    Graph g({10});
    const int f = g.relu(g.fully_connected("fc", g.input(), {.out_features = 6, .bias = bias}));
    Twin t(kOneDnn, with_head(std::move(g), f, kClasses), batch, 903);
    t.check_train_step();
  }
}

TEST_CASE("onednn add passes the gradient to both inputs, whoever produced them", "[onednn]") {
  const int64_t channels = GENERATE(3, 16);
  const int64_t batch = GENERATE(1, 3);
  INFO("channels " << channels << " batch " << batch);
  Graph g({channels, 6, 6});
  const ConvAttr same{.out_channels = channels, .kernel = 3, .pad = 1};
  int y = -1;
  SECTION("identity residual: conv(t) + t") {
    const int p = probe(g, g.input());
    y = g.add(g.conv("conv", p, same), p);
  }
  SECTION("shortcut with a different producer: bn(conv3x3(t)) + bn(conv1x1 stride 2(t))") {
    const int p = probe(g, g.input(), false);
    const int a = g.batch_norm(
        "bn_a", g.conv("conv_a", p, {.out_channels = 8, .kernel = 3, .stride = 2, .pad = 1}));
    const int b = g.batch_norm(
        "bn_b", g.conv("conv_b", p, {.out_channels = 8, .kernel = 1, .stride = 2, .pad = 0}));
    y = g.add(a, b);
  }
  SECTION("operands of different kinds: conv(t) + max_pool(t), then avg_pool(t) + that") {
    const int p = probe(g, g.input());
    const int a = g.add(g.conv("conv", p, same), g.max_pool(p, {3, 1, 1}));
    y = g.add(g.avg_pool(p, {3, 1, 1}), a);
  }
  SECTION("the same tensor on both inputs") {
    const int p = probe(g, g.input());
    y = g.add(p, p);
  }
  SECTION("three consumers: (conv(t) + t) + t") {
    const int p = probe(g, g.input());
    y = g.add(g.add(g.conv("conv", p, {.out_channels = channels, .kernel = 1, .pad = 0}), p), p);
  }
  SECTION("the graph input as one operand") {
    y = g.add(g.conv("conv", g.input(), same), g.input());
    y = g.conv("after", y, same);  // so that the add has a gradient to pass on
  }
  y = g.relu(y);
  Twin t(kOneDnn, with_head(std::move(g), y, kClasses), batch, 1000);
  t.check_train_step();
}

TEST_CASE("onednn gives branches that nothing consumes a zero gradient, as the reference does",
          "[onednn]") {
  // The unconsumed branches get a zero gradient: the unused layers' parameters get zero
  // gradients, and every other gradient is that of the used path alone; nothing unwritten, and
  // nothing the unused branch computes, may leak into it.
  const int64_t channels = GENERATE(3, 16);
  const int64_t batch = GENERATE(1, 3);
  INFO("channels " << channels << " batch " << batch);
  Graph g({channels, 6, 6});
  const int p = probe(g, g.input());
  SECTION("off an inner tensor: a conv behind a relu, and a max pool") {
    g.conv("unused", g.relu(p), {.out_channels = 8, .kernel = 3, .pad = 1, .bias = true});
    g.max_pool(p, {2, 2, 0});
    g.set_output(g.fully_connected("head",
                                   g.conv("conv", p, {.out_channels = 4, .kernel = 3, .pad = 1}),
                                   {.out_features = 5}));
  }
  SECTION("off the logits: a relu (which must not run in place over them) and a layer") {
    const int logits = g.fully_connected("head", p, {.out_features = 5});
    g.fully_connected("unused", g.relu(logits), {.out_features = 3});
    g.set_output(logits);
  }
  Twin t(kOneDnn, std::move(g), batch, 1600);
  // Twice: the second backward must not see what the first left behind either.
  for (int step = 0; step < 2; ++step) {
    INFO("step " << step);
    require(t.forward(true));
    const std::vector<float> dz = t.ref_dlogits();
    t.ref->backward(dz.data(), {});
    t.ex->backward(dz.data(), [](int) {});
    Verdict v;
    for (const TensorSpec& s : t.g.params()) {
      const float* got = t.store.grads.data() + s.offset;
      if (s.name.starts_with("unused")) {
        if (std::any_of(got, got + s.size(), [](float e) { return e != 0.f; }))
          v.fail("d " + s.name + " is not zero on oneDNN");
      } else {
        v += compare_tensor("d " + s.name, got, t.ref_store.grads.data() + s.offset, s.size(),
                            kGradTol);
      }
    }
    require(v);
  }
}

TEST_CASE("onednn resnet8 and cnn match the reference at every width, with and without bn",
          "[onednn][models]") {
  struct Case {
    const char* name;
    bool bn;
    int64_t width, batch;
    Dims input;
  };
  const Case c = GENERATE(values<Case>({{"resnet8", true, 4, 8, {1, 28, 28}},
                                        {"resnet8", true, 8, 3, {3, 32, 32}},
                                        {"resnet8", true, 16, 1, {1, 28, 28}},
                                        {"resnet8", false, 4, 3, {3, 32, 32}},
                                        {"resnet8", false, 8, 1, {1, 28, 28}},
                                        {"resnet8", false, 16, 8, {1, 16, 16}},
                                        {"cnn", true, 4, 1, {1, 28, 28}},
                                        {"cnn", true, 8, 8, {1, 28, 28}},
                                        {"cnn", true, 16, 3, {3, 32, 32}},
                                        {"cnn", false, 4, 8, {3, 32, 32}},
                                        {"cnn", false, 8, 3, {1, 28, 28}},
                                        {"cnn", false, 16, 1, {1, 28, 28}}}));
  INFO(c.name << " batch_norm " << c.bn << " width " << c.width << " batch " << c.batch << " input "
              << to_string(c.input));
  const Graph g = build_model(
      {.name = c.name, .input = c.input, .classes = 10, .width = c.width, .batch_norm = c.bn});
  Twin t(kOneDnn, g, c.batch, 1100);
  // The model's own initialisation, with one seed for both stores.
  init_params(t.g, t.ref_store, 7);
  init_params(t.g, t.store, 7);
  REQUIRE(t.ref_store.params == t.store.params);
  t.check_train_step();
  t.check_forward(false);  // eval, with the running statistics the training step produced
}

TEST_CASE("onednn bucket callbacks fire once each, in order, when their gradients are final",
          "[onednn]") {
  const int64_t bucket_elements = GENERATE(1, 300, 3000, 100000000);
  INFO("bucket_elements " << bucket_elements);
  const Graph g = build_model({.name = "resnet8", .input = {1, 12, 12}, .classes = 10, .width = 4});
  Twin t(kOneDnn, g, 3, 1200, bucket_elements);
  t.check_forward(true);
  check_bucket_callbacks(*t.ex, t.store.grads, t.buckets, t.ref_dlogits().data(),
                         spec(g, "conv1.weight").offset);
}

TEST_CASE("onednn backward accepts an empty bucket callback, as the reference does", "[onednn]") {
  const Graph g = build_model({.name = "resnet8", .input = {1, 12, 12}, .classes = 10, .width = 4});
  Twin t(kOneDnn, g, 3, 1300, 1000);
  REQUIRE(t.buckets.size() > 1);
  t.check_forward(true);
  const std::vector<float> dz = t.ref_dlogits();
  int calls = 0;
  t.ex->backward(dz.data(), [&](int) { ++calls; });
  CHECK(calls == static_cast<int>(t.buckets.size()));
  const std::vector<float> with_callback = t.store.grads;
  std::fill(t.store.grads.begin(), t.store.grads.end(), -7.f);
  CHECK_NOTHROW(t.ex->backward(dz.data(), {}));
  CHECK(t.store.grads == with_callback);  // and the whole backward still ran
}

TEST_CASE("onednn and the reference stay together over several SGD steps of resnet8",
          "[onednn][models]") {
  const bool bn = GENERATE(true, false);
  INFO("batch_norm " << bn);
  const Graph g = build_model(
      {.name = "resnet8", .input = {1, 16, 16}, .classes = 10, .width = 8, .batch_norm = bn});
  Twin t(kOneDnn, g, 8, 1400);
  init_params(t.g, t.ref_store, 11);
  init_params(t.g, t.store, 11);
  Sgd ref_sgd(g.param_count(), {}), dnn_sgd(g.param_count(), {});
  const int steps = 6;
  for (int step = 0; step < steps; ++step) {
    INFO("step " << step);
    // A fresh batch every step, the same for both backends.
    for (float& v : t.x) v = t.rng.uniform(-1.f, 1.f);
    for (int32_t& l : t.labels) l = static_cast<int32_t>(t.rng.below(10));
    // Each backend trains on its own logits and gradients: nothing is shared after the start.
    const float* zr = t.ref->forward(t.x.data(), true);
    const float* zd = t.ex->forward(t.x.data(), true);
    std::vector<float> dzr(t.batch * t.classes), dzd(t.batch * t.classes);
    const double ref_loss =
        softmax_cross_entropy(zr, t.labels.data(), t.batch, t.classes, dzr.data()).loss;
    const double dnn_loss =
        softmax_cross_entropy(zd, t.labels.data(), t.batch, t.classes, dzd.data()).loss;
    CHECK(dnn_loss == Approx(ref_loss).epsilon(kTrainingTol));
    const Verdict v = compare_tensor("logits", zd, zr, t.batch * t.classes, kTrainingTol);
    if (!v.ok) {
      require(v);
      break;
    }
    t.ref->backward(dzr.data(), {});
    t.ex->backward(dzd.data(), [](int) {});
    ref_sgd.step(t.ref_store.params.data(), t.ref_store.grads.data(), 0.05f);
    dnn_sgd.step(t.store.params.data(), t.store.grads.data(), 0.05f);
  }
  Verdict v;
  for (const TensorSpec& s : g.params())
    v += compare_tensor(s.name + " after training", t.store.params.data() + s.offset,
                        t.ref_store.params.data() + s.offset, s.size(), kTrainingTol);
  v += t.buffers(kTrainingTol);
  v += t.forward(false, kTrainingTol);
  require(v);
  // The parameters must have moved, or the loop above proved nothing.
  ParamStore fresh(g);
  init_params(g, fresh, 11);
  CHECK(fresh.params != t.store.params);
}

TEST_CASE("onednn backward without a training forward throws logic_error", "[onednn]") {
  const Graph g = build_model({.name = "resnet8", .input = {1, 12, 12}, .classes = 10, .width = 4});
  ParamStore s(g);
  init_params(g, s, 3);
  auto ex = compile(g, Backend::OneDnn, 2, s, make_buckets(g, 1));
  const std::vector<float> x(2 * 144, 0.5f);
  const std::vector<float> dlogits(2 * 10, 0.1f);
  check_backward_needs_training_forward(*ex, x.data(), dlogits.data(), [](int) {});
}

TEST_CASE("onednn backward overwrites the gradients instead of accumulating", "[onednn]") {
  // With batch norm: batch-norm and bias-free conv gradients; without: conv biases.
  const bool bn = GENERATE(true, false);
  INFO("batch_norm " << bn);
  const Graph g = build_model(
      {.name = "resnet8", .input = {1, 12, 12}, .classes = 10, .width = 8, .batch_norm = bn});
  Twin t(kOneDnn, g, 3, 1500);
  t.check_forward(true);
  check_backward_overwrites(*t.ex, t.store.grads, t.x.data(), t.ref_dlogits().data(), [](int) {});
}

TEST_CASE("onednn ceil-mode max pool matches the reference, edge windows included", "[onednn]") {
  struct Case {
    int64_t in;
    PoolAttr a;
  };
  // Ceil adds a last window hanging off the input (7 -> 4, 4 -> 2, 56 -> 28's shape at 9 -> 5),
  // drops one that would start in the padding (5 -> 3), takes a window larger than the input
  // (2 -> 1), and inception's stride-1 pool.
  const Case c = GENERATE(values<Case>({{7, {3, 2, 0, true}},
                                        {4, {3, 2, 0, true}},
                                        {9, {2, 2, 0, true}},
                                        {5, {2, 2, 1, true}},
                                        {2, {3, 2, 0, true}},
                                        {6, {3, 1, 1, true}}}));
  const int64_t channels = GENERATE(3, 16);
  const int64_t batch = GENERATE(1, 3);
  INFO("in " << c.in << " kernel " << c.a.kernel << " stride " << c.a.stride << " pad " << c.a.pad
             << " channels " << channels << " batch " << batch);
  Graph g({channels, c.in, c.in});
  const int y = g.max_pool(probe(g, g.input()), c.a);
  Twin t(kOneDnn, with_head(std::move(g), y, kClasses), batch, 1700);
  make_identity_probe(t.g, t.ref_store);
  t.sync();
  t.x = distinct_per_plane(batch * channels, c.in * c.in, t.rng);
  t.check_train_step();
}

TEST_CASE(
    "onednn concat matches the reference forward and backward, aligned to the channel "
    "blocks or not",
    "[onednn]") {
  const int64_t batch = GENERATE(1, 3);
  INFO("batch " << batch);
  Graph g({8, 5, 5});
  const int p = probe(g, g.input());
  const auto conv = [&](const char* name, int x, int64_t out, int64_t k) {
    return g.conv(name, x, {.out_channels = out, .kernel = k, .pad = k / 2});
  };
  int y = -1;
  SECTION("widths on 16-channel block boundaries: 16 | 32 | 16") {
    y = g.concat({conv("a", p, 16, 1), conv("b", p, 32, 3), conv("c", p, 16, 1)});
  }
  SECTION("widths across block boundaries: 16 | 8 | 24 | 3") {
    y = g.concat(
        {conv("a", p, 16, 1), conv("b", p, 8, 3), conv("c", p, 24, 1), conv("d", p, 3, 1)});
  }
  SECTION("aligned offsets, a last input that fills part of its block: 32 | 16 | 3") {
    y = g.concat({conv("a", p, 32, 1), conv("b", p, 16, 3), conv("c", p, 3, 1)});
  }
  SECTION("plain widths: 3 | 5 | 1") {
    y = g.concat({conv("a", p, 3, 1), conv("b", p, 5, 3), conv("c", p, 1, 1)});
  }
  SECTION("the same tensor twice, beside a max pool of it and the graph input") {
    y = g.concat({p, g.max_pool(p, {3, 1, 1, true}), p, g.input()});
  }
  SECTION("a concat read by several consumers, and a concat of concats") {
    const int a = g.concat({conv("a", p, 16, 1), conv("b", p, 16, 3)});
    const int b = g.concat({g.relu(conv("c", a, 8, 1)), a, g.max_pool(a, {3, 1, 1, true})});
    y = g.add(conv("d", b, 16, 1), conv("e", a, 16, 3));
  }
  y = g.relu(y);
  Twin t(kOneDnn, with_head(std::move(g), y, kClasses), batch, 1800);
  t.check_train_step();
}

TEST_CASE("onednn dropout draws the reference's masks, in place or not, in any layout",
          "[onednn]") {
  const int64_t channels = GENERATE(3, 16);
  const int64_t batch = GENERATE(1, 3);
  INFO("channels " << channels << " batch " << batch);
  Graph g({channels, 4, 4});
  const DropoutAttr a{.p = 0.4f, .seed = 5};
  const ConvAttr same{.out_channels = channels, .kernel = 3, .pad = 1};
  int y = -1;
  SECTION("in place: a conv output read by the dropout alone") {
    y = g.dropout(g.conv("conv", probe(g, g.input()), same), a);
  }
  SECTION("out of place: the dropout input also feeds an add") {
    const int c = g.conv("conv", probe(g, g.input()), same);
    y = g.add(g.dropout(c, a), c);
  }
  SECTION("on a {F} feature vector after global pooling, as in googlenet") {
    y = g.dropout(g.global_avg_pool(probe(g, g.input())), a);
  }
  SECTION("on the graph input") { y = g.conv("conv", g.dropout(g.input(), a), same); }
  Twin t(kOneDnn, with_head(std::move(g), y, kClasses), batch, 1900);
  // Several steps: both executors advance the mask step the same way, and eval is the identity
  // (in place, the previous training forward must not have left its mask behind).
  for (int step = 0; step < 3; ++step) {
    INFO("step " << step);
    t.check_train_step();
    t.check_forward(false);
  }
  CHECK(t.ref->dropout_step() >= 3);  // more if a step met a kink and was retried
  CHECK(t.ex->dropout_step() == t.ref->dropout_step());
  t.ref->set_dropout_step(1);
  t.ex->set_dropout_step(1);
  t.check_train_step();
}

TEST_CASE("onednn LRN across channels matches the reference forward and backward", "[onednn]") {
  const LrnAttr a = GENERATE(values<LrnAttr>({{.size = 5, .alpha = 1e-4f, .beta = 0.75f, .k = 1.f},
                                              {.size = 3, .alpha = 0.5f, .beta = 0.75f, .k = 2.f},
                                              {.size = 5, .alpha = 2.f, .beta = 0.5f, .k = 1.f},
                                              {.size = 1, .alpha = 1.f, .beta = 1.f, .k = 0.5f}}));
  const int64_t channels = GENERATE(3, 16, 24);
  const int64_t batch = GENERATE(1, 3);
  INFO("size " << a.size << " alpha " << a.alpha << " beta " << a.beta << " k " << a.k
               << " channels " << channels << " batch " << batch);
  Graph g({channels, 5, 5});
  const int y = g.lrn(probe(g, g.input()), a);
  Twin t(kOneDnn, with_head(std::move(g), y, kClasses), batch, 2000);
  t.check_train_step();
}

TEST_CASE("onednn and the reference stay together over SGD steps of a small bottleneck resnet",
          "[onednn][models]") {
  // Bottleneck blocks with stride-2 downsample shortcuts, the 7x7 stride-2 stem and the max pool.
  const Graph g = build_resnet({.name = "resnet-small", .input = {3, 32, 32}, .classes = 10},
                               {.blocks = {2, 1, 1}, .bottleneck = true, .width = 8});
  Twin t(kOneDnn, g, 4, 2100);
  train_both(t, 12, 4);
}

TEST_CASE("onednn and the reference stay together over SGD steps of a small googlenet",
          "[onednn][models]") {
  // All of googlenet (nine inception blocks, ceil-mode pools, dropout before fc) with a sixteenth
  // of its channels, on 32x32 inputs: the ceil-mode pools make the 16x16 stem output 8x8, not 7x7.
  const Graph g = build_googlenet(
      {.name = "googlenet-small", .input = {3, 32, 32}, .classes = 10, .seed = 4}, 16);
  Twin t(kOneDnn, g, 4, 2200);
  train_both(t, 13, 4);
}

// ||(a - origin) - (b - origin)|| / ||b - origin|| over whole flat buffers.
template <typename A, typename B>
double relative_distance(const A& a, const B& b, const std::vector<float>& origin) {
  double d = 0, n = 0;
  for (size_t i = 0; i < origin.size(); ++i) {
    const double da = a[i] - origin[i], db = b[i] - origin[i];
    d += (da - db) * (da - db);
    n += db * db;
  }
  const double r = std::sqrt(d / n);
  UNSCOPED_INFO("relative distance " << r);
  return r;
}

// bf16: activations and convolution arithmetic in bf16 (8 mantissa bits), fp32 master weights and
// gradients. It cannot match fp32 to fp32's tolerance: training-mode batch norm amplifies the
// rounding of its inputs layer by layer (measured: perturbing a deep net's fp32 input by 0.4%
// moves its first gradients by 50-100% at initialisation, and bf16 does the same). So a shallow
// net must track fp32 loosely step by step, and a deep one must learn a fixed batch as fp32 does;
// a wrong layout or type conversion gives garbage, not these differences.
TEST_CASE("onednn bf16 training tracks fp32 over SGD steps of small nets", "[onednn][bf16]") {
  if (!bf16_supported()) {
    WARN("this CPU has no AVX512_BF16: bf16 is refused here");
    const Graph g = build_model({.name = "resnet8", .input = {1, 12, 12}, .width = 4});
    ParamStore s(g);
    CHECK_THROWS_AS(compile(g, Backend::OneDnn, 2, s, make_buckets(g, 1), Precision::Bf16),
                    std::invalid_argument);
    return;
  }
  // Width 8: channels-last bf16 batch norm on 8 channels has no JIT kernel in oneDNN, so the
  // executor runs it on 16-channel blocks with reorders in and out (compile_bn's bn_layout).
  const int width = GENERATE(16, 8, 0);
  const std::string name = width > 0 ? "resnet8" : "googlenet";
  INFO(name << " width " << width);
  const bool shallow = width > 0;
  const Graph g = shallow ? build_model({.name = "resnet8", .input = {3, 16, 16}, .width = width})
                          : build_googlenet({.name = "googlenet", .input = {3, 32, 32}}, 8);
  const int64_t batch = 8, classes = g.classes();
  ParamStore f32(g), b16(g), start(g);
  init_params(g, f32, 5);
  init_params(g, b16, 5);
  init_params(g, start, 5);
  const std::vector<float> zero(g.param_count(), 0.f);
  auto ef = compile(g, Backend::OneDnn, batch, f32, make_buckets(g, 1 << 16));
  auto eb = compile(g, Backend::OneDnn, batch, b16, make_buckets(g, 1 << 16), Precision::Bf16);
  Sgd sf(g.param_count(), {}), sb(g.param_count(), {});
  Rng r(77);
  std::vector<float> x(batch * numel(g.input_dims()));
  for (float& v : x) v = r.uniform(-1.f, 1.f);
  std::vector<int32_t> y(batch);
  for (int32_t& l : y) l = static_cast<int32_t>(r.below(static_cast<uint32_t>(classes)));
  std::vector<float> dzf(batch * classes), dzb(batch * classes);
  std::vector<double> loss_f, loss_b;
  for (int step = 0; step < 10; ++step) {
    INFO("step " << step);
    loss_f.push_back(
        softmax_cross_entropy(ef->forward(x.data(), true), y.data(), batch, classes, dzf.data())
            .loss);
    loss_b.push_back(
        softmax_cross_entropy(eb->forward(x.data(), true), y.data(), batch, classes, dzb.data())
            .loss);
    REQUIRE(std::isfinite(loss_b.back()));
    if (shallow) CHECK(loss_b.back() == Approx(loss_f.back()).epsilon(0.05));
    ef->backward(dzf.data(), {});
    eb->backward(dzb.data(), {});
    if (shallow && step == 0)  // one backward from nearly the same logits
      CHECK(relative_distance(b16.grads, f32.grads, zero) < 0.25);  // measured 0.11
    sf.step(f32.params.data(), f32.grads.data(), 0.05f);
    sb.step(b16.params.data(), b16.grads.data(), 0.05f);
  }
  // Both learn the fixed batch, and bf16 about as far as fp32 or further: ten steps on one batch
  // part ways chaotically (on an Intel Xeon with AMX-bf16, one thread, GoogLeNet's bf16 loss
  // ended at 0.39 against fp32's 0.96 from 2.3), while a wrong bf16 path does not learn.
  CHECK(loss_f.back() < 0.5 * loss_f.front());
  CHECK(loss_b.back() < 0.5 * loss_b.front());
  CHECK(loss_b.back() <= loss_f.back() + 0.2 * loss_f.front());
  // Where training took the weights: bf16's way differs from fp32's by a fraction of the way.
  if (shallow)
    CHECK(relative_distance(b16.params, f32.params, start.params) < 0.25);  // measured 0.08
}

TEST_CASE("bf16 is refused on the reference backend", "[bf16]") {
  const Graph g = build_model({.name = "resnet8", .input = {1, 12, 12}, .width = 4});
  ParamStore s(g);
  CHECK_THROWS_AS(compile(g, Backend::Reference, 2, s, make_buckets(g, 1), Precision::Bf16),
                  std::invalid_argument);
  CHECK(parse_precision("bf16") == Precision::Bf16);
  CHECK(parse_precision("fp32") == Precision::Fp32);
  CHECK_THROWS_AS(parse_precision("fp16"), std::invalid_argument);
}

TEST_CASE("forward reads no bucket's weights before its gate (reference and oneDNN)", "[onednn]") {
  const Backend backend = GENERATE(Backend::Reference, Backend::OneDnn);
  ModelSpec spec;
  spec.width = 8;
  const Graph g = build_model(spec);
  const std::vector<Bucket> buckets = make_buckets(g, 400);
  REQUIRE(buckets.size() > 4);
  const int64_t batch = 2;
  const std::vector<float> x = randoms(batch * numel(g.input_dims()), 3);
  // `late` holds the weights a gate brings; `gated` starts from others and takes bucket b of
  // `late` at gate(b), as a weight exchange finishing behind forward would.
  ParamStore late(g), gated(g);
  Rng r1(7), r2(8);
  init_random(g, late, r1, RunningStats::Random);
  init_random(g, gated, r2, RunningStats::Random);
  gated.buffers = late.buffers;
  auto reference_run = compile(g, backend, batch, late, buckets);
  const float* y = reference_run->forward(x.data(), true);
  const std::vector<float> want(y, y + batch * g.classes());
  auto e = compile(g, backend, batch, gated, buckets);
  const std::vector<float> before = gated.params;
  std::vector<int> calls(buckets.size(), 0);
  e->set_bucket_gate([&](int b) {
    ++calls.at(static_cast<size_t>(b));
    std::copy(late.params.data() + buckets[b].begin, late.params.data() + buckets[b].end,
              gated.params.data() + buckets[b].begin);
  });
  y = e->forward(x.data(), true);
  CHECK(std::vector<float>(y, y + batch * g.classes()) == want);
  CHECK(std::all_of(calls.begin(), calls.end(), [](int n) { return n == 1; }));
  // Without the gate's copies the logits differ: the comparison above can fail.
  gated.params = before;
  e->set_bucket_gate({});
  y = e->forward(x.data(), true);
  CHECK(std::vector<float>(y, y + batch * g.classes()) != want);
}
