// Model weights <-> npz with torchvision's state_dict names.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/models.hpp"
#include "kernels/weights.hpp"

using namespace gg::kernels;
namespace fs = std::filesystem;

namespace {

fs::path scratch(const std::string& test) {
  const fs::path p =
      fs::temp_directory_path() / ("gg_weights_" + std::to_string(::getpid()) + "_" + test);
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

// Every element different, buffers included, so a swapped or shifted slice shows.
void fill_distinct(ParamStore& s, uint64_t seed) {
  std::mt19937 r(static_cast<uint32_t>(seed));
  for (float& v : s.params) v = static_cast<float>(r()) / 4096.f - 1e5f;
  for (float& v : s.buffers) v = static_cast<float>(r()) / 8192.f;
}

std::string invalid_argument_of(const Graph& g, ParamStore& s, const NpzEntries& e) {
  try {
    import_weights(g, s, e, "W.npz");
  } catch (const std::invalid_argument& x) {
    return x.what();
  }
  return "";
}

}  // namespace

TEST_CASE("export then import gives bit-identical weights and running statistics") {
  const fs::path dir = scratch("roundtrip");
  for (const bool bn : {true, false}) {
    for (const char* model : {"resnet8", "cnn"}) {
      INFO(model << " batch_norm " << bn);
      ModelSpec spec;
      spec.name = model;
      spec.width = 4;
      spec.batch_norm = bn;
      const Graph g = build_model(spec);
      ParamStore a(g), b(g);
      fill_distinct(a, 1);
      fill_distinct(b, 2);
      save_weights((dir / "w.npz").string(), g, a.params, a.buffers, 123);
      load_weights((dir / "w.npz").string(), g, b);
      CHECK(std::memcmp(a.params.data(), b.params.data(), a.params.size() * 4) == 0);
      CHECK(std::memcmp(a.buffers.data(), b.buffers.data(), a.buffers.size() * 4) == 0);
    }
  }
  fs::remove_all(dir);
}

TEST_CASE("exported names are torchvision's: parameters, running stats, num_batches_tracked") {
  ModelSpec spec;
  spec.width = 4;
  const Graph g = build_model(spec);
  ParamStore s(g);
  const NpzEntries e = export_weights(g, s, 42);
  // One entry per parameter and buffer plus one num_batches_tracked per batch norm.
  int64_t bns = 0;
  for (const Node& n : g.nodes()) bns += n.op == Op::BatchNorm;
  CHECK(bns == 9);  // stem, two per block, two downsample paths
  CHECK(e.size() == g.params().size() + g.buffers().size() + bns);
  CHECK(e.front().first == "conv1.weight");
  CHECK(e.front().second.shape == Dims{4, 1, 3, 3});
  for (const char* name : {"bn1.weight", "bn1.bias", "bn1.running_mean", "bn1.running_var",
                           "layer2.0.downsample.0.weight", "layer2.0.downsample.1.running_var",
                           "layer3.0.bn2.weight", "fc.weight", "fc.bias"})
    CHECK(find_array(e, name) != nullptr);
  const NpyArray* tracked = find_array(e, "layer1.0.bn1.num_batches_tracked");
  REQUIRE(tracked != nullptr);
  CHECK(tracked->type == NpyType::Int64);
  CHECK(tracked->shape.empty());
  CHECK(tracked->i == std::vector<int64_t>{42});
  CHECK(find_array(e, "fc.weight")->shape == Dims{10, 16});
}

TEST_CASE("import names the first missing, mis-shaped, mistyped or unknown tensor") {
  ModelSpec spec;
  spec.width = 4;
  const Graph g = build_model(spec);
  ParamStore s(g);
  fill_distinct(s, 3);
  const NpzEntries good = export_weights(g, s, 0);
  ParamStore target(g);
  const std::vector<float> params_before = target.params, buffers_before = target.buffers;

  NpzEntries missing;
  for (const auto& [n, a] : good)
    if (n != "layer1.0.bn2.running_var" && n != "fc.bias") missing.emplace_back(n, a);
  std::string e = invalid_argument_of(g, target, missing);
  CHECK(e ==
        "W.npz: 'layer1.0.bn2.running_var' is missing (and 1 more names the model "
        "expects); is it the right model and width?");

  NpzEntries shaped = good;
  for (auto& [n, a] : shaped)
    if (n == "fc.weight") a = NpyArray::floats({16, 10}, a.f);
  CHECK(invalid_argument_of(g, target, shaped) ==
        "W.npz: 'fc.weight' has shape [16,10], the model expects [10,16]");

  NpzEntries typed = good;
  for (auto& [n, a] : typed)
    if (n == "bn1.weight") a = NpyArray::int64s({4}, {1, 1, 1, 1});
  CHECK(invalid_argument_of(g, target, typed) ==
        "W.npz: 'bn1.weight' has dtype int64, the model expects float32");

  NpzEntries unknown = good;
  unknown.emplace_back("layer9.conv.weight", NpyArray::floats({1}, {0.f}));
  CHECK(invalid_argument_of(g, target, unknown) ==
        "W.npz: 'layer9.conv.weight' is not a tensor of this model");

  // A failed import leaves the store untouched.
  CHECK(target.params == params_before);
  CHECK(target.buffers == buffers_before);

  // Extra num_batches_tracked entries (even for batch norms this model lacks) and float64
  // arrays (converted on reading) are accepted.
  NpzEntries extra = good;
  extra.emplace_back("layer7.bn3.num_batches_tracked", NpyArray::int64s({}, {5}));
  for (auto& [n, a] : extra)
    if (n == "fc.bias") a.type = NpyType::Float64;
  CHECK(invalid_argument_of(g, target, extra).empty());
  CHECK(target.params == s.params);
}

TEST_CASE(
    "save_weights refuses weights or running statistics that hold NaN or inf, writing nothing") {
  const fs::path dir = scratch("nan");
  const Graph g = build_model({.name = "resnet8", .width = 4});
  struct Case {
    const char* tensor;
    float value;
  };
  for (const Case c : {Case{"conv1.weight", std::numeric_limits<float>::quiet_NaN()},
                       Case{"fc.bias", -std::numeric_limits<float>::infinity()},
                       Case{"layer2.0.bn1.running_var", std::numeric_limits<float>::quiet_NaN()}}) {
    INFO(c.tensor);
    ParamStore s(g);
    fill_distinct(s, 3);
    bool found = false;
    for (const TensorSpec& t : g.params())
      if (t.name == c.tensor) s.params[t.offset + t.size() - 1] = c.value, found = true;
    for (const TensorSpec& t : g.buffers())
      if (t.name == c.tensor) s.buffers[t.offset] = c.value, found = true;
    REQUIRE(found);
    const std::string path = (dir / "w.npz").string();
    CHECK_THROWS_WITH(
        save_weights(path, g, s.params, s.buffers, 1),
        path + ": not written: " + c.tensor + " holds NaN or inf (the model diverged)");
    CHECK_FALSE(fs::exists(path));
  }
  fs::remove_all(dir);
}
