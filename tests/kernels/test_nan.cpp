// NaN on every backend, as in PyTorch: relu(NaN) = NaN, also where the ReLU runs inside a batch
// norm; a max-pool window holding a NaN gives NaN; so a NaN in a weight or an input reaches the
// logits, the loss and the gradients instead of being hidden by the first ReLU (oneDNN's
// eltwise and fused ReLU and max pool, and any `x > 0 ? x : 0` or fmaxf kernel, drop it). Each
// case says which samples' logits PyTorch makes NaN (worked out from PyTorch 1.13's rules); those
// must be NaN in every class, and the others finite and equal to the reference backend's.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "kernels/executor.hpp"
#include "kernels/graph.hpp"
#include "kernels/loss.hpp"
#include "kernels/models.hpp"
#include "tests/kernels/backend_conformance.hpp"

using namespace gg::kernels;
using namespace gg::test;

namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr int64_t kClasses = 4;

struct Under {
  Backend backend;
  Precision precision;
  double tol;  // finite logits against the reference's (see compare_tensor)
  const char* name;
};

// Every backend and precision; what this build or machine lacks is skipped with a note.
const std::vector<Under>& backends() {
  static const std::vector<Under> all = {{Backend::Reference, Precision::Fp32, 1e-6, "reference"},
                                         {Backend::OneDnn, Precision::Fp32, 1e-4, "onednn"},
                                         {Backend::OneDnn, Precision::Bf16, 5e-2, "onednn bf16"},
                                         {Backend::Cuda, Precision::Fp32, 1e-2, "cuda"},  // TF32
                                         {Backend::Cuda, Precision::Bf16, 5e-2, "cuda bf16"}};
  return all;
}

// Says why a backend is skipped, once per run.
void skipped(const Under& u, const std::string& why) {
  static std::set<std::string> told;
  if (told.insert(u.name).second) WARN(u.name << ": skipped: " << why);
}

std::unique_ptr<Executor> compile_if_here(const Graph& g, const Under& u, int64_t batch,
                                          ParamStore& s) {
  if (u.backend == Backend::Cuda) {
    if (!cuda_built()) {
      skipped(u, "this build has no CUDA backend");
      return nullptr;
    }
    try {
      return compile(g, u.backend, batch, s, make_buckets(g, 1), u.precision);
    } catch (const std::runtime_error& e) {
      skipped(u, e.what());
      return nullptr;
    }
  }
  if (u.precision == Precision::Bf16 && !bf16_supported()) {
    skipped(u, "this CPU runs no bf16");
    return nullptr;
  }
  return compile(g, u.backend, batch, s, make_buckets(g, 1), u.precision);
}

// A graph with random parameters and running statistics (as in the conformance tests), a batch
// of inputs, and the NaNs a case puts in either.
struct Setup {
  Setup(Graph graph, int64_t batch_size) : g(std::move(graph)), batch(batch_size), store(g) {
    Rng r(7);
    init_random(g, store, r, RunningStats::Random);
    x = randoms(batch * numel(g.input_dims()), 8);
  }
  // Element `at` of sample `sample` of the input.
  void nan_input(int64_t sample, int64_t at) { x[sample * numel(g.input_dims()) + at] = kNaN; }
  void nan_param(const std::string& name, int64_t at = 0) { param(g, store, name)[at] = kNaN; }
  void nan_buffer(const std::string& name, int64_t at = 0) { buffer(g, store, name)[at] = kNaN; }

  // One forward (training or eval) on the backend and on the reference, each from a copy of the
  // store: sample i's logits must be NaN in every class when nan_rows[i], else finite and the
  // reference's. With `backward`, a backward follows the training forward, from the loss's
  // dlogits: the NaN must reach the first layer's gradient (`first`) when any row is NaN.
  void check(const Under& u, bool train, const std::vector<int>& nan_rows,
             const std::string& first = {}) {
    INFO(u.name << (train ? ", training forward" : ", eval forward"));
    ParamStore mine(g), ref_store(g);
    for (ParamStore* s : {&mine, &ref_store}) {
      std::copy(store.params.begin(), store.params.end(), s->params.begin());
      s->buffers = store.buffers;
    }
    auto ex = compile_if_here(g, u, batch, mine);
    if (!ex) return;
    auto ref = compile(g, Backend::Reference, batch, ref_store, make_buckets(g, 1));
    const float* zr = ref->forward(x.data(), train);
    const std::vector<float> want(zr, zr + batch * kClasses);
    const float* zp = ex->forward(x.data(), train);
    const std::vector<float> z(zp, zp + batch * kClasses);
    REQUIRE(static_cast<int64_t>(nan_rows.size()) == batch);
    for (int64_t i = 0; i < batch; ++i) {
      INFO("sample " << i << " logits " << z[i * kClasses] << " " << z[i * kClasses + 1] << " ...");
      const auto row = z.begin() + i * kClasses;
      if (nan_rows[i]) {
        CHECK(std::all_of(row, row + kClasses, [](float v) { return std::isnan(v); }));
      } else {
        CHECK(std::all_of(row, row + kClasses, [](float v) { return std::isfinite(v); }));
        require(compare_tensor("logits", &z[i * kClasses], &want[i * kClasses], kClasses, u.tol));
      }
    }
    // The loss sees it: NaN exactly when some row is.
    std::vector<int32_t> labels(batch);
    for (int64_t i = 0; i < batch; ++i) labels[i] = static_cast<int32_t>(i % kClasses);
    std::vector<float> dz(batch * kClasses);
    const double loss =
        softmax_cross_entropy(z.data(), labels.data(), batch, kClasses, dz.data()).loss;
    const bool any = std::any_of(nan_rows.begin(), nan_rows.end(), [](int v) { return v != 0; });
    CHECK(std::isnan(loss) == any);
    if (!train || first.empty() || !any) return;
    ex->backward(dz.data(), {});
    const TensorSpec& w = spec(g, first);
    const float* dw = mine.grads.data() + w.offset;
    CHECK(std::any_of(dw, dw + w.size(), [](float v) { return std::isnan(v); }));
  }

  Graph g;
  int64_t batch;
  ParamStore store;
  std::vector<float> x;
};

Graph headed(Graph g, int body) { return with_head(std::move(g), body, kClasses); }

}  // namespace

TEST_CASE("relu(NaN) is NaN on every backend, on a graph input and in place after a conv",
          "[nan]") {
  const Under u = GENERATE(from_range(backends()));
  const int64_t channels = GENERATE(3, 16);  // plain and blocked oneDNN layouts
  INFO("channels " << channels);
  SECTION("relu of the input") {
    Graph g({channels, 5, 5});
    const int r = g.relu(g.input());
    Setup s(headed(g, r), 3);
    s.nan_input(1, 7);
    s.check(u, false, {0, 1, 0});
    s.check(u, true, {0, 1, 0});
  }
  SECTION("relu after a conv") {
    Graph g({channels, 5, 5});
    const int r = g.relu(g.conv("conv", g.input(), {.out_channels = channels, .bias = true}));
    const Graph net = headed(g, r);
    Setup s(net, 3);
    s.nan_input(1, 12);
    s.check(u, false, {0, 1, 0});
    s.check(u, true, {0, 1, 0}, "conv.weight");
    Setup w(net, 3);
    w.nan_param("conv.weight", 4);  // a centre tap: every output of channel 0
    w.check(u, false, {1, 1, 1});
    w.check(u, true, {1, 1, 1}, "conv.weight");
  }
}

TEST_CASE("batch norm with its ReLU fused passes NaN in training and eval, as in PyTorch",
          "[nan]") {
  const Under u = GENERATE(from_range(backends()));
  const int64_t channels = GENERATE(3, 16);
  INFO("channels " << channels);
  Graph g({channels, 4, 4});
  const int r = g.relu(g.batch_norm("bn", g.conv("conv", g.input(), {.out_channels = channels})));
  const Graph net = headed(g, r);
  SECTION("a NaN input: its sample in eval; every sample in training (the batch statistics)") {
    Setup s(net, 3);
    s.nan_input(1, 5);
    s.check(u, false, {0, 1, 0});
    s.check(u, true, {1, 1, 1}, "conv.weight");
  }
  SECTION("a NaN scale, shift or conv weight: every sample") {
    const std::string name = GENERATE("bn.weight", "bn.bias", "conv.weight");
    INFO(name);
    Setup s(net, 3);
    s.nan_param(name, name == "conv.weight" ? 4 : channels - 1);
    s.check(u, false, {1, 1, 1});
    s.check(u, true, {1, 1, 1}, "conv.weight");
  }
  SECTION("a NaN running variance: every sample in eval; none in training, which ignores it") {
    Setup s(net, 3);
    s.nan_buffer("bn.running_var", 0);
    s.check(u, false, {1, 1, 1});
    s.check(u, true, {0, 0, 0});
  }
}

TEST_CASE("max pool gives NaN for a window that holds a NaN, as PyTorch's max_pool2d does",
          "[nan]") {
  const Under u = GENERATE(from_range(backends()));
  const int64_t channels = GENERATE(3, 16);
  INFO("channels " << channels);
  SECTION("on the input, 2x2 windows: a NaN in no window (the last row in floor mode) is lost") {
    Graph g({channels, 5, 5});
    const int p = g.max_pool(g.input(), {2, 2, 0});
    Setup s(headed(g, p), 3);
    s.nan_input(1, 6);   // row 1, column 1: window (0, 0)
    s.nan_input(2, 24);  // row 4, column 4: in no window
    s.check(u, false, {0, 1, 0});
    s.check(u, true, {0, 1, 0});
  }
  SECTION("after conv and relu") {
    Graph g({channels, 6, 6});
    const int r = g.relu(g.conv("conv", g.input(), {.out_channels = channels, .bias = true}));
    const int p = g.max_pool(r, {2, 2, 0});
    Setup s(headed(g, p), 3);
    s.nan_input(0, 14);
    s.check(u, false, {1, 0, 0});
    s.check(u, true, {1, 0, 0}, "conv.weight");
  }
  SECTION("after conv, batch norm and relu, 3x3 stride 2 padding 1 (a ResNet stem)") {
    Graph g({channels, 6, 6});
    const int bn = g.batch_norm("bn", g.conv("conv", g.input(), {.out_channels = channels}));
    const int p = g.max_pool(g.relu(bn), {3, 2, 1});
    const Graph net = headed(g, p);
    Setup s(net, 3);
    s.nan_input(2, 20);
    s.check(u, false, {0, 0, 1});
    s.check(u, true, {1, 1, 1}, "conv.weight");
    Setup w(net, 3);
    w.nan_param("bn.weight", channels - 1);
    w.check(u, false, {1, 1, 1});
    w.check(u, true, {1, 1, 1}, "conv.weight");
  }
}

TEST_CASE("a NaN weight or input reaches the logits, the loss and the gradients of every small net",
          "[nan][models]") {
  const Under u = GENERATE(from_range(backends()));
  struct Net {
    const char* name;
    int64_t width;
    bool batch_norm;
  };
  const Net n = GENERATE(values<Net>(
      {{"resnet8", 4, true}, {"resnet8", 16, true}, {"cnn", 16, true}, {"cnn", 8, false}}));
  INFO(n.name << " width " << n.width << (n.batch_norm ? "" : " without batch norm"));
  const Graph g = build_model({.name = n.name,
                               .input = {1, 12, 12},
                               .classes = kClasses,
                               .width = n.width,
                               .batch_norm = n.batch_norm});
  SECTION("one NaN among the first conv's weights: every sample") {
    Setup s(g, 2);
    s.nan_param("conv1.weight", 4);
    s.check(u, false, {1, 1});
    s.check(u, true, {1, 1}, "conv1.weight");
  }
  SECTION("one NaN pixel: its sample, and in training with batch norm every sample") {
    Setup s(g, 2);
    s.nan_input(0, 30);
    s.check(u, false, {1, 0});
    s.check(u, true, {1, n.batch_norm ? 1 : 0}, "conv1.weight");
  }
  SECTION("no NaN: every logit finite") {
    Setup s(g, 2);
    s.check(u, false, {0, 0});
    s.check(u, true, {0, 0});
  }
}

TEST_CASE("top-1 and top-5 rank a NaN logit above every number, as torch.argmax and topk do",
          "[nan]") {
  // Row 0: all NaN, label 0 (argmax 0: a hit) ; row 1: all NaN, label 2 (argmax 0: a miss, top-5
  // yes); row 2: a NaN at class 3 outranks the label's 9; row 3: the label's logit is NaN.
  const std::vector<float> z = {kNaN, kNaN, kNaN, kNaN,  //
                                kNaN, kNaN, kNaN, kNaN,  //
                                1,    9,    0,    kNaN,  //
                                1,    kNaN, 0,    2};
  const std::vector<int32_t> labels = {0, 2, 1, 1};
  const LossResult r = softmax_cross_entropy(z.data(), labels.data(), 4, kClasses, nullptr);
  CHECK(r.correct == 2);  // rows 0 and 3
  CHECK(r.top5 == 4);
  CHECK(std::isnan(r.loss));
}
