#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
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
