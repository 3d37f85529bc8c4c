// Tests for neuron apoptosis in kernels: which layers may shrink, that a shrunk network computes
// exactly what the original computes with the removed units' outgoing weights set to zero (both
// backends, eval and training forwards, gradients), the parameter counts, the decision rule and
// the description of a shrunk architecture.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kernels/apoptosis.hpp"
#include "kernels/executor.hpp"
#include "kernels/models.hpp"
#include "kernels/weights.hpp"

using namespace gg::kernels;

namespace {

std::vector<std::string> names(const Graph& g, const std::vector<PrunableLayer>& layers) {
  std::vector<std::string> v;
  for (const PrunableLayer& l : layers) v.push_back(g.node(l.node).name);
  return v;
}

int node_named(const Graph& g, const std::string& name) {
  for (size_t id = 0; id < g.nodes().size(); ++id)
    if (g.nodes()[id].name == name) return static_cast<int>(id);
  throw std::invalid_argument("no node " + name);
}

// Weights ~ U(-1, 1) / sqrt(fan_in), biases and batch-norm shifts ~ U(-0.5, 0.5), batch-norm
// scales in [0.5, 1.5], random running statistics: every path of the net carries signal.
void init_random(const Graph& g, ParamStore& s, uint32_t seed) {
  std::mt19937 r(seed);
  const auto u = [&](float lo, float hi) {
    return lo + (hi - lo) * static_cast<float>(r() >> 8) / 16777216.f;
  };
  for (const TensorSpec& t : g.params()) {
    const bool bn = g.node(t.node).op == Op::BatchNorm;
    const bool weight = t.name.ends_with(".weight");
    const float scale =
        t.dims.size() > 1 ? 1.f / std::sqrt(static_cast<float>(t.size() / t.dims[0])) : 0.5f;
    for (int64_t i = 0; i < t.size(); ++i)
      s.params[t.offset + i] = bn && weight ? u(0.5f, 1.5f) : u(-1.f, 1.f) * scale;
  }
  for (const TensorSpec& t : g.buffers())
    for (int64_t i = 0; i < t.size(); ++i)
      s.buffers[t.offset + i] = t.name.ends_with("running_var") ? u(0.5f, 2.f) : u(-0.5f, 0.5f);
}

// Every third unit of every prunable layer (starting at one), so each layer loses some.
Removal every_third(const Graph& g) {
  Removal r;
  for (const PrunableLayer& l : prunable_layers(g, true, true))
    for (int64_t u = 1; u < l.units; u += 3) r[l.node].push_back(u);
  return r;
}

// The original's parameters with the removed units' outgoing weights (their input channels or
// columns in every consumer) set to zero.
std::vector<float> zero_outgoing(const Graph& g, std::vector<float> params, const Removal& r) {
  for (const PrunableLayer& l : prunable_layers(g, true, true)) {
    const auto it = r.find(l.node);
    if (it == r.end()) continue;
    for (int c : l.consumers) {
      const TensorSpec& t = g.params()[g.node(c).params[0]];
      const Dims& in = g.node(g.node(c).inputs[0]).out;
      const int64_t span =
          g.node(c).op == Op::Conv ? t.dims[2] * t.dims[3] : (in.size() == 3 ? in[1] * in[2] : 1);
      const int64_t row = t.size() / t.dims[0];
      for (int64_t o = 0; o < t.dims[0]; ++o)
        for (int64_t unit : it->second)
          std::fill_n(params.begin() + t.offset + o * row + unit * span, span, 0.f);
    }
  }
  return params;
}

double max_abs(const float* a, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, static_cast<double>(std::fabs(a[i])));
  return m;
}

// max |a - b| relative to max |b| (+1e-3): backends accumulate in their own orders.
double rel_diff(const float* a, const float* b, int64_t n) {
  double d = 0;
  for (int64_t i = 0; i < n; ++i) d = std::max(d, static_cast<double>(std::fabs(a[i] - b[i])));
  return d / (max_abs(b, n) + 1e-3);
}

struct Case {
  std::string what;
  Graph g;
};

std::vector<Case> cases() {
  std::vector<Case> v;
  ModelSpec cnn;
  cnn.name = "cnn";
  cnn.width = 6;
  v.push_back({"cnn with batch norm", build_model(cnn)});
  cnn.batch_norm = false;
  v.push_back({"cnn without batch norm", build_model(cnn)});
  ModelSpec r8;
  r8.name = "resnet8";
  r8.width = 4;
  r8.input = {1, 12, 12};
  v.push_back({"resnet8", build_model(r8)});
  ModelSpec gn;
  gn.input = {3, 32, 32};
  v.push_back({"googlenet / 16", build_googlenet(gn, 16)});
  return v;
}

}  // namespace

TEST_CASE("prunable layers are those whose units reach only per-channel layers and conv or fc") {
  ModelSpec cnn;
  cnn.name = "cnn";
  const Graph c = build_model(cnn);
  CHECK(names(c, prunable_layers(c, true, true)) ==
        std::vector<std::string>{"conv1", "conv2", "fc1"});  // fc2 is the output
  CHECK(names(c, prunable_layers(c, false, true)) == std::vector<std::string>{"fc1"});
  CHECK(names(c, prunable_layers(c, true, false)) == std::vector<std::string>{"conv1", "conv2"});
  const auto fc1 = prunable_layers(c, false, true)[0];
  CHECK(fc1.units == 8 * 16);
  CHECK(fc1.consumers == std::vector<int>{node_named(c, "fc2")});
  CHECK(prunable_layers(c, true, false)[0].batch_norms == std::vector<int>{node_named(c, "bn1")});

  // resnet8: every channel that reaches a residual add stays; the first conv of each block
  // feeds only its second conv.
  ModelSpec r8;
  const Graph r = build_model(r8);
  CHECK(names(r, prunable_layers(r, true, true)) ==
        std::vector<std::string>{"layer1.0.conv1", "layer2.0.conv1", "layer3.0.conv1"});

  // googlenet: channels joined by a concat stay; the stem and the 1x1 reductions shrink, and
  // conv3 reaches four consumers (three branch convs and, through a max pool, the fourth).
  ModelSpec gs;
  gs.input = {3, 32, 32};
  const Graph gn = build_googlenet(gs, 16);
  const auto gl = prunable_layers(gn, true, true);
  for (const std::string& n : names(gn, gl))
    CHECK((n == "conv1.conv" || n == "conv2.conv" || n == "conv3.conv" ||
           n.ends_with("branch2.0.conv") || n.ends_with("branch3.0.conv")));
  const auto conv3 = std::find_if(gl.begin(), gl.end(), [&](const PrunableLayer& l) {
    return gn.node(l.node).name == "conv3.conv";
  });
  REQUIRE(conv3 != gl.end());
  CHECK(conv3->consumers.size() == 4);
}

TEST_CASE(
    "a shrunk network computes what the original computes with the removed units' "
    "outgoing weights set to zero") {
  const int64_t batch = 4;
  for (Case& k : cases()) {
    const Graph& g = k.g;
    ParamStore orig(g);
    init_random(g, orig, 7);
    const Removal r = every_third(g);
    REQUIRE(!r.empty());
    const Shrink s = plan_shrink(g, r);
    ParamStore zeroed(g), small(s.graph);
    zeroed.params = zero_outgoing(g, orig.params, r);
    zeroed.buffers = orig.buffers;
    small.params = s.params(orig.params);
    small.buffers = s.buffers(orig.buffers);
    std::mt19937 rng(3);
    std::normal_distribution<float> normal;
    std::vector<float> x(batch * numel(g.input_dims()));
    for (float& v : x) v = normal(rng);
    const int64_t classes = g.classes();
    for (Backend b : {Backend::Reference, Backend::OneDnn}) {
      for (bool train : {false, true}) {
        INFO(k.what << ", " << backend_name(b) << (train ? ", training forward" : ", eval"));
        ParamStore z(g), sm(s.graph);
        z.params = zeroed.params;
        z.buffers = zeroed.buffers;
        sm.params = small.params;
        sm.buffers = small.buffers;
        auto ez = compile(g, b, batch, z, make_buckets(g, 1 << 20));
        auto es = compile(s.graph, b, batch, sm, make_buckets(s.graph, 1 << 20));
        const float* a = ez->forward(x.data(), train);
        const std::vector<float> yz(a, a + batch * classes);
        const float* y = es->forward(x.data(), train);
        CHECK(rel_diff(y, yz.data(), batch * classes) < 1e-4);
        if (!train) continue;
        // Running statistics of the kept channels move the same way in training.
        const std::vector<float> kept_stats = s.buffers(z.buffers);
        CHECK(rel_diff(sm.buffers.data(), kept_stats.data(), sm.buffers.size()) < 1e-4);
        if (b != Backend::Reference) continue;  // oneDNN's rounding may flip a ReLU kink
        // Gradients of every kept parameter agree: removed units contributed nothing.
        std::vector<float> dy(batch * classes);
        for (float& v : dy) v = normal(rng);
        ez->forward(x.data(), true);
        ez->backward(dy.data(), {});
        es->forward(x.data(), true);
        es->backward(dy.data(), {});
        const std::vector<float> want = s.params(z.grads);
        CHECK(rel_diff(sm.grads.data(), want.data(), static_cast<int64_t>(want.size())) < 1e-5);
      }
    }
  }
}

TEST_CASE("shrinking removes exactly the parameters of the removed units") {
  ModelSpec m;
  m.name = "cnn";
  m.width = 16;  // conv1 16, conv2 32 (7x7 after two pools), fc1 128, fc2 10
  const Graph g = build_model(m);
  const int conv1 = node_named(g, "conv1"), conv2 = node_named(g, "conv2"),
            fc1 = node_named(g, "fc1");
  Removal r;
  r[conv1] = {0, 5};                  // 2 channels
  r[conv2] = {1, 2, 3, 30};           // 4 channels
  r[fc1] = {0, 10, 20, 30, 40, 127};  // 6 neurons
  const Shrink s = plan_shrink(g, r);
  const auto count = [](int64_t c1, int64_t c2, int64_t f1) {
    return 9 * c1 + 2 * c1                      // conv1 (no bias), bn1
           + 9 * c1 * c2 + 2 * c2               // conv2, bn2
           + 49 * c2 * f1 + f1 + 10 * f1 + 10;  // fc1, fc2
  };
  CHECK(g.param_count() == count(16, 32, 128));
  CHECK(s.graph.param_count() == count(14, 28, 122));
  CHECK(s.graph.buffer_count() == 2 * (14 + 28));
  CHECK(s.graph.node(conv2).out == Dims{28, 14, 14});
  CHECK(s.graph.node(fc1).out == Dims{122});
  CHECK(s.graph.forward_macs() < g.forward_macs());
  // Names and order are the original's.
  REQUIRE(s.graph.params().size() == g.params().size());
  for (size_t i = 0; i < g.params().size(); ++i)
    CHECK(s.graph.params()[i].name == g.params()[i].name);
  // The first kept row of fc1 (neuron 1) starts with its columns of conv2's channel 0.
  const TensorSpec& w_old = g.params()[g.node(fc1).params[0]];
  const TensorSpec& w_new = s.graph.params()[s.graph.node(fc1).params[0]];
  CHECK(s.param_source[w_new.offset] == w_old.offset + 1 * 32 * 49);
  CHECK(s.param_source[w_new.offset + 49] == w_old.offset + 1 * 32 * 49 + 4 * 49);  // channel 4

  // A shrunk graph shrinks again.
  Removal again;
  again[fc1] = {0};
  CHECK(plan_shrink(s.graph, again).graph.param_count() == count(14, 28, 121));
}

TEST_CASE("plan_shrink refuses layers that may not shrink, bad unit indices and empty layers") {
  ModelSpec m;
  m.name = "resnet8";
  const Graph g = build_model(m);
  Removal stem;
  stem[node_named(g, "conv1")] = {0};  // reaches the first residual add
  CHECK_THROWS_WITH(plan_shrink(g, stem), Catch::Contains("not a prunable layer"));
  Removal out;
  out[node_named(g, "fc")] = {0};
  CHECK_THROWS_AS(plan_shrink(g, out), std::invalid_argument);
  const int c = node_named(g, "layer1.0.conv1");
  Removal bad;
  bad[c] = {16};
  CHECK_THROWS_WITH(plan_shrink(g, bad), Catch::Contains("out of range or repeated"));
  bad[c] = {2, 2};
  CHECK_THROWS_WITH(plan_shrink(g, bad), Catch::Contains("out of range or repeated"));
  Removal everything;
  for (int64_t u = 0; u < 16; ++u) everything[c].push_back(u);
  CHECK_THROWS_WITH(plan_shrink(g, everything), Catch::Contains("every unit"));
}

TEST_CASE("choose_removal takes the lowest scores below the threshold within the caps") {
  std::vector<PrunableLayer> layers(2);
  layers[0].node = 3;
  layers[0].units = 8;
  layers[1].node = 9;
  layers[1].units = 4;
  // Layer 0: mean 1.0; relative scores below 0.5 are units 1 (0.1), 4 (0.3), 6 (0.1), 7 (0.4).
  std::vector<std::vector<double>> s = {{1.5, 0.1, 1.6, 1.5, 0.3, 1.9, 0.1, 0.4},
                                        {1.0, 1.0, 1.0, 1.0}};
  ApoptosisRule rule;
  rule.threshold = 0.5;
  rule.max_share = 0.5;  // at most 4 of 8
  rule.min_keep = 2;
  Removal r = choose_removal(layers, s, rule);
  CHECK(r.size() == 1);
  CHECK(r[3] == std::vector<int64_t>{1, 4, 6, 7});
  rule.max_share = 0.25;  // at most 2: the two 0.1s (tie: lower index first, both go)
  CHECK(choose_removal(layers, s, rule)[3] == std::vector<int64_t>{1, 6});
  rule.max_share = 0.3;  // floor(2.4) = 2
  CHECK(choose_removal(layers, s, rule)[3] == std::vector<int64_t>{1, 6});
  rule.max_share = 1.0;
  rule.min_keep = 5;  // 8 - 5 = 3 may go
  CHECK(choose_removal(layers, s, rule)[3] == std::vector<int64_t>{1, 4, 6});
  rule.min_keep = 8;
  CHECK(choose_removal(layers, s, rule).empty());
  // Absolute threshold: scores below 0.35.
  rule = {};
  rule.relative = false;
  rule.threshold = 0.35;
  rule.max_share = 1.0;
  rule.min_keep = 1;
  CHECK(choose_removal(layers, s, rule)[3] == std::vector<int64_t>{1, 4, 6});
  CHECK_THROWS_AS(choose_removal(layers, {s[0]}, rule), std::invalid_argument);
}

TEST_CASE("outgoing norms are zero exactly for units whose outgoing weights are zero") {
  ModelSpec m;
  m.name = "cnn";
  m.width = 4;
  const Graph g = build_model(m);
  ParamStore s(g);
  init_random(g, s, 11);
  const auto layers = prunable_layers(g, true, true);
  Removal r;
  r[layers[1].node] = {3};  // conv2 channel 3
  r[layers[2].node] = {0};  // fc1 neuron 0
  const auto norms = outgoing_norms(g, zero_outgoing(g, s.params, r), layers);
  REQUIRE(norms.size() == 3);
  for (size_t i = 0; i < layers.size(); ++i) {
    REQUIRE(static_cast<int64_t>(norms[i].size()) == layers[i].units);
    for (int64_t u = 0; u < layers[i].units; ++u) {
      const auto it = r.find(layers[i].node);
      const bool gone = it != r.end() && std::count(it->second.begin(), it->second.end(), u);
      CHECK((norms[i][u] == 0.0) == gone);
    }
  }
  // fc1 neuron 5's norm is the norm of fc2's column 5.
  const TensorSpec& w = g.params()[g.node(layers[2].consumers[0]).params[0]];
  double sq = 0;
  for (int64_t o = 0; o < 10; ++o) sq += std::pow(s.params[w.offset + o * 32 + 5], 2);
  CHECK(norms[2][5] == Approx(std::sqrt(sq)).epsilon(1e-12));
}

TEST_CASE("a shrunk architecture is described by its changed widths and found in its weights") {
  ModelSpec m;
  m.name = "cnn";
  m.width = 8;
  const Graph base = build_model(m);
  Removal r;
  r[node_named(base, "conv2")] = {0, 1, 2};
  r[node_named(base, "fc1")] = {5};
  const Shrink s = plan_shrink(base, r);
  const auto widths = changed_widths(base, s.graph);
  CHECK(widths == std::map<std::string, int64_t>{{"conv2", 13}, {"fc1", 63}});
  const Graph again = apply_widths(base, widths);
  CHECK(again.param_count() == s.graph.param_count());
  ParamStore store(s.graph);
  init_random(s.graph, store, 5);
  const NpzEntries npz = export_weights(s.graph, store, 0);
  CHECK(find_array(npz, "fc1.weight")->shape == Dims{63, 13 * 49});
  CHECK(widths_in_weights(base, npz) == widths);
  ParamStore loaded(again);
  import_weights(again, loaded, npz, "test");
  CHECK(loaded.params == store.params);
  CHECK_THROWS_WITH(apply_widths(base, {{"fc2", 5}}), Catch::Contains("not a prunable layer"));
  CHECK_THROWS_WITH(apply_widths(base, {{"fc1", 65}}), Catch::Contains("out of [1, 64]"));
}
