// The backend-conformance fixture: what the tests of every backend share to hold it to the
// reference backend, the oracle. Random numbers that are the same on every standard library;
// parameters and inputs at a scale where every layer's output stays O(1); a probe that exposes a
// layer's input gradient; and the executor contract of kernels/executor.hpp (bucket callbacks,
// gradients overwritten, backward only after a training forward). Each backend's test file adds
// only what is its own.
#pragma once

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "kernels/executor.hpp"
#include "kernels/graph.hpp"

namespace gg::test {

// Deterministic on every standard library (std::uniform_real_distribution is not).
class Rng {
 public:
  explicit Rng(uint32_t seed) : engine_(seed) {}
  float uniform(float lo, float hi) {
    return lo + (hi - lo) * static_cast<float>(engine_() >> 8) / 16777216.f;
  }
  uint32_t below(uint32_t n) { return engine_() % n; }

 private:
  std::mt19937 engine_;
};

// A parameter or running statistic by name, and where its values live in a store.
inline const kernels::TensorSpec& spec(const kernels::Graph& g, const std::string& name) {
  for (const kernels::TensorSpec& t : g.params())
    if (t.name == name) return t;
  for (const kernels::TensorSpec& t : g.buffers())
    if (t.name == name) return t;
  throw std::invalid_argument("no tensor named " + name);
}
inline float* param(const kernels::Graph& g, kernels::ParamStore& s, const std::string& name) {
  return s.params.data() + spec(g, name).offset;
}
inline float* buffer(const kernels::Graph& g, kernels::ParamStore& s, const std::string& name) {
  return s.buffers.data() + spec(g, name).offset;
}

// What init_random puts in the batch-norm running statistics. Neutral: mean 0 and variance 1,
// drawing nothing from the generator. Random: mean in [-0.5, 0.5] and variance in [0.5, 2], so
// that an eval forward that ignored them, or a training update that started from anything but
// their current values, shows.
enum class RunningStats { Neutral, Random };

// Parameters at a scale where every layer's output stays O(1): weights ~ U(-1,1)/sqrt(fan_in),
// biases ~ U(-0.5, 0.5), batch-norm scale in [0.5, 1.5].
inline void init_random(const kernels::Graph& g, kernels::ParamStore& s, Rng& r,
                        RunningStats stats) {
  for (const kernels::TensorSpec& t : g.params()) {
    const bool bn = g.node(t.node).op == kernels::Op::BatchNorm;
    const bool is_weight = t.name.ends_with(".weight");
    const double fan_in = t.dims.size() > 1 ? static_cast<double>(t.size() / t.dims[0]) : 1.0;
    const float scale = static_cast<float>(1.0 / std::sqrt(fan_in));
    for (int64_t i = 0; i < t.size(); ++i) {
      float& v = s.params[t.offset + i];
      if (bn && is_weight)
        v = r.uniform(0.5f, 1.5f);
      else
        v = r.uniform(-1.f, 1.f) * (is_weight ? scale : 0.5f);
    }
  }
  for (const kernels::TensorSpec& t : g.buffers()) {
    const bool var = t.name.ends_with("running_var");
    for (int64_t i = 0; i < t.size(); ++i)
      if (stats == RunningStats::Neutral)
        s.buffers[t.offset + i] = var ? 1.f : 0.f;
      else
        s.buffers[t.offset + i] = var ? r.uniform(0.5f, 2.f) : r.uniform(-0.5f, 0.5f);
  }
}

// A 3x3 convolution in front of the layer under test. The Executor does not expose the gradient
// w.r.t. a layer's input, but the probe's weight and bias gradients are sums of exactly that
// gradient times (shifted) inputs, so a wrong input gradient shows up in them. The probe also
// makes the layer's input a non-graph-input tensor, which is what switches backward data on.
// Before a batch norm (even behind a bias-free fully connected layer) a probe whose gradients are
// compared across backends must not have a bias: the normalisation cancels any shift, so its
// gradient is zero up to rounding, and comparing rounding noise proves nothing.
inline int probe(kernels::Graph& g, int x, bool bias = true) {
  return g.conv("probe", x,
                {.out_channels = g.node(x).out[0], .kernel = 3, .pad = 1, .bias = bias});
}

// Makes the probe the identity (centre tap 1, all else 0): it then hands the layer under test
// exactly the chosen input, on every backend (x * 1 + 0 * y is exact in any summation order).
inline void make_identity_probe(const kernels::Graph& g, kernels::ParamStore& s) {
  const kernels::TensorSpec& w = spec(g, "probe.weight");
  const int64_t c = w.dims[0];
  std::fill_n(s.params.begin() + w.offset, w.size(), 0.f);
  for (int64_t o = 0; o < c; ++o) s.params[w.offset + (o * c + o) * 9 + 4] = 1.f;
  for (int idx : g.node(w.node).params)
    if (g.params()[idx].name == "probe.bias")
      std::fill_n(s.params.begin() + g.params()[idx].offset, g.params()[idx].size(), 0.f);
}

// Every plane a shuffled ladder of values 0.05 apart: no two candidates of a max-pool window are
// close, so every backend picks the same maximum, and no perturbation of an identity probe by a
// finite-difference step eps (which moves a difference of two values by at most 2 * eps)
// reorders a window.
inline std::vector<float> distinct_per_plane(int64_t planes, int64_t plane, Rng& r) {
  std::vector<float> v(planes * plane);
  for (int64_t p = 0; p < planes; ++p) {
    float* q = v.data() + p * plane;
    for (int64_t i = 0; i < plane; ++i)
      q[i] = 0.05f * static_cast<float>(i) - 0.025f * static_cast<float>(plane - 1);
    for (int64_t i = plane - 1; i > 0; --i)
      std::swap(q[i], q[r.below(static_cast<uint32_t>(i + 1))]);
  }
  return v;
}

// The layer under test gets a fully connected head to a few classes, so the loss sees all of it.
inline kernels::Graph with_head(kernels::Graph g, int body, int64_t classes) {
  g.set_output(g.fully_connected("head", body, {.out_features = classes}));
  return g;
}

// The executor contract (kernels/executor.hpp), on executor `ex` writing its gradients to `grads`.

// Backward right after a training forward: each bucket's callback fires once, in bucket order,
// and sees its gradients final; bucket 0 fires while the gradient at `first_layer` (an element of
// the first layer's weight, which backward writes last) is still unwritten, so that exchanging a
// bucket overlaps the rest of backward.
inline void check_bucket_callbacks(kernels::Executor& ex, kernels::FlatBuffer& grads,
                                   const std::vector<kernels::Bucket>& buckets,
                                   const float* dlogits, int64_t first_layer) {
  const float sentinel = 12345.f;  // anything a callback sees of it was not written yet
  std::fill(grads.begin(), grads.end(), sentinel);
  std::vector<int> fired;
  std::vector<std::vector<float>> seen(buckets.size());
  bool first_layer_pending_at_bucket0 = false;
  ex.backward(dlogits, [&](int b) {
    fired.push_back(b);
    seen.at(b).assign(grads.begin() + buckets[b].begin, grads.begin() + buckets[b].end);
    if (b == 0) first_layer_pending_at_bucket0 = grads[first_layer] == sentinel;
  });
  std::vector<int> expected(buckets.size());
  for (size_t b = 0; b < buckets.size(); ++b) expected[b] = static_cast<int>(b);
  CHECK(fired == expected);
  for (size_t b = 0; b < buckets.size(); ++b) {
    INFO("bucket " << b << " [" << buckets[b].begin << ", " << buckets[b].end << ")");
    CHECK(seen[b] ==
          std::vector<float>(grads.begin() + buckets[b].begin, grads.begin() + buckets[b].end));
  }
  CHECK(std::count(grads.begin(), grads.end(), sentinel) == 0);
  if (buckets.size() > 1) CHECK(first_layer_pending_at_bucket0);  // bucket 0 did not wait for all
}

// Backward right after a training forward on `x` overwrites the gradients instead of
// accumulating: after garbage in the gradients, another forward and backward give the same
// gradients, and so does a second backward on that one forward.
inline void check_backward_overwrites(kernels::Executor& ex, kernels::FlatBuffer& grads,
                                      const float* x, const float* dlogits,
                                      const kernels::BucketReady& ready) {
  ex.backward(dlogits, ready);
  const std::vector<float> once = grads;
  std::fill(grads.begin(), grads.end(), -7.f);
  ex.forward(x, true);
  ex.backward(dlogits, ready);
  CHECK(grads == once);
  ex.backward(dlogits, ready);  // twice on one forward: still no accumulation
  CHECK(grads == once);
}

// Backward throws std::logic_error unless the last forward was a training forward.
inline void check_backward_needs_training_forward(kernels::Executor& ex, const float* x,
                                                  const float* dlogits,
                                                  const kernels::BucketReady& ready) {
  CHECK_THROWS_AS(ex.backward(dlogits, ready), std::logic_error);
  ex.forward(x, true);
  ex.forward(x, false);
  CHECK_THROWS_AS(ex.backward(dlogits, ready), std::logic_error);
  ex.forward(x, true);
  CHECK_NOTHROW(ex.backward(dlogits, ready));
}

}  // namespace gg::test
