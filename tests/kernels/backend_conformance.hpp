// The backend-conformance fixture: what the tests of every backend share to hold it to the
// reference backend, the oracle. Random numbers that are the same on every standard library;
// parameters and inputs at a scale where every layer's output stays O(1); a probe that exposes a
// layer's input gradient; whole-tensor comparisons judged against the tensor's scale; a Twin, one
// graph compiled on the oracle and on the backend under test side by side; and the executor
// contract of kernels/executor.hpp (bucket callbacks, gradients overwritten, backward only after a
// training forward). Each backend's test file adds only what is its own: tolerances, shapes, and
// the checks no other backend needs.
#pragma once

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "kernels/executor.hpp"
#include "kernels/graph.hpp"
#include "kernels/loss.hpp"
#include "kernels/models.hpp"
#include "kernels/optimizer.hpp"

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

// n values uniform in [lo, hi), the first n of a generator seeded with `seed`.
inline std::vector<float> randoms(int64_t n, uint32_t seed, float lo = -1.f, float hi = 1.f) {
  Rng r(seed);
  std::vector<float> v(n);
  for (float& e : v) e = r.uniform(lo, hi);
  return v;
}

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

// Where a backend's tensor lies furthest from the oracle's.
struct Mismatch {
  double worst = 0;  // max |got - want|
  double scale = 0;  // max |want|
  int64_t at = -1;
  float got = 0, want = 0;
  int64_t non_finite = 0;  // NaN or inf on either side never counts as close
};

inline Mismatch mismatch(const float* got, const float* want, int64_t n) {
  Mismatch m;
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(got[i]) || !std::isfinite(want[i])) {
      ++m.non_finite;
      continue;
    }
    m.scale = std::max(m.scale, std::abs(static_cast<double>(want[i])));
    const double d = std::abs(static_cast<double>(got[i]) - want[i]);
    if (d > m.worst || m.at < 0) {
      m.worst = d;
      m.at = i;
      m.got = got[i];
      m.want = want[i];
    }
  }
  return m;
}

// What a comparison found: whether everything agreed, and a line for each thing that did not.
struct Verdict {
  bool ok = true;
  std::string report;
  void fail(const std::string& line) {
    ok = false;
    report += line + "\n";
  }
  Verdict& operator+=(const Verdict& o) {
    ok = ok && o.ok;
    report += o.report;
    return *this;
  }
};

// A backend's tensor against the oracle's, judged against the whole tensor's scale, not each
// element's: backends accumulate in orders and precisions of their own (the reference in double),
// so an element that comes out near zero by cancellation (a batch-norm bias gradient summing dy
// over a channel, a logit near 0) carries an absolute error of the size of the terms it summed.
//   max_i |got_i - want_i| <= tol * max(max_i |want_i|, 1e-3)
// The 1e-3 floor only matters for tensors that are nearly all zero. A real bug (wrong index,
// layout, padding rule, missing or doubled term) moves elements by the order of the tensor's
// largest value.
inline Verdict compare_tensor(const std::string& what, const float* got, const float* want,
                              int64_t n, double tol) {
  const Mismatch m = mismatch(got, want, n);
  Verdict v;
  if (m.non_finite != 0 || !(m.worst <= tol * std::max(m.scale, 1e-3))) {
    std::ostringstream s;
    s << what << ": max |got - want| = " << m.worst << " at [" << m.at << "] (got " << m.got
      << ", want " << m.want << "); max |want| = " << m.scale << ", tolerance " << tol
      << ", non-finite " << m.non_finite << " of " << n;
    v.fail(s.str());
  }
  return v;
}

inline Verdict compare_tensor(const std::string& what, std::span<const float> got,
                              std::span<const float> want, double tol) {
  if (got.size() != want.size()) {
    Verdict v;
    v.fail(what + ": " + std::to_string(got.size()) + " values against " +
           std::to_string(want.size()));
    return v;
  }
  return compare_tensor(what, got.data(), want.data(), static_cast<int64_t>(got.size()), tol);
}

inline void require(const Verdict& v) {
  INFO(v.report);
  CHECK(v.ok);
}

// The backend a test holds to the oracle, the precision it runs in, and how far it may lie from
// the oracle (see compare_tensor): in a forward; in the gradients of one backward, which pass
// through more layers (and batch-norm backward subtracts nearly equal sums); and after a few SGD
// steps, which compound the per-step differences (momentum carries them forward).
struct Target {
  kernels::Backend backend;
  kernels::Precision precision;
  double forward_tol, grad_tol, training_tol;
};

// Kinks. ReLU's derivative jumps at 0, and max pool's where two window values tie. A
// pre-activation that lands within rounding of 0 can be positive on one backend and not on the
// other (or a near-tie can go either way); backward then routes one element's gradient
// differently on the two backends, and both are right. Measured on resnet8 against oneDNN (about
// 1e5 ReLU inputs per step) this happens on about one input in ten, costs about 1e-2 of a
// gradient's scale, and vanishes when the input moves by 1e-4; which inputs hit a kink depends on
// the CPU's instruction set. So a training step is compared on up to kAttempts inputs, each a
// small random move of the last, and must agree on one of them: a wrong kernel disagrees on every
// input.
inline constexpr int kAttempts = 4;

// One graph compiled on the reference backend and on the target's at the same batch, each over
// its own ParamStore holding identical parameters and running statistics, fed the same input and
// labels: `ref` runs over `ref_store`, and `ex`, the backend under test, over `store`.
struct Twin {
  Twin(const Target& tgt, kernels::Graph graph, int64_t batch_size, uint32_t seed,
       int64_t bucket_elements = 1)
      : target(tgt),
        g(std::move(graph)),
        batch(batch_size),
        classes(g.classes()),
        buckets(kernels::make_buckets(g, bucket_elements)),
        ref_store(g),
        store(g),
        rng(seed) {
    init_random(g, ref_store, rng, RunningStats::Random);
    sync();
    ref = kernels::compile(g, kernels::Backend::Reference, batch, ref_store, buckets);
    ex = kernels::compile(g, target.backend, batch, store, buckets, target.precision);
    x.resize(batch * kernels::numel(g.input_dims()));
    for (float& v : x) v = rng.uniform(-1.f, 1.f);
    labels.resize(batch);
    for (int32_t& l : labels) l = static_cast<int32_t>(rng.below(static_cast<uint32_t>(classes)));
  }
  Twin(const Twin&) = delete;
  Twin& operator=(const Twin&) = delete;

  // Copies the reference store's parameters and statistics into the other store, element by
  // element: the executors keep pointers into both buffers.
  void sync() {
    std::copy(ref_store.params.begin(), ref_store.params.end(), store.params.begin());
    std::copy(ref_store.buffers.begin(), ref_store.buffers.end(), store.buffers.begin());
  }

  // A forward on both; the logits must agree. In eval mode the running statistics must come out
  // untouched on both backends.
  Verdict forward(bool train) { return forward(train, target.forward_tol); }
  Verdict forward(bool train, double tol) {
    const std::vector<float> ref_before = ref_store.buffers, before = store.buffers;
    const float* zr = ref->forward(x.data(), train);
    const float* z = ex->forward(x.data(), train);
    ref_logits.assign(zr, zr + batch * classes);
    Verdict v =
        compare_tensor(train ? "logits (train)" : "logits (eval)", z, zr, batch * classes, tol);
    if (!train && ref_store.buffers != ref_before)
      v.fail("the reference's eval forward changed the running statistics");
    if (!train && store.buffers != before)
      v.fail(std::string(kernels::backend_name(target.backend)) +
             "'s eval forward changed the running statistics");
    return v;
  }

  // The gradient of the loss w.r.t. the reference's logits of the last forward.
  std::vector<float> ref_dlogits() const {
    std::vector<float> dz(batch * classes);
    kernels::softmax_cross_entropy(ref_logits.data(), labels.data(), batch, classes, dz.data());
    return dz;
  }

  // Backward on both from one dlogits (the reference's, so that only backward is under test):
  // every parameter gradient must agree.
  Verdict backward() { return backward(target.grad_tol); }
  Verdict backward(double tol) {
    const std::vector<float> dz = ref_dlogits();
    ref->backward(dz.data(), {});
    ex->backward(dz.data(), [](int) {});
    Verdict v;
    for (const kernels::TensorSpec& t : g.params()) {
      const float* want = ref_store.grads.data() + t.offset;
      v += compare_tensor("d " + t.name, store.grads.data() + t.offset, want, t.size(), tol);
      // Guards the comparison itself: an all-zero oracle gradient would match a backend that
      // never wrote anything.
      if (std::none_of(want, want + t.size(), [](float e) { return e != 0.f; }))
        v.fail("d " + t.name + " is all zero on the reference: the test proves nothing");
    }
    return v;
  }

  Verdict buffers() { return buffers(target.forward_tol); }
  Verdict buffers(double tol) {
    Verdict v;
    for (const kernels::TensorSpec& t : g.buffers())
      v += compare_tensor(t.name, store.buffers.data() + t.offset,
                          ref_store.buffers.data() + t.offset, t.size(), tol);
    return v;
  }

  // A training step on both backends: logits, every running statistic and every gradient, on
  // the first of up to kAttempts inputs that meets no kink (see kAttempts).
  void check_train_step() {
    const std::vector<float> ref_stats = ref_store.buffers, stats = store.buffers;
    Verdict v;
    int attempt = 1;
    for (;; ++attempt) {
      v = forward(true);
      v += buffers();
      v += backward();
      if (v.ok || attempt == kAttempts) break;
      std::copy(ref_stats.begin(), ref_stats.end(), ref_store.buffers.begin());
      std::copy(stats.begin(), stats.end(), store.buffers.begin());
      for (float& e : x) e += rng.uniform(-1e-3f, 1e-3f);
    }
    if (v.ok && attempt > 1)
      WARN("agreed on attempt " << attempt << " after a kink (see kAttempts)");
    INFO("attempt " << attempt << " of " << kAttempts);
    require(v);
  }

  void check_forward(bool train) { require(forward(train)); }
  void check_forward(bool train, double tol) { require(forward(train, tol)); }

  Target target;
  kernels::Graph g;
  int64_t batch;
  int64_t classes;
  std::vector<kernels::Bucket> buckets;
  kernels::ParamStore ref_store, store;
  Rng rng;
  std::unique_ptr<kernels::Executor> ref, ex;
  std::vector<float> x;
  std::vector<int32_t> labels;
  std::vector<float> ref_logits;
};

// A few SGD steps on both backends, each step checked like check_train_step (logits, running
// statistics, every gradient) and the updated weights compared. Tiny nets with batch norm over a
// handful of values are chaotic under rounding: on googlenet with a sixteenth of its channels at
// 32x32, a 3e-6 relative weight difference after one step became a 10% gradient difference at the
// next and O(1) weight differences within six, while every step from equal weights agreed to 1e-5.
// So each step starts the backend under test from the reference's weights, statistics and
// momentum; what it carries between steps is its own state (reordered weights, workspaces, the
// dropout step).
inline void train_both(Twin& t, uint64_t init_seed, int steps) {
  kernels::init_params(t.g, t.ref_store, init_seed);
  t.sync();
  const std::vector<float> start = t.ref_store.params;
  kernels::Sgd ref_sgd(t.g.param_count(), {}), sgd(t.g.param_count(), {});
  for (int step = 0; step < steps; ++step) {
    INFO("step " << step);
    for (float& v : t.x) v = t.rng.uniform(-1.f, 1.f);
    for (int32_t& l : t.labels)
      l = static_cast<int32_t>(t.rng.below(static_cast<uint32_t>(t.classes)));
    t.check_train_step();
    ref_sgd.step(t.ref_store.params.data(), t.ref_store.grads.data(), 0.05f);
    sgd.step(t.store.params.data(), t.store.grads.data(), 0.05f);
    Verdict v;
    for (const kernels::TensorSpec& s : t.g.params())
      v += compare_tensor(s.name + " after the update", t.store.params.data() + s.offset,
                          t.ref_store.params.data() + s.offset, s.size(), t.target.training_tol);
    require(v);
    t.sync();
    sgd.velocity() = ref_sgd.velocity();
  }
  t.check_forward(false);              // eval, with the running statistics the steps produced
  CHECK(start != t.ref_store.params);  // training moved the weights
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
