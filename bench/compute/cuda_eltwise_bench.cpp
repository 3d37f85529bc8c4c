// gg_bench_cuda_eltwise: the CUDA backend's batch norm passes at ResNet-50's shapes (batch 256 at
// 224 px unless told), each against a device-to-device copy of the bytes it moves, which is what
// a pass bound by memory can at best reach on this GPU:
//   fwd fused    statistics + y = relu(bn(x) + res)          reads x twice and res, writes y: 4
//   fwd apart    statistics + bn + add + relu, one by one     1 + 2 + 3 + 2 = 8 tensors
//   bwd fused    dz = dy gated by y, sums; dx from dz and x   4 + 3 = 7 tensors
//   bwd apart    relu grad + add grad (a copy) + bn backward  3 + 2 + (2 + 3) = 10 tensors
// "of copy" is the copy's time for the same bytes over the pass's time: the target is
// at least 0.75 for the fused passes. Medians of --repeats timed runs (CUDA events) after two
// untimed ones, fp32 and bf16. One CSV row per shape and pass on stdout.
// Usage: gg_bench_cuda_eltwise [--batch N] [--res R] [--repeats N]
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/cuda_executor.hpp"
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/device_buffers.hpp"

namespace {

using gg::kernels::cuda::DeviceArray;
using gg::kernels::cuda::DType;
namespace cuda = gg::kernels::cuda;

int usage(const char* why) {
  std::fprintf(stderr,
               "gg_bench_cuda_eltwise: %s\nusage: gg_bench_cuda_eltwise [--batch N] [--res R] "
               "[--repeats N]  (N in [2, 1024]; R in [32, 1024], a multiple of 32; repeats in "
               "[1, 1000])\n",
               why);
  return 2;
}

// Median milliseconds of `repeats` runs of f on stream s, after two untimed ones.
double median_ms(const std::function<void()>& f, int repeats, cudaStream_t s) {
  cudaEvent_t a, b;
  GG_CUDA_CHECK(cudaEventCreate(&a));
  GG_CUDA_CHECK(cudaEventCreate(&b));
  for (int i = 0; i < 2; ++i) f();
  std::vector<float> ms;
  for (int i = 0; i < repeats; ++i) {
    GG_CUDA_CHECK(cudaEventRecord(a, s));
    f();
    GG_CUDA_CHECK(cudaEventRecord(b, s));
    GG_CUDA_CHECK(cudaEventSynchronize(b));
    float t = 0;
    GG_CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

struct Shape {
  int64_t c, side;
};

}  // namespace

int main(int argc, char** argv) {
  int64_t batch = 256, res = 224, repeats = 20;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help") {
      std::printf(
          "gg_bench_cuda_eltwise: the CUDA batch norm passes, fused and one by one, against a\n"
          "device-to-device copy of the same bytes, at ResNet-50's shapes\n"
          "usage: gg_bench_cuda_eltwise [--batch N] [--res R] [--repeats N]\n");
      return 0;
    }
    if (i + 1 >= argc || (a != "--batch" && a != "--res" && a != "--repeats"))
      return usage(("unknown option " + a).c_str());
    char* end = nullptr;
    const long v = std::strtol(argv[++i], &end, 10);
    if (*end != '\0' || end == argv[i]) return usage((a + " is not a whole number").c_str());
    (a == "--batch" ? batch : a == "--res" ? res : repeats) = v;
  }
  if (batch < 2 || batch > 1024) return usage("--batch is out of range");
  if (res < 32 || res > 1024 || res % 32 != 0) return usage("--res is out of range");
  if (repeats < 1 || repeats > 1000) return usage("--repeats is out of range");
  // The stem's 64 channels at res / 2 are the largest tensor; the kernels index below 2^31.
  if (batch * 64 * (res / 2) * (res / 2) > 0x7fffffffLL)
    return usage(
        "--batch x 64 x (--res / 2)^2 is more than the 2^31 - 1 values the kernels "
        "index: lower --batch or --res");
  try {
    std::string why;
    if (gg::kernels::cuda_device_count(&why) == 0) {
      std::fprintf(stderr, "gg_bench_cuda_eltwise: no CUDA device (%s)\n", why.c_str());
      return 77;
    }
    std::fprintf(stderr, "gg_bench_cuda_eltwise: %s\n", gg::kernels::cuda_describe().c_str());
    cudaStream_t s;
    GG_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    // ResNet-50's batch norm outputs: the stem, then each stage's 1x1-reduce / 3x3 width and its
    // 4x expansion, where the residual adds are.
    const std::vector<Shape> shapes = {{64, res / 2},    {64, res / 4},   {256, res / 4},
                                       {128, res / 8},   {512, res / 8},  {256, res / 16},
                                       {1024, res / 16}, {512, res / 32}, {2048, res / 32}};
    std::printf("precision,channels,side,elements,pass,tensors,ms,copy_ms,of_copy,GBps\n");
    for (const DType t : {DType::F32, DType::BF16}) {
      const char* tn = t == DType::F32 ? "fp32" : "bf16";
      for (const Shape& sh : shapes) {
        cuda::BnShape b;
        b.batch = batch;
        b.c = sh.c;
        b.plane = sh.side * sh.side;
        const int64_t n = batch * sh.c * b.plane, bytes = n * cuda::dtype_size(t);
        std::vector<DeviceArray<unsigned char>> buf;
        for (int i = 0; i < 6; ++i) {
          buf.emplace_back(bytes);
          GG_CUDA_CHECK(cudaMemsetAsync(buf.back().get(), 0x3c, bytes, s));
        }
        void *x = buf[0].get(), *res_t = buf[1].get(), *y = buf[2].get(), *dy = buf[3].get(),
             *dx = buf[4].get(), *tmp = buf[5].get();
        DeviceArray<float> par(6 * sh.c + 2 * sh.c + cuda::bn_scratch_floats(b));
        GG_CUDA_CHECK(cudaMemsetAsync(par.get(), 0, par.size() * sizeof(float), s));
        float *mean = par.get(), *inv_std = mean + sh.c, *gamma = inv_std + sh.c,
              *beta = gamma + sh.c, *rm = beta + sh.c, *rv = rm + sh.c, *dg = rv + sh.c,
              *db = dg + sh.c, *scratch = db + sh.c;
        const auto stats = [&] {
          cuda::bn_statistics(mean, inv_std, rm, rv, x, b, true, scratch, t, s);
        };
        const std::vector<std::pair<std::string, std::pair<int, std::function<void()>>>> passes = {
            {"fwd fused",
             {4,
              [&] {
                stats();
                cuda::bn_apply(y, x, res_t, true, mean, inv_std, gamma, beta, b, t, s);
              }}},
            {"fwd apart",
             {8,
              [&] {
                stats();
                cuda::bn_apply(tmp, x, nullptr, false, mean, inv_std, gamma, beta, b, t, s);
                cuda::add_forward(tmp, tmp, res_t, n, t, s);
                cuda::relu_forward(y, tmp, n, t, s);
              }}},
            {"bwd fused",
             {7,
              [&] {
                cuda::BnGrad g;
                g.dy = dy;
                g.relu_y = y;
                g.dz = tmp;
                g.dx = dx;
                cuda::bn_backward(g, dg, db, x, mean, inv_std, gamma, b, scratch, t, s);
              }}},
            {"bwd apart",
             {10,
              [&] {
                cuda::relu_backward(tmp, dy, y, n, t, false, s);
                cuda::accumulate(res_t, tmp, n, t, false, s);
                cuda::BnGrad g;
                g.dy = tmp;
                g.dx = dx;
                cuda::bn_backward(g, dg, db, x, mean, inv_std, gamma, b, scratch, t, s);
              }}},
        };
        for (const auto& [name, pass] : passes) {
          const auto& [tensors, f] = pass;
          const double ms = median_ms(f, static_cast<int>(repeats), s);
          // A copy moves each byte twice (read, write): the same traffic is tensors / 2 copies.
          const int64_t copy_bytes = bytes * tensors / 2;
          DeviceArray<unsigned char> from(copy_bytes), to(copy_bytes);
          const double copy = median_ms(
              [&] {
                GG_CUDA_CHECK(
                    cudaMemcpyAsync(to.get(), from.get(), copy_bytes, cudaMemcpyDeviceToDevice, s));
              },
              static_cast<int>(repeats), s);
          std::printf("%s,%lld,%lld,%lld,%s,%d,%.4f,%.4f,%.3f,%.0f\n", tn,
                      static_cast<long long>(sh.c), static_cast<long long>(sh.side),
                      static_cast<long long>(n), name.c_str(), tensors, ms, copy, copy / ms,
                      static_cast<double>(bytes) * tensors / (ms * 1e6));
          std::fflush(stdout);
        }
      }
    }
    cudaStreamDestroy(s);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gg_bench_cuda_eltwise: %s\n", e.what());
    return 1;
  }
  return 0;
}
