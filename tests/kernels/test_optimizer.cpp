#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "kernels/optimizer.hpp"

using namespace gg::kernels;

TEST_CASE("SGD with momentum and weight decay matches torch.optim.SGD by hand") {
  Sgd sgd(1, {0.9f, 0.1f, false});
  float w = 1.f;
  const float g1 = 0.5f, g2 = -0.25f;
  sgd.step(&w, &g1, 0.1f);
  // v1 = g1 + wd*w0 = 0.6; w1 = 1 - 0.06
  CHECK(w == Approx(0.94f));
  sgd.step(&w, &g2, 0.1f);
  // v2 = 0.9*0.6 + (-0.25 + 0.1*0.94) = 0.384; w2 = 0.94 - 0.0384
  CHECK(w == Approx(0.9016f));
}

TEST_CASE("Nesterov SGD follows PyTorch's formulation") {
  Sgd sgd(1, {0.5f, 0.f, true});
  float w = 0.f;
  const float g = 1.f;
  sgd.step(&w, &g, 1.f);  // v = 1; w -= 1 + 0.5*1
  CHECK(w == Approx(-1.5f));
  sgd.step(&w, &g, 1.f);  // v = 0.5 + 1 = 1.5; w -= 1 + 0.75
  CHECK(w == Approx(-3.25f));
}

TEST_CASE("SGD on a large buffer, split over the threads, equals one element at a time") {
  // Buffers from 2^18 elements are updated by all the OpenMP threads: every element must come
  // out as the scalar formulas give it, bit for bit, with a tail that no split divides evenly.
  const bool nesterov = GENERATE(false, true);
  INFO("nesterov " << nesterov);
  const int64_t n = (int64_t{1} << 18) + 37;
  const SgdOptions o{0.9f, 1e-4f, nesterov};
  std::vector<float> w(n), g(n);
  for (int64_t i = 0; i < n; ++i) {
    w[i] = std::sin(0.001f * static_cast<float>(i));
    g[i] = std::cos(0.003f * static_cast<float>(i));
  }
  std::vector<float> want_w = w, want_v(n);
  Sgd sgd(n, o);
  for (int step = 0; step < 3; ++step) {
    const float lr = 0.1f / static_cast<float>(step + 1);
    sgd.step(w.data(), g.data(), lr);
    for (int64_t i = 0; i < n; ++i) {  // the same arithmetic as Sgd::step, in order
      const float d = g[i] + o.weight_decay * want_w[i];
      if (step == 0) {
        want_v[i] = d;
        want_w[i] -= lr * (nesterov ? d + o.momentum * want_v[i] : want_v[i]);
      } else if (nesterov) {
        want_v[i] = o.momentum * want_v[i] + d;
        want_w[i] -= lr * (d + o.momentum * want_v[i]);
      } else {
        want_v[i] = o.momentum * want_v[i] + g[i] + o.weight_decay * want_w[i];
        want_w[i] -= lr * want_v[i];
      }
    }
    INFO("step " << step);
    REQUIRE(w == want_w);
    REQUIRE(sgd.velocity() == want_v);
  }
}

TEST_CASE("learning rate scales linearly with the global batch, warms up, then decays") {
  LrSchedule s({0.1, 256, 512, 10, 110, 0.0});
  CHECK(s.peak() == Approx(0.2));
  CHECK(s.at(0) == Approx(0.02));
  CHECK(s.at(9) == Approx(0.2));
  CHECK(s.at(60) == Approx(0.1));  // half-way through the cosine
  CHECK(s.at(109) < 0.001);
  for (int64_t t = 10; t < 109; ++t) CHECK(s.at(t + 1) <= s.at(t));
}
