// What the instruction set oneDNN runs on this CPU means for the oneDNN backend, decided in one
// place (kernels/onednn/isa.cpp) from dnnl::get_effective_cpu_isa(), which ONEDNN_MAX_CPU_ISA
// caps: the vectors of our own loops (element-wise passes, max pool), the block of the convolution
// weights, and whether bf16 runs (bf16_supported, kernels/executor.hpp). A capped run on an
// AVX-512 CPU is then an AVX2 machine for all three, not only for oneDNN's kernels.
#pragma once

namespace gg::kernels {

// The widest vectors of our own loops: AVX-512 (oneDNN's avx512_core and above: F, BW, DQ and
// VL), AVX2 (also Knights Landing's avx512_mic, which lacks BW, DQ and VL but has AVX2), or the
// baseline (SSE2).
enum class Simd { avx512, avx2, base };
Simd simd();
// "avx512", "avx2" or "baseline": the build of our own loops that runs here.
const char* simd_name();

// The block of the convolution weights oneDNN's fp32 kernels read on this CPU: 16 on AVX-512
// (OIhw16i16o), 8 on AVX2 (OIhw8i8o), 0 (plain) on others, Knights Landing included.
int onednn_weight_block();

// Body (an always-inline function) built for AVX-512, for AVX2 and as the baseline, the one that
// simd() names called: vectorised<loop>(args...).
template <auto Body, class... A>
[[gnu::target("avx512f,avx512bw,avx512dq,avx512vl")]] auto on_avx512(A... a) {
  return Body(a...);
}
template <auto Body, class... A>
[[gnu::target("avx2")]] auto on_avx2(A... a) {
  return Body(a...);
}
template <auto Body, class... A>
auto vectorised(A... a) {
  switch (simd()) {
    case Simd::avx512:
      return on_avx512<Body>(a...);
    case Simd::avx2:
      return on_avx2<Body>(a...);
    default:
      return Body(a...);
  }
}

}  // namespace gg::kernels
