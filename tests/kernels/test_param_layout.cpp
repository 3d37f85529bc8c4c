// Tests for parameters kept in the oneDNN kernels' blocked layout (kernels/param_layout.hpp): the
// permutation is oneDNN's own OIhw16i16o (AVX-512) or OIhw8i8o (AVX2), it round-trips, it is what
// oneDNN's kernels pick on this CPU, and a network trained with its weights kept blocked computes
// bit for bit what it computes with them plain.
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdlib>
#include <dnnl.hpp>
#include <stdexcept>
#include <vector>

#include "kernels/executor.hpp"
#include "kernels/loss.hpp"
#include "kernels/models.hpp"
#include "kernels/net.hpp"
#include "kernels/onednn/api.hpp"
#include "kernels/onednn/onednn_executor.hpp"
#include "kernels/optimizer.hpp"
#include "kernels/param_layout.hpp"
#include "tests/kernels/backend_conformance.hpp"

using namespace gg::kernels;
using namespace gg::test;

namespace {

Graph small_resnet() {
  // Stem 3 -> 16 (plain: 3 inputs), 16/32/64-channel stages (blocked), 1x1 shortcuts, fc.
  return build_model({.name = "resnet8", .input = {3, 16, 16}, .classes = 10, .width = 16});
}

std::vector<float> random_values(int64_t n, uint32_t seed) {
  Rng r(seed);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = r.uniform(-1.f, 1.f);
  return v;
}

using tag = dnnl::memory::format_tag;
using dt = dnnl::memory::data_type;

tag blocked_tag(int b) { return b == 16 ? tag::OIhw16i16o : tag::OIhw8i8o; }

}  // namespace

TEST_CASE(
    "param layout: blocked convolution weights are oneDNN's OIhw16i16o and OIhw8i8o and "
    "round-trip",
    "[layout]") {
  const int b = GENERATE(16, 8);
  INFO("block " << b);
  const Graph g = small_resnet();
  const ParamLayout l = blocked_conv_layout(g, b);
  REQUIRE_FALSE(l.plain());
  int blocked = 0;
  for (size_t p = 0; p < g.params().size(); ++p) {
    const TensorSpec& t = g.params()[p];
    const bool conv = g.node(t.node).op == Op::Conv && t.dims.size() == 4;
    const bool fits = conv && t.dims[0] % b == 0 && t.dims[1] % b == 0;
    INFO(t.name);
    CHECK(l.block_of(static_cast<int>(p)) == (fits ? b : 0));
    blocked += fits;
  }
  CHECK(blocked > 4);

  const std::vector<float> plain = random_values(g.param_count(), 5);
  std::vector<float> native(plain.size()), back(plain.size());
  to_layout(g, l, plain.data(), native.data());
  CHECK(native != plain);
  to_plain(g, l, native.data(), back.data());
  CHECK(back == plain);
  CHECK(plain_copy(g, l, native.data()) == plain);

  // Each blocked weight holds exactly what oneDNN's reorder into OIhw16i16o / OIhw8i8o writes.
  const dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream st(eng);
  for (size_t p = 0; p < g.params().size(); ++p) {
    if (l.block_of(static_cast<int>(p)) == 0) continue;
    const TensorSpec& t = g.params()[p];
    INFO(t.name);
    const dnnl::memory::dims d(t.dims.begin(), t.dims.end());
    std::vector<float> src(plain.begin() + t.offset, plain.begin() + t.offset + t.size());
    std::vector<float> dst(src.size());
    dnnl::memory from({d, dt::f32, tag::oihw}, eng, src.data());
    dnnl::memory to({d, dt::f32, blocked_tag(b)}, eng, dst.data());
    dnnl::reorder(from, to).execute(st, from, to);
    st.wait();
    CHECK(std::vector<float>(native.begin() + t.offset, native.begin() + t.offset + t.size()) ==
          dst);
  }

  // Ranks compare fingerprints: equal layouts agree; plain, 8- and 16-blocks do not.
  CHECK(l.fingerprint() == blocked_conv_layout(g, b).fingerprint());
  CHECK(l.fingerprint() != ParamLayout{}.fingerprint());
  CHECK(l.fingerprint() != blocked_conv_layout(g, b == 16 ? 8 : 16).fingerprint());
  CHECK(blocked_conv_layout(g, 0).plain());
}

TEST_CASE(
    "param layout: the block is what oneDNN's forward and backward-weights kernels pick on this "
    "CPU",
    "[layout][onednn]") {
  const int b = onednn_weight_block();
  INFO("block " << b << ", oneDNN's ISA " << static_cast<int>(dnnl::get_effective_cpu_isa()));
  if (std::getenv("ONEDNN_MAX_CPU_ISA") == nullptr) {  // else oneDNN's ISA may be capped
    if (__builtin_cpu_supports("avx512f"))
      CHECK(b == 16);
    else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
      CHECK(b == 8);
  }
  if (b == 0) {
    WARN("this CPU keeps every parameter plain (neither AVX-512 nor AVX2)");
    return;
  }
  // Direct convolutions as ResNet has them (Winograd's weights have a format of their own).
  struct Shape {
    int64_t in, out, kernel, stride, pad, size;
  };
  const Shape c = GENERATE(Shape{64, 64, 3, 1, 1, 14}, Shape{64, 128, 3, 2, 1, 28},
                           Shape{64, 256, 1, 1, 0, 14}, Shape{256, 128, 1, 2, 0, 28});
  INFO("in " << c.in << " out " << c.out << " kernel " << c.kernel << " stride " << c.stride);
  const dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  const int64_t batch = 16, out_size = (c.size + 2 * c.pad - c.kernel) / c.stride + 1;
  const dnnl::memory::desc src({batch, c.in, c.size, c.size}, dt::f32, tag::any),
      dst({batch, c.out, out_size, out_size}, dt::f32, tag::any),
      w({c.out, c.in, c.kernel, c.kernel}, dt::f32, tag::any),
      blocked({c.out, c.in, c.kernel, c.kernel}, dt::f32, blocked_tag(b));
  const dnnl::memory::dims strides{c.stride, c.stride}, pad{c.pad, c.pad};
  const auto alg = dnnl::algorithm::convolution_direct;
  namespace api = gg::kernels::onednn;
  const dnnl::memory::desc no_bias;
  const api::ConvFwd fwd = api::conv_fwd(eng, alg, src, w, no_bias, dst, strides, pad, pad);
  const api::ConvBwdW bwd_w =
      api::conv_bwd_weights(eng, alg, src, w, no_bias, dst, strides, pad, pad, fwd);
  INFO(fwd.impl_info_str() << " / " << bwd_w.impl_info_str());
  CHECK(fwd.weights_desc() == blocked);
  CHECK(bwd_w.diff_weights_desc() == blocked);
}

TEST_CASE("param layout: oneDNN trains bit for bit the same with its weights kept blocked",
          "[layout][onednn]") {
  const Precision precision = GENERATE(Precision::Fp32, Precision::Bf16);
  if (precision == Precision::Bf16 && !bf16_supported()) return;
  INFO(precision_name(precision));
  const Graph g = small_resnet();
  Net plain(g, Backend::OneDnn, 4096, precision), native(g, Backend::OneDnn, 4096, precision);
  init_params(g, plain.store(), 3);
  init_params(g, native.store(), 3);
  if (!native.use_native_layout()) {
    WARN("this CPU keeps every parameter plain (neither AVX-512 nor AVX2): nothing to compare");
    return;
  }
  CHECK(native.store().params != std::vector<float>(plain.store().params));
  CHECK(native.plain(native.store().params.data()) == std::vector<float>(plain.store().params));
  CHECK_THROWS_AS(native.param("layer1.0.conv1.weight"), std::logic_error);
  CHECK_NOTHROW(native.param("conv1.weight"));  // 3 input channels: stays plain

  const int64_t batch = 4, classes = 10;
  Sgd sgd_plain(g.param_count(), {}), sgd_native(g.param_count(), {});
  Rng r(9);
  for (int step = 0; step < 3; ++step) {
    INFO("step " << step);
    std::vector<float> x(static_cast<size_t>(batch * 3 * 16 * 16));
    for (float& v : x) v = r.uniform(-1.f, 1.f);
    std::vector<int32_t> labels(batch);
    for (int32_t& l : labels) l = static_cast<int32_t>(r.below(classes));
    const float* zp = plain.at_batch(batch).forward(x.data(), true);
    const float* zn = native.at_batch(batch).forward(x.data(), true);
    REQUIRE(std::vector<float>(zp, zp + batch * classes) ==
            std::vector<float>(zn, zn + batch * classes));
    std::vector<float> dz(static_cast<size_t>(batch * classes));
    softmax_cross_entropy(zp, labels.data(), batch, classes, dz.data());
    plain.at_batch(batch).backward(dz.data(), {});
    native.at_batch(batch).backward(dz.data(), {});
    REQUIRE(native.plain(native.store().grads.data()) == std::vector<float>(plain.store().grads));
    sgd_plain.step(plain.store().params.data(), plain.store().grads.data(), 0.05f);
    sgd_native.step(native.store().params.data(), native.store().grads.data(), 0.05f);
  }
  CHECK(native.plain(native.store().params.data()) == std::vector<float>(plain.store().params));
  CHECK(native.plain(sgd_native.velocity().data()) == sgd_plain.velocity());
  // An evaluation executor at another batch reads the blocked weights too.
  std::vector<float> x(static_cast<size_t>(2 * 3 * 16 * 16), 0.25f);
  const float* ep = plain.at_batch(2).forward(x.data(), false);
  const float* en = native.at_batch(2).forward(x.data(), false);
  CHECK(std::vector<float>(ep, ep + 2 * classes) == std::vector<float>(en, en + 2 * classes));

  // A rebuild takes plain parameters and keeps the layout.
  native.rebuild(g, std::vector<float>(plain.store().params), plain.store().buffers);
  CHECK_FALSE(native.layout().plain());
  CHECK(native.plain(native.store().params.data()) == std::vector<float>(plain.store().params));
}

TEST_CASE("param layout: the reference backend refuses blocked parameters", "[layout]") {
  const Graph g = small_resnet();
  ParamStore s(g);
  s.layout = blocked_conv_layout(g, GENERATE(16, 8));
  CHECK_THROWS_AS(compile(g, Backend::Reference, 2, s, make_buckets(g, 4096)),
                  std::invalid_argument);
}
