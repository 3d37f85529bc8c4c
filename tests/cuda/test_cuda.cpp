// The CUDA backend against the reference backend (the oracle) and the oneDNN backend: every layer
// kind forward and backward, small ResNet and GoogLeNet on the same weights and input (fp32 with
// TF32 off tightly; TF32 and bf16 loosely), the device SGD update against kernels::Sgd, the
// bucket staging round trip, resident training against host-authoritative training, and the
// trainer's device state (kernels/train_state.hpp) against its host state. Runs
// only where a GPU is present (main.cpp skips otherwise).
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "gossip/comm/mixing.hpp"
#include "kernels/cuda/conv_stats.hpp"
#include "kernels/cuda/cuda_executor.hpp"
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/device_buffers.hpp"
#include "kernels/executor.hpp"
#include "kernels/graph.hpp"
#include "kernels/loss.hpp"
#include "kernels/models.hpp"
#include "kernels/optimizer.hpp"
#include "kernels/reference/reference_executor.hpp"
#include "kernels/train_state.hpp"
#include "tests/kernels/backend_conformance.hpp"

using namespace gg::kernels;
namespace gossip = gg::gossip;
using namespace gg::test;

namespace {

// One training step (forward, a fixed dlogits, backward) and one eval forward.
struct Outcome {
  std::vector<float> train_logits, eval_logits, grads, buffers;
};

using Maker = std::function<std::unique_ptr<Executor>(ParamStore&, const std::vector<Bucket>&)>;

// Attempt a > 0 moves the input by up to 1e-3 per attempt (see Kinks in backend_conformance.hpp).
Outcome run(const Graph& g, int64_t batch, const Maker& make, int attempt = 0) {
  ParamStore s(g);
  Rng r(11);
  init_random(g, s, r, RunningStats::Random);
  const std::vector<Bucket> buckets = make_buckets(g, 64);
  std::unique_ptr<Executor> e = make(s, buckets);
  std::vector<float> x = randoms(batch * numel(g.input_dims()), 5);
  for (int a = 1; a <= attempt; ++a) {
    const std::vector<float> move = randoms(x.size(), 100 + a, -1e-3f, 1e-3f);
    for (size_t i = 0; i < x.size(); ++i) x[i] += move[i];
  }
  const std::vector<float> dlogits = randoms(batch * g.classes(), 6, -0.1f, 0.1f);
  Outcome o;
  const float* y = e->forward(x.data(), true);
  o.train_logits.assign(y, y + batch * g.classes());
  e->backward(dlogits.data(), {});
  o.grads = s.grads;
  o.buffers = s.buffers;
  y = e->forward(x.data(), false);
  o.eval_logits.assign(y, y + batch * g.classes());
  return o;
}

Verdict differences(const Outcome& gpu, const Outcome& ref, double tol) {
  Verdict v = compare_tensor("training logits", gpu.train_logits, ref.train_logits, tol);
  v += compare_tensor("gradients", gpu.grads, ref.grads, tol);
  v += compare_tensor("running statistics", gpu.buffers, ref.buffers, tol);
  v += compare_tensor("eval logits", gpu.eval_logits, ref.eval_logits, tol);
  return v;
}

// The GPU and the oracle must agree on one of kAttempts inputs, each a small move of the last: a
// ReLU or max-pool kink routes a gradient differently on the two sides, and both are right; a
// wrong kernel disagrees on every input.
void compare(const Graph& g, int64_t batch, const Maker& gpu, const Maker& ref, double tol) {
  Verdict v;
  for (int a = 0; a < kAttempts; ++a) {
    v = differences(run(g, batch, gpu, a), run(g, batch, ref, a), tol);
    if (v.ok) return;
  }
  require(v);
}

// find: time cuDNN's candidates (the default); false takes its heuristics' first, which is the
// same for two executors of one graph, so that they round alike.
auto cuda_maker(const Graph& g, int64_t batch, Precision p, bool tf32, bool fuse = true,
                bool nhwc = false, bool find = true, bool conv_stats = false) {
  return [&g, batch, p, tf32, fuse, nhwc, find, conv_stats](ParamStore& s,
                                                            const std::vector<Bucket>& b) {
    CudaOptions o;
    o.tf32 = tf32;
    o.fuse = fuse;
    o.nhwc = nhwc;
    o.find_algorithms = find;
    o.conv_stats = conv_stats;
    return std::unique_ptr<Executor>(make_cuda_executor(g, batch, s, b, p, o));
  };
}
auto reference_maker(const Graph& g, int64_t batch) {
  return [&g, batch](ParamStore& s, const std::vector<Bucket>& b) {
    return make_reference_executor(g, batch, s, b);
  };
}

// input -> conv -> LAYER -> fc: the conv's weight gradient carries the layer's input gradient.
Graph around(const std::function<int(Graph&, int)>& layer, Dims input = {5, 9, 9}) {
  Graph g(std::move(input));
  const int c = g.conv("conv0", g.input(), {6, 3, 1, 1, true});
  const int l = layer(g, c);
  g.set_output(g.fully_connected("fc", l, {7, true}));
  return g;
}

// input -> conv -> LAYER -> global average pool -> fc: for channels-last, whose fully connected
// layers read feature vectors only.
Graph around_pooled(const std::function<int(Graph&, int)>& layer, Dims input = {5, 9, 9}) {
  Graph g(std::move(input));
  const int c = g.conv("conv0", g.input(), {8, 3, 1, 1, true});
  const int l = layer(g, c);
  g.set_output(g.fully_connected("fc", g.global_avg_pool(l), {7, true}));
  return g;
}

using Layers = std::vector<std::pair<std::string, std::function<int(Graph&, int)>>>;

// The pools and a concat, in both layouts' tests.
Layers pools_and_concat() {
  return {
      {"max pool ceil mode",
       [](Graph& g, int x) {
         return g.max_pool(x, {3, 2, 0, true});
       }},
      {"max pool padded",
       [](Graph& g, int x) {
         return g.max_pool(x, {3, 2, 1, false});
       }},
      {"avg pool",
       [](Graph& g, int x) {
         return g.avg_pool(x, {3, 2, 1, false});
       }},
      {"concat of three branches",
       [](Graph& g, int x) {
         return g.concat({g.conv("a", x, {3, 1, 1, 0, false}), x, g.relu(x)});
       }},
  };
}

}  // namespace

TEST_CASE("every layer kind agrees with the reference backend, forward and backward (fp32)") {
  Layers layers = {
      {"conv stride 2 with bias",
       [](Graph& g, int x) {
         return g.conv("c", x, {8, 3, 2, 1, true});
       }},
      {"conv 1x1",
       [](Graph& g, int x) {
         return g.conv("c", x, {4, 1, 1, 0, false});
       }},
      {"batch norm",
       [](Graph& g, int x) {
         return g.batch_norm("bn", x, {1e-3f, 0.1f});
       }},
      {"relu", [](Graph& g, int x) { return g.relu(x); }},
      {"global avg pool", [](Graph& g, int x) { return g.global_avg_pool(x); }},
      {"add of a branch and its input",
       [](Graph& g, int x) {
         return g.add(g.relu(g.conv("b", x, {6, 3, 1, 1, false})), x);
       }},
      {"add of a tensor to itself", [](Graph& g, int x) { return g.add(x, x); }},
      {"dropout",
       [](Graph& g, int x) {
         return g.dropout(x, {0.3f, 9});
       }},
      {"lrn",
       [](Graph& g, int x) {
         return g.lrn(x, {5, 1e-2f, 0.75f, 2.f});
       }},
      {"fully connected without bias",
       [](Graph& g, int x) {
         return g.relu(g.fully_connected("f", x, {11, false}));
       }},
      {"batch norm of features",
       [](Graph& g, int x) {
         return g.batch_norm("bnf", g.fully_connected("f", x, {10, true}));
       }},
  };
  for (auto& l : pools_and_concat()) layers.push_back(std::move(l));
  for (const auto& [name, layer] : layers) {
    SECTION(name) {
      const Graph g = around(layer);
      const int64_t batch = 3;
      compare(g, batch, cuda_maker(g, batch, Precision::Fp32, false), reference_maker(g, batch),
              1e-4);
    }
  }
}

// A torchvision model at RESxRES with 10 classes.
Graph small_model(const std::string& name, int res) {
  ModelSpec spec;
  spec.name = name;
  spec.input = {3, res, res};
  spec.classes = 10;
  return build_model(spec);
}

// Relative L2 error ||got - want|| / ||want|| over the whole tensor.
double relative_l2(const std::vector<float>& got, const std::vector<float>& want) {
  REQUIRE(got.size() == want.size());
  double d = 0, w = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    d += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    w += double(want[i]) * want[i];
  }
  return std::sqrt(d / std::max(w, 1e-30));
}

// The shapes a batch norm fuses in (CudaOptions::fuse): with the ReLU that reads it; with a
// residual add and its ReLU, the residual read only by the add (a projection shortcut's batch
// norm, whose gradient the fused pass writes directly), read also by a layer that backward
// visits later (the fused pass writes its gradient first) or earlier (it adds to it). Each on
// 8x8 planes (16-byte vectors) and on 9x9 ones (one value a thread).
std::vector<std::pair<std::string, std::function<int(Graph&, int)>>> fusable_blocks(int64_t c = 6) {
  return {
      {"batch norm + relu",
       [](Graph& g, int x) {
         return g.relu(g.batch_norm("bn", x, {1e-3f, 0.1f}));
       }},
      {"batch norm + add + relu, projection shortcut",
       [c](Graph& g, int x) {
         const int a = g.batch_norm("bna", g.conv("a", x, {c, 3, 1, 1, false}), {1e-5f, 0.1f});
         const int b = g.batch_norm("bnb", g.conv("b", x, {c, 1, 1, 0, false}), {1e-5f, 0.1f});
         return g.relu(g.add(a, b));
       }},
      {"batch norm + add + relu, identity shortcut written first",
       [c](Graph& g, int x) {
         return g.relu(g.add(g.batch_norm("bn", g.conv("a", x, {c, 3, 1, 1, false})), x));
       }},
      {"batch norm + add + relu, the shortcut the batch norm's own input",
       [](Graph& g, int x) { return g.relu(g.add(g.batch_norm("bn", x), x)); }},
      {"batch norm + add + relu, identity shortcut read again after",
       [c](Graph& g, int x) {
         const int r = g.relu(g.add(x, g.batch_norm("bn", g.conv("a", x, {c, 3, 1, 1, false}))));
         return g.concat({r, x});
       }},
  };
}

TEST_CASE("fused batch norm, residual add and ReLU agree with the reference backend (fp32)") {
  for (const auto& [name, layer] : fusable_blocks()) {
    for (const int side : {8, 9}) {
      SECTION(name + " at " + std::to_string(side) + "x" + std::to_string(side)) {
        const Graph g = around(layer, {5, side, side});
        const int64_t batch = 3;
        compare(g, batch, cuda_maker(g, batch, Precision::Fp32, false), reference_maker(g, batch),
                1e-4);
      }
    }
  }
}

TEST_CASE("fused and unfused runs agree: fp32 to rounding, bf16 as closely as bf16 allows") {
  std::vector<std::pair<std::string, Graph>> graphs;
  for (const auto& [name, layer] : fusable_blocks())
    graphs.emplace_back(name, around(layer, {5, 8, 8}));
  for (const std::string model : {"resnet18", "googlenet"})
    graphs.emplace_back(model + " at 32x32", small_model(model, 32));
  for (const auto& [name, g] : graphs) {
    SECTION(name) {
      const int64_t batch = 4;
      // The same cuDNN algorithms on both sides (heuristics, not timing): only the fused passes'
      // summation order differs.
      compare(g, batch, cuda_maker(g, batch, Precision::Fp32, false, true, false, false),
              cuda_maker(g, batch, Precision::Fp32, false, false, false, false), 1e-4);
      // bf16: fused rounds the sum once, unfused the batch norm's output and then the sum.
      const Outcome fused = run(g, batch, cuda_maker(g, batch, Precision::Bf16, false, true));
      const Outcome apart = run(g, batch, cuda_maker(g, batch, Precision::Bf16, false, false));
      const double eval = relative_l2(fused.eval_logits, apart.eval_logits);
      const double stats = relative_l2(fused.buffers, apart.buffers);
      std::printf("%s bf16 fused against unfused: eval logits %.3g, running statistics %.3g\n",
                  name.c_str(), eval, stats);
      CHECK(eval <= 2e-2);
      CHECK(stats <= 2e-2);
    }
  }
}

TEST_CASE(
    "small ResNet and GoogLeNet agree with the oneDNN backend on the same weights and input") {
  for (const std::string name : {"resnet18", "googlenet"}) {
    SECTION(name) {
      const Graph g = small_model(name, 32);
      const int64_t batch = 4;
      const Maker onednn = [&](ParamStore& s, const std::vector<Bucket>& b) {
        return compile(g, Backend::OneDnn, batch, s, b);
      };
      compare(g, batch, cuda_maker(g, batch, Precision::Fp32, false), onednn, 2e-3);
      // TF32 and bf16: the evaluation forward and the running statistics by relative L2 error
      // (printed). Their gradients are not compared with fp32's: see the next test.
      const Outcome ref = run(g, batch, onednn);
      for (const auto& [what, p, tf32, tol] : {std::tuple{"tf32", Precision::Fp32, true, 1e-2},
                                               std::tuple{"bf16", Precision::Bf16, false, 3e-2}}) {
        const Outcome o = run(g, batch, cuda_maker(g, batch, p, tf32));
        const double eval = relative_l2(o.eval_logits, ref.eval_logits);
        const double stats = relative_l2(o.buffers, ref.buffers);
        std::printf(
            "%s %s against oneDNN fp32: eval logits %.3g, running statistics %.3g "
            "(relative L2, bound %g)\n",
            name.c_str(), what, eval, stats, tol);
        CHECK(eval <= tol);
        CHECK(stats <= tol);
      }
    }
  }
}

// Low precision's gradients cannot be held to fp32's, element by element or in norm: max pooling
// routes each gradient to whichever of two near-equal inputs the rounding made larger, and batch
// norm over a few values per channel magnifies rounding. Measured on an H100 (64x64, batch 8,
// against oneDNN fp32, relative L2 of all weight gradients): ResNet-18 0.046 TF32 and 0.32 bf16,
// GoogLeNet (a max pool in every inception block) 0.14 and 0.95, while the forward's logits
// agreed to 1e-3 (TF32) and 3e-2 (bf16). What the gradients must do is train: SGD on one batch
// lowers its loss in TF32 and bf16 about as far as in fp32 (a wrong backward does not).
TEST_CASE("TF32 and bf16 gradients train: SGD on one batch lowers its loss as fp32's do") {
  for (const std::string name : {"resnet18", "googlenet"}) {
    SECTION(name) {
      const Graph g = small_model(name, 64);
      const int64_t batch = 8;
      const std::vector<float> x = randoms(batch * numel(g.input_dims()), 21);
      std::vector<int32_t> labels(batch);
      for (int64_t i = 0; i < batch; ++i) labels[i] = static_cast<int32_t>((i * 7) % g.classes());
      const std::vector<Bucket> buckets = make_buckets(g, 1 << 30);
      // The batch's loss before and after `steps` SGD steps on it.
      auto descend = [&](Precision p, bool tf32) {
        ParamStore s(g);
        init_params(g, s, 5);
        auto e = make_cuda_executor(g, batch, s, buckets, p, {tf32, true});
        Sgd sgd(g.param_count(), {0.9f, 0.f, false});
        std::vector<float> dlogits(batch * g.classes());
        double first = 0, last = 0;
        const int steps = 25;
        for (int step = 0; step <= steps; ++step) {
          const float* logits = e->forward(x.data(), true);
          last =
              softmax_cross_entropy(logits, labels.data(), batch, g.classes(), dlogits.data()).loss;
          if (step == 0) first = last;
          if (step == steps) break;
          e->backward(dlogits.data(), {});
          sgd.step(s.params.data(), s.grads.data(), 0.03f);
        }
        return std::pair{first, last};
      };
      const auto [f0, f1] = descend(Precision::Fp32, false);
      const auto [t0, t1] = descend(Precision::Fp32, true);
      const auto [b0, b1] = descend(Precision::Bf16, false);
      std::printf(
          "%s, one batch, 25 SGD steps: loss fp32 %.4f -> %.4f, tf32 %.4f -> %.4f, bf16 "
          "%.4f -> %.4f\n",
          name.c_str(), f0, f1, t0, t1, b0, b1);
      REQUIRE(f0 - f1 > 0.5 * f0);  // the batch is learnt at this rate in fp32
      CHECK(t0 - t1 >= 0.8 * (f0 - f1));
      CHECK(b0 - b1 >= 0.7 * (f0 - f1));
    }
  }
}

TEST_CASE("the device SGD update gives kernels::Sgd's bits over several steps") {
  for (const bool nesterov : {false, true}) {
    const int64_t n = 1000;
    SgdOptions o{0.9f, 1e-3f, nesterov};
    std::vector<float> w = randoms(n, 1), host_grads(n);
    cuda::DeviceBuffers dev(n, 0, {{0, n}}, host_grads.data(), nullptr);
    dev.upload_params(w.data());
    Sgd host(n, o);
    for (int step = 0; step < 3; ++step) {
      const std::vector<float> g = randoms(n, 10 + step);
      host_grads = g;
      dev.upload_bucket(0);
      dev.sgd_step(0.1f, o);
      host.step(w.data(), g.data(), 0.1f);
      // host_grads is the source of the next upload: this step's must have left it.
      REQUIRE(cudaStreamSynchronize(dev.compute()) == cudaSuccess);
    }
    std::vector<float> got(n), v(n);
    dev.download_params(got.data());
    dev.download_velocity(v.data());
    // Bit for bit: a resident gossip step must mix and update as the host does (issue 56).
    CHECK(got == w);
    CHECK(v == host.velocity());
  }
}

TEST_CASE("the device mixing rules give gossip/comm/mixing.hpp's bits") {
  const int64_t n = 100003;  // not a multiple of any vector width
  const std::vector<float> a = randoms(n, 3), b = randoms(n, 4), c = randoms(n, 5);
  cuda::DeviceArray<float> da(n), db(n), dc(n), dd(n);
  const auto up = [n](cuda::DeviceArray<float>& d, const std::vector<float>& h) {
    REQUIRE(cudaMemcpy(d.get(), h.data(), n * 4, cudaMemcpyHostToDevice) == cudaSuccess);
  };
  const auto down = [n](const cuda::DeviceArray<float>& d) {
    std::vector<float> h(static_cast<size_t>(n));
    REQUIRE(cudaMemcpy(h.data(), d.get(), n * 4, cudaMemcpyDeviceToHost) == cudaSuccess);
    return h;
  };
  // Each rule on the host (gossip/comm/mixing.cpp) and on the device, from the same values.
  std::vector<float> x = a, delta(static_cast<size_t>(n));
  up(da, a);
  up(db, b);
  gossip::mix_pair(x, b);
  cuda::mix_pair(da.get(), db.get(), n, nullptr);
  CHECK(down(da) == x);
  gossip::mix_correction(b, x, delta);  // sent b, the partner's bucket the mixed values
  cuda::mix_correction(db.get(), da.get(), dd.get(), n, nullptr);
  CHECK(down(dd) == delta);
  std::vector<float> y = c;
  up(dc, c);
  gossip::apply_correction(y, delta);
  cuda::apply_correction(dc.get(), dd.get(), n, nullptr);
  CHECK(down(dc) == y);
  up(da, a);
  gossip::mix_copies(y, a, b);
  cuda::mix_copies(dc.get(), da.get(), db.get(), n, nullptr);
  CHECK(down(dc) == y);
}

TEST_CASE("buckets go device -> host -> device through the staging hooks unchanged") {
  const int64_t n = 10000;
  std::vector<float> host(n, 0.f);
  const std::vector<Bucket> buckets = {{6000, 10000}, {2500, 6000}, {0, 2500}};
  cuda::DeviceBuffers dev(n, 0, buckets, host.data(), nullptr);
  const std::vector<float> g = randoms(n, 3);
  REQUIRE(cudaMemcpy(dev.grads(), g.data(), n * sizeof(float), cudaMemcpyHostToDevice) ==
          cudaSuccess);
  for (int b = 0; b < 3; ++b) dev.on_bucket_ready(b);
  for (int b = 0; b < 3; ++b) {
    dev.wait_bucket_host(b);
    for (int64_t i = buckets[b].begin; i < buckets[b].end; ++i) REQUIRE(host[i] == g[i]);
  }
  for (float& v : host) v *= 0.5f;  // what mixing with a partner would do
  for (int b = 0; b < 3; ++b) dev.upload_bucket(b);
  std::vector<float> back(n);
  REQUIRE(cudaStreamSynchronize(dev.compute()) == cudaSuccess);
  REQUIRE(cudaMemcpy(back.data(), dev.grads(), n * sizeof(float), cudaMemcpyDeviceToHost) ==
          cudaSuccess);
  CHECK(back == host);
}

TEST_CASE("host-authoritative backward hands every bucket over in order, final on the host") {
  ModelSpec spec;
  spec.name = "resnet8";
  const Graph g = build_model(spec);
  ParamStore s(g);
  Rng r(4);
  init_random(g, s, r, RunningStats::Random);
  const std::vector<Bucket> buckets = make_buckets(g, 2000);
  REQUIRE(buckets.size() > 2);
  auto e = make_cuda_executor(g, 8, s, buckets, Precision::Fp32, {false, true});
  const std::vector<float> x = randoms(8 * numel(g.input_dims()), 2);
  const std::vector<float> dl = randoms(8 * g.classes(), 3, -0.1f, 0.1f);
  e->forward(x.data(), true);
  std::vector<int> order;
  std::vector<std::vector<float>> seen;
  e->backward(dl.data(), [&](int b) {
    order.push_back(b);
    seen.emplace_back(s.grads.begin() + buckets[b].begin, s.grads.begin() + buckets[b].end);
  });
  REQUIRE(order.size() == buckets.size());
  for (size_t b = 0; b < buckets.size(); ++b) {
    CHECK(order[b] == static_cast<int>(b));
    CHECK(std::equal(seen[b].begin(), seen[b].end(), s.grads.begin() + buckets[b].begin));
  }
}

// ResNet-8, one batch of 8 (fixed inputs, labels 0..7), and two stores holding the same random
// weights and statistics: one for the host's side of a comparison, one for the device's.
struct Resnet8Twins {
  static Graph resnet8() {
    ModelSpec spec;
    spec.name = "resnet8";
    return build_model(spec);
  }
  Resnet8Twins() : x(randoms(batch * numel(g.input_dims()), 2)), labels(batch), host(g), dev(g) {
    for (int64_t i = 0; i < batch; ++i) labels[i] = static_cast<int32_t>(i % g.classes());
    Rng r(8);
    init_random(g, host, r, RunningStats::Random);
    dev.params = host.params;
    dev.buffers = host.buffers;
  }
  const Graph g = resnet8();
  const int64_t batch = 8;
  const std::vector<float> x;
  std::vector<int32_t> labels;
  ParamStore host, dev;
};

TEST_CASE("resident training on the device follows host-authoritative training") {
  Resnet8Twins t;
  const Graph& g = t.g;
  const int64_t batch = t.batch;
  const std::vector<float>& x = t.x;
  const std::vector<int32_t>& labels = t.labels;
  ParamStore &host_store = t.host, &dev_store = t.dev;
  const SgdOptions o{0.9f, 1e-4f, false};
  const std::vector<Bucket> buckets = make_buckets(g, 1 << 30);

  // cuDNN's heuristics on both sides (not timing), so that both run the same algorithms.
  auto a = make_cuda_executor(g, batch, host_store, buckets, Precision::Fp32, {false, false});
  Sgd sgd(g.param_count(), o);
  std::vector<float> dlogits(batch * g.classes());
  double host_loss = 0;
  for (int step = 0; step < 3; ++step) {
    const float* logits = a->forward(x.data(), true);
    host_loss =
        softmax_cross_entropy(logits, labels.data(), batch, g.classes(), dlogits.data()).loss;
    a->backward(dlogits.data(), {});
    sgd.step(host_store.params.data(), host_store.grads.data(), 0.05f);
  }

  auto b = make_cuda_executor(g, batch, dev_store, buckets, Precision::Fp32, {false, false});
  b->set_resident(true);
  b->device().upload_params(dev_store.params.data());
  b->device().upload_buffers(dev_store.buffers.data());
  double dev_loss = 0;
  for (int step = 0; step < 3; ++step) {
    REQUIRE(cudaMemcpyAsync(b->device_input(), x.data(), x.size() * sizeof(float),
                            cudaMemcpyHostToDevice, b->device().compute()) == cudaSuccess);
    b->forward_device(true);
    b->loss_device(labels.data());
    dev_loss = b->last_loss();
    b->backward_device({});
    b->device().sgd_step(0.05f, o);
  }
  b->device().download_params(dev_store.params.data());
  b->device().download_buffers(dev_store.buffers.data());
  CHECK(std::fabs(dev_loss - host_loss) <= 1e-3 * std::max(1.0, std::fabs(host_loss)));
  require(compare_tensor("weights after 3 steps", dev_store.params, host_store.params, 1e-4));
  require(compare_tensor("running statistics after 3 steps", dev_store.buffers, host_store.buffers,
                         1e-4));
}

TEST_CASE("the trainer's device state trains as its host state does, host copies on demand") {
  Resnet8Twins t;
  const Graph& g = t.g;
  const int64_t batch = t.batch;
  const std::vector<float>& x = t.x;
  std::vector<int32_t>& labels = t.labels;
  ParamStore &host_store = t.host, &dev_store = t.dev;
  const SgdOptions o{0.9f, 1e-4f, false};
  const std::vector<Bucket> buckets = make_buckets(g, 4096);
  auto a = make_cuda_executor(g, batch, host_store, buckets, Precision::Fp32, {false, false});
  auto b = make_cuda_executor(g, batch, dev_store, buckets, Precision::Fp32, {false, false});
  Sgd host_sgd(g.param_count(), o), dev_sgd(g.param_count(), o);
  auto host = make_host_state(*a, host_store, host_sgd, g.classes());
  auto dev = make_device_state(*b, dev_store, dev_sgd);
  CHECK(std::string(dev->where()) == "device");
  dev->stage_grads(true);  // as under a gradient exchange: each bucket on the host, in order
  std::vector<double> host_losses, dev_losses;
  for (int step = 0; step < 4; ++step) {
    host_losses.push_back(host->forward(x.data(), labels.data()).loss);
    host->backward({});
    host->update(0.05f);
    const StepLoss l = dev->forward(x.data(), labels.data());
    CHECK(l.known == (step > 0));  // one step late
    if (l.known) {
      CHECK(l.lag == 1);
      dev_losses.push_back(l.loss);
    }
    std::vector<int> order;
    dev->backward([&](int k) { order.push_back(k); });
    REQUIRE(order.size() == buckets.size());
    CHECK((dev->stale() & kGrads) == 0);  // staged: the host copy is current
    std::vector<float> on_device(static_cast<size_t>(g.param_count()));
    b->device().download_grads(on_device.data());
    CHECK(std::equal(on_device.begin(), on_device.end(), dev_store.grads.begin()));
    dev->from_host(kGrads);  // as after the exchange mixed them
    dev->update(0.05f);
    CHECK((dev->stale() & (kParams | kVelocity | kBuffers)) == (kParams | kVelocity | kBuffers));
  }
  for (size_t k = 0; k < dev_losses.size(); ++k)
    CHECK(std::fabs(dev_losses[k] - host_losses[k]) <= 1e-3 * std::max(1.0, host_losses[k]));
  dev->to_host(kParams | kBuffers | kVelocity);
  CHECK(dev->stale() == 0);
  CHECK(dev_sgd.started());
  require(compare_tensor("weights after 4 steps", dev_store.params, host_store.params, 1e-4));
  require(compare_tensor("statistics after 4 steps", dev_store.buffers, host_store.buffers, 1e-4));
  require(compare_tensor("momentum after 4 steps", dev_sgd.velocity(), host_sgd.velocity(), 1e-4));
  // A write to the host copies reaches the state: halve the weights, hand them back, read again.
  for (int64_t i = 0; i < dev_store.params.size(); ++i) dev_store.params[i] *= 0.5f;
  const std::vector<float> written = dev_store.params;
  dev->from_host(kParams);
  std::fill(dev_store.params.begin(), dev_store.params.end(), 0.f);
  b->device().download_params(dev_store.params.data());
  CHECK(dev_store.params == written);
}

TEST_CASE("a CUDA graph's replays train as eager steps do, dropout masks and labels included") {
  Graph g({3, 16, 16});
  const int c = g.conv("c", g.input(), {8, 3, 1, 1, false});
  const int f = g.global_avg_pool(g.relu(g.batch_norm("bn", c)));
  g.set_output(g.fully_connected("fc", g.dropout(f, {0.5f, 3}), {10, true}));
  const int64_t batch = 8;
  const std::vector<float> x = randoms(batch * numel(g.input_dims()), 2);
  // Other labels every step: a replay must read the ones staged for it.
  std::vector<std::vector<int32_t>> labels(6, std::vector<int32_t>(batch));
  for (size_t k = 0; k < labels.size(); ++k)
    for (int64_t i = 0; i < batch; ++i)
      labels[k][i] = static_cast<int32_t>((i + 3 * k) % g.classes());
  const SgdOptions o{0.9f, 1e-4f, false};
  const std::vector<Bucket> buckets = make_buckets(g, 1 << 30);
  ParamStore eager_store(g);
  Rng r(8);
  init_random(g, eager_store, r, RunningStats::Random);
  ParamStore graph_store(g);
  graph_store.params = eager_store.params;
  graph_store.buffers = eager_store.buffers;
  // Resident, on cuDNN's heuristics (both run the same algorithms), the input uploaded once.
  const auto start = [&](ParamStore& s) {
    auto e = make_cuda_executor(g, batch, s, buckets, Precision::Fp32, {false, false});
    e->set_resident(true);
    e->device().upload_params(s.params.data());
    e->device().upload_buffers(s.buffers.data());
    REQUIRE(cudaMemcpyAsync(e->device_input(), x.data(), x.size() * sizeof(float),
                            cudaMemcpyHostToDevice, e->device().compute()) == cudaSuccess);
    return e;
  };
  auto a = start(eager_store);
  auto b = start(graph_store);
  const auto enqueue = [&](CudaExecutor& e, const std::vector<int32_t>& y) {
    e.forward_device(true);
    e.loss_device(y.data());
    e.backward_device({});
    e.device().sgd_step(0.05f, o);
  };
  // Steps 0-4: eager on a; on b step 0 eager, step 1 captured, steps 1-4 replayed (an evaluation
  // between two of them), then step 5 eager on both.
  CHECK_THROWS_AS(b->capture_step([&] { enqueue(*b, labels[1]); }), std::logic_error);
  for (int k = 0; k < 5; ++k) {
    enqueue(*a, labels[k]);
    if (k == 2) a->forward_device(false);
  }
  enqueue(*b, labels[0]);
  b->capture_step([&] { enqueue(*b, labels[1]); });
  for (int k = 1; k < 5; ++k) {
    if (k > 1) b->stage_labels(labels[k].data());
    b->replay_step();
    if (k == 2) b->forward_device(false);
  }
  CHECK(b->dropout_step() == 5);
  enqueue(*a, labels[5]);
  enqueue(*b, labels[5]);
  const double eager_loss = a->last_loss(), graph_loss = b->last_loss();
  CHECK(a->dropout_step() == 6);
  CHECK(b->dropout_step() == 6);
  CHECK(std::fabs(graph_loss - eager_loss) <= 1e-4 * std::max(1.0, std::fabs(eager_loss)));
  a->device().download_params(eager_store.params.data());
  b->device().download_params(graph_store.params.data());
  a->device().download_buffers(eager_store.buffers.data());
  b->device().download_buffers(graph_store.buffers.data());
  a->synchronize();
  b->synchronize();
  require(compare_tensor("weights after 6 steps", graph_store.params, eager_store.params, 1e-4));
  require(compare_tensor("running statistics after 6 steps", graph_store.buffers,
                         eager_store.buffers, 1e-4));
}

TEST_CASE("channels-last agrees with the reference backend and with channels-first (fp32)") {
  Layers layers = {
      {"conv stride 2 with bias",
       [](Graph& g, int x) {
         return g.conv("c", x, {16, 3, 2, 1, true});
       }},
      {"conv 1x1 to 5 channels (no 16-byte vectors)",
       [](Graph& g, int x) {
         return g.conv("c", x, {5, 1, 1, 0, false});
       }},
      {"batch norm alone", [](Graph& g, int x) { return g.batch_norm("bn", x); }},
  };
  Layers all = layers;
  for (auto& l : pools_and_concat()) all.push_back(std::move(l));
  all.emplace_back("batch norm + relu over 5 channels (no 16-byte vectors)", [](Graph& g, int x) {
    return g.relu(g.batch_norm("bn", g.conv("c", x, {5, 1, 1, 0, false})));
  });
  for (const auto& b : fusable_blocks(8)) all.push_back(b);
  for (const auto& [name, layer] : all) {
    for (const int side : {8, 9}) {
      SECTION(name + " at " + std::to_string(side) + "x" + std::to_string(side)) {
        const Graph g = around_pooled(layer, {5, side, side});
        const int64_t batch = 3;
        compare(g, batch, cuda_maker(g, batch, Precision::Fp32, false, true, true),
                reference_maker(g, batch), 1e-4);
      }
    }
  }
  for (const std::string model : {"resnet18", "googlenet"}) {
    SECTION(model + " at 32x32 against channels-first") {
      const Graph g = small_model(model, 32);
      const int64_t batch = 4;
      // Other cuDNN kernels round otherwise, and a ReLU or max-pool kink may route a gradient
      // otherwise: the tolerance and the retries of the comparison with oneDNN above.
      compare(g, batch, cuda_maker(g, batch, Precision::Fp32, false, true, true),
              cuda_maker(g, batch, Precision::Fp32, false, true, false), 2e-3);
      const Outcome last = run(g, batch, cuda_maker(g, batch, Precision::Bf16, false, true, true));
      const Outcome first =
          run(g, batch, cuda_maker(g, batch, Precision::Bf16, false, true, false));
      const double eval = relative_l2(last.eval_logits, first.eval_logits);
      std::printf("%s bf16 channels-last against channels-first: eval logits %.3g\n", model.c_str(),
                  eval);
      CHECK(eval <= 3e-2);
    }
  }
}

TEST_CASE("batch-norm statistics from the convolution's epilogue train as the statistics pass") {
  for (const std::string model : {"resnet18", "googlenet"}) {
    SECTION(model + " at 32x32, bf16 channels-last") {
      const Graph g = small_model(model, 32);
      const int64_t batch = 4;
      {
        ParamStore s(g);
        CudaOptions o;
        o.nhwc = true;
        o.conv_stats = true;
        const auto ex = make_cuda_executor(g, batch, s, {}, Precision::Bf16, o);
        std::printf("%s: %d convolutions give their batch norm's statistics; %zu could not\n",
                    model.c_str(), ex->conv_stats_fused(), ex->conv_stats_skipped().size());
        for (const std::string& why : ex->conv_stats_skipped()) std::printf("  %s\n", why.c_str());
        // With cudnn-frontend, an H100 or H200 has a plan for most of these shapes.
        if (cuda::conv_stats_built()) CHECK(ex->conv_stats_fused() > 0);
      }
      const Outcome fused =
          run(g, batch, cuda_maker(g, batch, Precision::Bf16, false, true, true, true, true));
      const Outcome apart =
          run(g, batch, cuda_maker(g, batch, Precision::Bf16, false, true, true, true, false));
      const double eval = relative_l2(fused.eval_logits, apart.eval_logits);
      const double stats = relative_l2(fused.buffers, apart.buffers);
      std::printf(
          "%s bf16 statistics from the epilogue against the pass: eval logits %.3g, "
          "running statistics %.3g\n",
          model.c_str(), eval, stats);
      CHECK(eval <= 2e-2);
      CHECK(stats <= 2e-2);
    }
  }
  SECTION("refused in one line without channels-last bf16") {
    const Graph g = small_model("resnet18", 32);
    ParamStore s(g);
    CHECK_THROWS_WITH(cuda_maker(g, 2, Precision::Fp32, false, true, true, true, true)(s, {}),
                      Catch::Contains("conv_stats") && Catch::Contains("nhwc"));
  }
}

TEST_CASE("channels-last refuses in one line the layers it does not cover") {
  const int64_t batch = 2;
  for (const auto& [layer, name] : {std::pair<std::function<int(Graph&, int)>, std::string>{
                                        [](Graph&g, int x) {
                                          return g.lrn(x, {5, 1e-2f, 0.75f, 2.f});
                                        },
                                        "lrn"},
                                    {[](Graph&g, int x) {
                                       return g.dropout(x, {0.3f, 9});
                                     },
                                     "dropout"},
                                    {[](Graph&g, int x) { return g.relu(x); }, "fc"}}) {
    const Graph g = around(layer);
    ParamStore s(g);
    CHECK_THROWS_WITH(cuda_maker(g, batch, Precision::Fp32, false, true, true)(s, {}),
                      Catch::Contains("CUDA backend: channels-last (nhwc) cannot run layer") &&
                          Catch::Contains("run it channels-first"));
  }
}
