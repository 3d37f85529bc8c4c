#include "kernels/onednn/isa.hpp"

#include <oneapi/dnnl/dnnl.hpp>

#include "kernels/executor.hpp"
#include "kernels/onednn/api.hpp"

namespace gg::kernels {
namespace {

struct Isa {
  Simd simd = Simd::base;
  int weight_block = 0;
  bool bf16 = false;
};

// The one switch over oneDNN's instruction sets. oneDNN fixes its ISA at its first use, so the
// answer is read once.
const Isa& isa() {
  static const Isa here = [] {
    using dnnl::cpu_isa;
    switch (dnnl::get_effective_cpu_isa()) {
      case cpu_isa::avx512_core:
      case cpu_isa::avx512_core_vnni:
        return Isa{Simd::avx512, 16, false};
      case cpu_isa::avx512_core_bf16:
      case cpu_isa::avx512_core_amx:
#if GG_ONEDNN3
      case cpu_isa::avx512_core_fp16:  // also avx10_1_512
      case cpu_isa::avx512_core_amx_fp16:
#endif
        return Isa{Simd::avx512, 16, true};
      // oneDNN 2.6's jit:avx2 and jit_1x1:avx2 read OIhw8i8o forward and write it backward-weights
      // (backward-data reads OIhw8o8i, a reorder either way). Below AVX2 backward-weights is a
      // plain GEMM: blocks would only move the reorder from the forward to the backward.
      case cpu_isa::avx2:
      case cpu_isa::avx2_vnni:
#if GG_ONEDNN3
      case cpu_isa::avx2_vnni_2:
#endif
        return Isa{Simd::avx2, 8, false};
#if !GG_ONEDNN3  // oneDNN 3.0 dropped Knights Landing
      // Knights Landing: oneDNN's avx512_mic kernels read plain weights; our loops take AVX2.
      case cpu_isa::avx512_mic:
      case cpu_isa::avx512_mic_4ops:
        return Isa{Simd::avx2, 0, false};
#endif
      default:
        return Isa{};
    }
  }();
  return here;
}

}  // namespace

Simd simd() { return isa().simd; }

const char* simd_name() {
  switch (simd()) {
    case Simd::avx512:
      return "avx512";
    case Simd::avx2:
      return "avx2";
    default:
      return "baseline";
  }
}

int onednn_weight_block() { return isa().weight_block; }

bool bf16_supported() { return isa().bf16; }

}  // namespace gg::kernels
