#include <catch2/catch.hpp>

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
