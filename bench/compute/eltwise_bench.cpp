// gg_bench_eltwise: the residual add and the ReLU after it, as the oneDNN executor ran them
// before (oneDNN's sum primitive, then relu_keeping_nan in place) and as it runs them now
// (add_relu_keeping_nan, one pass), alternating on the same tensors, on ResNet-50's four residual
// shapes at batch 16 in the channel blocks oneDNN picks on this CPU (nChw16c with AVX-512,
// nChw8c without); and the gradient of a ReLU whose output two layers read (relu_backward_sum2,
// the readers' gradients summed where the ReLU passed, on an output half zeros at random); and
// the sum of four gradients (GoogLeNet's inception inputs have four readers), oneDNN's sum
// primitive against sum_of, on the same shapes.
// Prints one CSV row per shape: the fastest and median milliseconds of each.
// Usage: gg_bench_eltwise [--res R] [--repeats N]   (R: ResNet-50's input side, default 224)
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <vector>

#include "kernels/onednn/api.hpp"
#include "kernels/onednn/eltwise.hpp"
#include "kernels/onednn/isa.hpp"
#include "kernels/onednn/onednn_executor.hpp"

namespace {

using dnnl::memory;

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

int usage(const char* why) {
  std::fprintf(stderr,
               "gg_bench_eltwise: %s\nusage: gg_bench_eltwise [--res R] [--repeats N]  (R in "
               "[32, 1024], a multiple of 32; N in [1, 1000])\n",
               why);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  int res = 224, repeats = 30;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help") {
      std::printf("gg_bench_eltwise: oneDNN's sum + a ReLU pass against the fused add + ReLU\n");
      return 0;
    }
    if (i + 1 >= argc || (a != "--res" && a != "--repeats")) return usage("unknown option");
    char* end = nullptr;
    const long v = std::strtol(argv[++i], &end, 10);
    if (*end != '\0') return usage("a value is not a whole number");
    (a == "--res" ? res : repeats) = static_cast<int>(v);
  }
  if (res < 32 || res > 1024 || res % 32 != 0) return usage("--res is out of range");
  if (repeats < 1 || repeats > 1000) return usage("--repeats is out of range");
  const dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream s(eng);
  const bool avx512 = gg::kernels::onednn_weight_block() == 16;  // else 8-channel blocks
  std::printf(
      "shape,layout,vectors,threads,repeats,sum_relu_min_ms,sum_relu_median_ms,add_relu_min_ms,"
      "add_relu_median_ms,relu_grad2_min_ms,relu_grad2_median_ms,sum4_onednn_min_ms,"
      "sum4_onednn_median_ms,sum4_ours_min_ms,sum4_ours_median_ms\n");
  // ResNet-50's residual outputs: 256 x 56 x 56 at 224 px, then half the side and twice the
  // channels per stage.
  for (int stage = 0; stage < 4; ++stage) {
    const memory::dim c = 256 << stage, hw = res / 4 >> stage;
    const memory::desc md({16, c, hw, hw}, memory::data_type::f32,
                          avx512 ? memory::format_tag::nChw16c : memory::format_tag::nChw8c);
    memory a(md, eng), b(md, eng), y(md, eng), relu_out(md, eng), dx(md, eng), c3(md, eng),
        c4(md, eng);
    auto* pa = static_cast<float*>(a.get_data_handle());
    auto* pb = static_cast<float*>(b.get_data_handle());
    auto* pr = static_cast<float*>(relu_out.get_data_handle());
    uint32_t lcg = 1;  // the ReLU's output: zero or not at random, as a trained net's are
    for (size_t i = 0; i < md.get_size() / 4; ++i) {  // half of the sums negative
      pa[i] = static_cast<float>(i % 7) - 3.f;
      pb[i] = static_cast<float>(i % 5) - 2.f;
      lcg = lcg * 1664525u + 1013904223u;
      pr[i] = (lcg >> 31) != 0 ? static_cast<float>(lcg >> 8) * 0x1p-24f : 0.f;
    }
    std::memcpy(c3.get_data_handle(), pr, md.get_size());
    std::memcpy(c4.get_data_handle(), pa, md.get_size());
    namespace api = gg::kernels::onednn;
    const dnnl::sum sum(api::sum(eng, md, {1.f, 1.f}, {md, md}));
    const dnnl::sum sum4(api::sum(eng, md, {1.f, 1.f, 1.f, 1.f}, {md, md, md, md}));
    std::vector<double> before, after, grad2, sum4_onednn, sum4_ours;
    for (int r = 0; r < repeats; ++r) {
      auto t0 = std::chrono::steady_clock::now();
      sum.execute(s,
                  {{DNNL_ARG_MULTIPLE_SRC, a}, {DNNL_ARG_MULTIPLE_SRC + 1, b}, {DNNL_ARG_DST, y}});
      s.wait();
      gg::kernels::relu_keeping_nan(y, y, false);
      before.push_back(ms_since(t0));
      t0 = std::chrono::steady_clock::now();
      gg::kernels::add_relu_keeping_nan(a, b, y, false);
      after.push_back(ms_since(t0));
      t0 = std::chrono::steady_clock::now();
      gg::kernels::relu_backward_sum2(relu_out, a, b, dx);
      grad2.push_back(ms_since(t0));
      t0 = std::chrono::steady_clock::now();
      sum4.execute(s, {{DNNL_ARG_MULTIPLE_SRC, a},
                       {DNNL_ARG_MULTIPLE_SRC + 1, b},
                       {DNNL_ARG_MULTIPLE_SRC + 2, c3},
                       {DNNL_ARG_MULTIPLE_SRC + 3, c4},
                       {DNNL_ARG_DST, y}});
      s.wait();
      sum4_onednn.push_back(ms_since(t0));
      t0 = std::chrono::steady_clock::now();
      gg::kernels::sum_of({a, b, c3, c4}, dx);
      sum4_ours.push_back(ms_since(t0));
    }
    std::sort(before.begin(), before.end());
    std::sort(after.begin(), after.end());
    std::sort(grad2.begin(), grad2.end());
    std::sort(sum4_onednn.begin(), sum4_onednn.end());
    std::sort(sum4_ours.begin(), sum4_ours.end());
    std::printf("16x%ldx%ldx%ld,%s,%s,%d,%d,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f\n",
                static_cast<long>(c), static_cast<long>(hw), static_cast<long>(hw),
                avx512 ? "nChw16c" : "nChw8c", gg::kernels::simd_name(), omp_get_max_threads(),
                repeats, before.front(), before[before.size() / 2], after.front(),
                after[after.size() / 2], grad2.front(), grad2[grad2.size() / 2],
                sum4_onednn.front(), sum4_onednn[sum4_onednn.size() / 2], sum4_ours.front(),
                sum4_ours[sum4_ours.size() / 2]);
  }
  return 0;
}
