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
#include <vector>

#include "kernels/onednn/eltwise.hpp"
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

// oneDNN's sum of a and b into a fresh tensor, then the NaN-keeping ReLU in place.
memory sum_then_relu(const memory& a, const memory& b, dt type, const dnnl::engine& eng,
                     dnnl::stream& s) {
  const memory::desc md = a.get_desc();
  const dnnl::sum::primitive_desc pd(md, {1.f, 1.f}, {md, md}, eng);
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
  if (bf16) {
    auto* pa = static_cast<uint16_t*>(a.get_data_handle());
    auto* pb = static_cast<uint16_t*>(b.get_data_handle());
    for (size_t i = 0; i < n; ++i) {  // bf16 operands (truncated), and their values in f32
      pa[i] = bf16_bits(fa[i]);
      pb[i] = bf16_bits(fb[i]);
      fa[i] = std::bit_cast<float>(uint32_t{pa[i]} << 16);
      fb[i] = std::bit_cast<float>(uint32_t{pb[i]} << 16);
    }
  } else {
    std::memcpy(a.get_data_handle(), fa.data(), n * 4);
    std::memcpy(b.get_data_handle(), fb.data(), n * 4);
  }
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
      // Nearest bf16 to the f32 sum, ties to even: the neighbours below and above it.
      const uint32_t u = std::bit_cast<uint32_t>(sum);
      const float lo = std::bit_cast<float>(u & 0xffff0000u);
      const float hi = std::bit_cast<float>((u & 0xffff0000u) + 0x10000u);
      const float dlo = std::fabs(sum - lo), dhi = std::fabs(hi - sum);
      const float nearest = (u & 0xffffu) == 0 ? sum
                            : dlo < dhi        ? lo
                            : dhi < dlo        ? hi
                                               : (((u >> 16) & 1u) == 0 ? lo : hi);
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

TEST_CASE("the element-wise passes run the vectors oneDNN runs, under ONEDNN_MAX_CPU_ISA too",
          "[onednn]") {
  using dnnl::cpu_isa;
  const cpu_isa isa = dnnl::get_effective_cpu_isa();
  const bool avx512 = isa == cpu_isa::avx512_core || isa == cpu_isa::avx512_core_vnni ||
                      isa == cpu_isa::avx512_core_bf16 || isa == cpu_isa::avx512_core_amx;
  const bool avx2 = isa == cpu_isa::avx2 || isa == cpu_isa::avx2_vnni ||
                    isa == cpu_isa::avx512_mic || isa == cpu_isa::avx512_mic_4ops;  // KNL: AVX2
  INFO("oneDNN's ISA " << static_cast<int>(isa));
  CHECK(std::string(eltwise_vectors()) == (avx512 ? "avx512" : avx2 ? "avx2" : "baseline"));
  // The ctests that run these tests capped (tests/CMakeLists.txt) name the cap: an AVX-512 CPU
  // capped to AVX2 must build nothing wider than AVX2.
  const char* cap = std::getenv("ONEDNN_MAX_CPU_ISA");
  if (cap != nullptr && std::string(cap) == "AVX2")
    CHECK(std::string(eltwise_vectors()) != "avx512");
  if (cap != nullptr && std::string(cap) == "SSE41")
    CHECK(std::string(eltwise_vectors()) == "baseline");
}
