// Tests for the oneDNN executor's own element-wise passes (kernels/onednn/eltwise.hpp): the
// residual add fused with its ReLU must give, bit for bit, what oneDNN's sum primitive and then a
// NaN-keeping ReLU give, in f32 and in bf16, NaN, infinities, signed zeros and rounding ties
// included, on a tensor whose size is no multiple of the threads' cache-line chunks.
#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <unordered_map>
#include <vector>

#include "kernels/onednn/api.hpp"
#include "kernels/onednn/eltwise.hpp"
#include "kernels/onednn/isa.hpp"
#include "tests/kernels/backend_conformance.hpp"

using namespace gg::kernels;
using dnnl::memory;
using dt = memory::data_type;
using tag = memory::format_tag;

namespace {

const memory::dims kDims{3, 5, 7, 11};  // 1155 values

uint16_t bf16_bits(float f) { return static_cast<uint16_t>(std::bit_cast<uint32_t>(f) >> 16); }

// Operands whose sums cover every case: random values of both signs, exact cancellations to
// +0 and -0, NaN, +-inf and inf - inf, and for bf16 sums that fall exactly halfway between two
// bf16 values (1 + 2^-8 is such a tie: rounded to nearest even it gives 1, truncation also 1,
// but 1 + 3 * 2^-8 rounds up to 1 + 2^-6 where truncation gives 1 + 2^-7).
void fill(std::vector<float>& a, std::vector<float>& b) {
  gg::test::Rng r(11);
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = r.uniform(-4.f, 4.f);
    b[i] = r.uniform(-4.f, 4.f);
  }
  const float inf = std::numeric_limits<float>::infinity(), nan = std::nanf("");
  const float cases[][2] = {{1.f, -1.f},    {-0.f, -0.f},   {0.f, -0.f},      {nan, 1.f},
                            {-2.f, nan},    {inf, 1.f},     {-inf, 1.f},      {inf, -inf},
                            {1.f, 0x1p-8f}, {1.f, 0x3p-8f}, {-1.f, -0x3p-8f}, {0x1p-7f, 0x1p-8f}};
  for (size_t i = 0; i < std::size(cases); ++i) {
    a[40 * i + 3] = cases[i][0];
    b[40 * i + 3] = cases[i][1];
  }
}

memory tensor(dt type, const dnnl::engine& eng) { return memory({kDims, type, tag::nchw}, eng); }

// The bf16 value nearest to a finite f32, ties to even: the rounding of oneDNN's bf16 sum.
float nearest_bf16(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  const float lo = std::bit_cast<float>(u & 0xffff0000u);
  const float hi = std::bit_cast<float>((u & 0xffff0000u) + 0x10000u);
  const float dlo = std::fabs(x - lo), dhi = std::fabs(hi - x);
  return (u & 0xffffu) == 0 ? x
         : dlo < dhi        ? lo
         : dhi < dlo        ? hi
                            : (((u >> 16) & 1u) == 0 ? lo : hi);
}

// f32 values into a tensor of `type` (bf16: truncated), and the values it holds back into them.
void load(memory& m, std::vector<float>& v, bool bf16) {
  if (!bf16) {
    std::memcpy(m.get_data_handle(), v.data(), v.size() * 4);
    return;
  }
  auto* p = static_cast<uint16_t*>(m.get_data_handle());
  for (size_t i = 0; i < v.size(); ++i) {
    p[i] = bf16_bits(v[i]);
    v[i] = std::bit_cast<float>(uint32_t{p[i]} << 16);
  }
}

// Element i of a tensor of f32 or bf16 values, as f32.
float at(const memory& m, size_t i, bool bf16) {
  if (!bf16) return static_cast<const float*>(m.get_data_handle())[i];
  return std::bit_cast<float>(uint32_t{static_cast<const uint16_t*>(m.get_data_handle())[i]} << 16);
}

// oneDNN's sum of a and b into a fresh tensor, then the NaN-keeping ReLU in place.
memory sum_then_relu(const memory& a, const memory& b, dt type, const dnnl::engine& eng,
                     dnnl::stream& s) {
  const memory::desc md = a.get_desc();
  const auto pd = gg::kernels::onednn::sum(eng, md, {1.f, 1.f}, {md, md});
  memory y = tensor(type, eng);
  dnnl::sum(pd).execute(
      s, {{DNNL_ARG_MULTIPLE_SRC, a}, {DNNL_ARG_MULTIPLE_SRC + 1, b}, {DNNL_ARG_DST, y}});
  s.wait();
  relu_keeping_nan(y, y, false);
  return y;
}

}  // namespace

TEST_CASE("add_relu_keeping_nan gives oneDNN's sum and then the ReLU, bit for bit", "[onednn]") {
  const dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream s(eng);
  const size_t n = 3 * 5 * 7 * 11;
  std::vector<float> fa(n), fb(n);
  fill(fa, fb);
  const bool bf16 = GENERATE(false, true);
  INFO((bf16 ? "bf16" : "f32"));
  const dt type = bf16 ? dt::bf16 : dt::f32;
  memory a = tensor(type, eng), b = tensor(type, eng), y = tensor(type, eng);
  load(a, fa, bf16);
  load(b, fb, bf16);
  CHECK(add_relu_keeping_nan(a, b, y, true));  // the operands hold NaN
  CHECK_FALSE(add_relu_keeping_nan(a, b, y, false));
  const size_t bytes = n * (bf16 ? 2 : 4);
  std::vector<unsigned char> fused(bytes);
  std::memcpy(fused.data(), y.get_data_handle(), bytes);

  // The rule itself, independent of oneDNN: relu(round(a + b)), NaN kept, -0 and negatives to +0.
  for (size_t i = 0; i < n; ++i) {
    INFO("value " << i << ": " << fa[i] << " + " << fb[i]);
    const float sum = fa[i] + fb[i];
    if (bf16) {
      uint16_t got;
      std::memcpy(&got, fused.data() + 2 * i, 2);
      const float v = std::bit_cast<float>(uint32_t{got} << 16);
      if (std::isnan(sum)) {
        CHECK(std::isnan(v));
        continue;
      }
      const float nearest = nearest_bf16(sum);
      const float want = nearest > 0.f ? nearest : 0.f;
      CHECK(std::bit_cast<uint32_t>(v) == std::bit_cast<uint32_t>(want));
    } else {
      float got;
      std::memcpy(&got, fused.data() + 4 * i, 4);
      if (std::isnan(sum))
        CHECK(std::isnan(got));
      else
        CHECK(std::bit_cast<uint32_t>(got) == std::bit_cast<uint32_t>(sum > 0.f ? sum : 0.f));
    }
  }

  // And oneDNN's two passes, where this CPU has a sum for the type.
  try {
    const memory ref = sum_then_relu(a, b, type, eng, s);
    CHECK(std::memcmp(ref.get_data_handle(), fused.data(), bytes) == 0);
  } catch (const dnnl::error& e) {
    REQUIRE(bf16);  // f32 sums exist on every CPU
    WARN("oneDNN has no bf16 sum on this CPU (" << e.what() << "): checked against the rule only");
  }
}

TEST_CASE(
    "relu_backward_sum2 gives oneDNN's sum and then its ReLU backward from the output, bit for "
    "bit",
    "[onednn]") {
  const dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream s(eng);
  const size_t n = 3 * 5 * 7 * 11;
  std::vector<float> fa(n), fb(n), fy(n);
  fill(fa, fb);
  // The ReLU's output: zeros (a third), positive values, and what only a NaN-keeping forward or
  // a corrupt tensor holds: -0, NaN, +inf, negatives, a subnormal.
  gg::test::Rng r(12);
  for (size_t i = 0; i < n; ++i) fy[i] = r.below(3) == 0 ? 0.f : r.uniform(0.f, 4.f);
  const float specials[] = {-0.f, std::nanf(""), std::numeric_limits<float>::infinity(), -1.f,
                            0x1p-130f};
  for (size_t i = 0; i < std::size(specials); ++i) fy[40 * i + 17] = specials[i];
  const bool bf16 = GENERATE(false, true);
  INFO((bf16 ? "bf16" : "f32"));
  const dt type = bf16 ? dt::bf16 : dt::f32;
  memory a = tensor(type, eng), b = tensor(type, eng), y = tensor(type, eng);
  memory dx = tensor(type, eng);
  load(a, fa, bf16);
  load(b, fb, bf16);
  load(y, fy, bf16);
  relu_backward_sum2(y, a, b, dx);

  // The rule: dx = y <= 0 ? +0 : a + b (rounded once); a NaN in y passes the gradient.
  for (size_t i = 0; i < n; ++i) {
    INFO("value " << i << ": y " << fy[i] << ", " << fa[i] << " + " << fb[i]);
    const float sum = fa[i] + fb[i], got = at(dx, i, bf16);
    if (fy[i] <= 0.f)
      CHECK(std::bit_cast<uint32_t>(got) == 0u);
    else if (std::isnan(sum))
      CHECK(std::isnan(got));
    else
      CHECK(std::bit_cast<uint32_t>(got) ==
            std::bit_cast<uint32_t>(bf16 ? nearest_bf16(sum) : sum));
  }

  // And oneDNN's sum, then its ReLU backward from the output (as the executor ran them before).
  try {
    const memory::desc md = a.get_desc();
    namespace api = gg::kernels::onednn;
    const auto spd = api::sum(eng, md, {1.f, 1.f}, {md, md});
    memory sum = tensor(type, eng), ref = tensor(type, eng);
    dnnl::sum(spd).execute(
        s, {{DNNL_ARG_MULTIPLE_SRC, a}, {DNNL_ARG_MULTIPLE_SRC + 1, b}, {DNNL_ARG_DST, sum}});
    const auto alg = dnnl::algorithm::eltwise_relu_use_dst_for_bwd;
    const api::EltFwd fpd = api::eltwise_fwd(eng, alg, md, 0.f);
    const api::EltBwd bpd = api::eltwise_bwd(eng, alg, md, md, 0.f, fpd);
    dnnl::eltwise_backward(bpd).execute(
        s, {{DNNL_ARG_DST, y}, {DNNL_ARG_DIFF_DST, sum}, {DNNL_ARG_DIFF_SRC, ref}});
    s.wait();
    // Where the ReLU passes the gradient (y > 0 or NaN), the same bits. Where it does not, ours
    // is +0, as PyTorch's threshold_backward gives; oneDNN's is 0 times the gradient (-0 for a
    // negative one), the same value.
    for (size_t i = 0; i < n; ++i) {
      INFO("value " << i << ": y " << fy[i] << ", " << fa[i] << " + " << fb[i]);
      const float want = at(ref, i, bf16), got = at(dx, i, bf16);
      if (!(fy[i] <= 0.f))
        CHECK((std::isnan(want) ? std::isnan(got)
                                : std::bit_cast<uint32_t>(got) == std::bit_cast<uint32_t>(want)));
      else if (!std::isnan(want))
        CHECK(want == 0.f);
    }
  } catch (const dnnl::error& e) {
    REQUIRE(bf16);  // f32 sums and ReLU backward exist on every CPU
    WARN("oneDNN has no bf16 sum or ReLU backward on this CPU ("
         << e.what() << "): checked against the rule only");
  }
}

TEST_CASE("sum_of gives oneDNN's f32 sum primitive, bit for bit, for two to four sources",
          "[onednn]") {
  const dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream s(eng);
  // More values than one chunk of sum_of's (2048), and no multiple of it or of the threads' lines.
  const memory::dims dims{3, 37, 17, 13};
  const size_t n = 3 * 37 * 17 * 13;
  std::vector<std::vector<float>> f(4, std::vector<float>(n));
  fill(f[0], f[1]);
  fill(f[2], f[3]);
  gg::test::Rng r(13);
  for (size_t i = 0; i < n; ++i) f[2][i] = r.uniform(-4.f, 4.f);  // not fill's copy of f[0]
  for (size_t i = 0; i < 4; ++i) f[i][7] = -0.f;                  // all -0: -0
  const int k = GENERATE(2, 3, 4);
  INFO(k << " sources");
  const memory::desc md(dims, dt::f32, tag::nchw);
  std::vector<memory> srcs;
  for (int j = 0; j < k; ++j) {
    srcs.emplace_back(md, eng);
    load(srcs.back(), f[j], false);
  }
  memory got(md, eng);
  sum_of(srcs, got);

  // The rule: the sources summed left to right in f32.
  for (size_t i = 0; i < n; ++i) {
    float sum = f[0][i] + f[1][i];
    for (int j = 2; j < k; ++j) sum += f[j][i];
    INFO("value " << i << ": " << f[0][i] << " + " << f[1][i] << " ... = " << sum);
    const float v = at(got, i, false);
    if (std::isnan(sum))
      CHECK(std::isnan(v));
    else
      CHECK(std::bit_cast<uint32_t>(v) == std::bit_cast<uint32_t>(sum));
  }

  // And oneDNN's sum primitive, which the executor ran before.
  const auto pd = gg::kernels::onednn::sum(eng, md, std::vector<float>(k, 1.f),
                                           std::vector<memory::desc>(k, md));
  memory ref(md, eng);
  std::unordered_map<int, memory> args{{DNNL_ARG_DST, ref}};
  for (int j = 0; j < k; ++j) args[DNNL_ARG_MULTIPLE_SRC + j] = srcs[j];
  dnnl::sum(pd).execute(s, args);
  s.wait();
  CHECK(std::memcmp(ref.get_data_handle(), got.get_data_handle(), md.get_size()) == 0);
}

TEST_CASE("our loops, the weight block and bf16 follow the ISA oneDNN runs, capped too",
          "[onednn]") {
  using dnnl::cpu_isa;
  const cpu_isa isa = dnnl::get_effective_cpu_isa();
#if GG_ONEDNN3
  const bool fp16 = isa == cpu_isa::avx512_core_fp16 || isa == cpu_isa::avx512_core_amx_fp16;
  const bool knl = false;  // oneDNN 3.0 dropped Knights Landing
  const bool avx2 =
      isa == cpu_isa::avx2 || isa == cpu_isa::avx2_vnni || isa == cpu_isa::avx2_vnni_2;
#else
  const bool fp16 = false;
  const bool knl = isa == cpu_isa::avx512_mic || isa == cpu_isa::avx512_mic_4ops;
  const bool avx2 = isa == cpu_isa::avx2 || isa == cpu_isa::avx2_vnni;
#endif
  const bool bf16 = isa == cpu_isa::avx512_core_bf16 || isa == cpu_isa::avx512_core_amx || fp16;
  const bool avx512 = isa == cpu_isa::avx512_core || isa == cpu_isa::avx512_core_vnni || bf16;
  INFO("oneDNN's ISA " << static_cast<int>(isa));
  CHECK(std::string(simd_name()) == (avx512 ? "avx512" : avx2 || knl ? "avx2" : "baseline"));
  CHECK(onednn_weight_block() == (avx512 ? 16 : avx2 ? 8 : 0));
  CHECK(bf16_supported() == bf16);
  // The ctests that run these tests capped (tests/CMakeLists.txt) name the cap: an AVX-512 CPU
  // capped to AVX2 must build nothing wider than AVX2, nor block or run bf16 as AVX-512 does.
  const char* cap = std::getenv("ONEDNN_MAX_CPU_ISA");
  if (cap != nullptr && std::string(cap) == "AVX2") {
    CHECK(std::string(simd_name()) != "avx512");
    CHECK(onednn_weight_block() != 16);
    CHECK_FALSE(bf16_supported());
  }
  if (cap != nullptr && std::string(cap) == "SSE41") {
    CHECK(std::string(simd_name()) == "baseline");
    CHECK(onednn_weight_block() == 0);
    CHECK_FALSE(bf16_supported());
  }
}
