// gg_bench_pool: every max pool of a model (GoogLeNet by default), forward and backward at batch
// 16 over 8- or 16-channel blocks, by our loops (kernels/onednn/max_pool.hpp, which the oneDNN
// executor runs on 8-channel blocks) and by oneDNN's training pool with its workspace, alternating
// on the same tensors. Prints one CSV row per pool and a total: the fastest and median
// milliseconds of each. Our loops run the build that kernels/onednn/isa.hpp picks (the "vectors"
// column; ONEDNN_MAX_CPU_ISA caps it as it caps oneDNN).
// Usage: gg_bench_pool [--model M] [--res R] [--block 8|16] [--repeats N]
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <oneapi/dnnl/dnnl.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/models.hpp"
#include "kernels/onednn/api.hpp"
#include "kernels/onednn/isa.hpp"
#include "kernels/onednn/max_pool.hpp"

namespace {

using dnnl::memory;
using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

int usage(const char* why) {
  std::fprintf(stderr,
               "gg_bench_pool: %s\nusage: gg_bench_pool [--model M] [--res R] [--block 8|16] "
               "[--repeats N]  (M: googlenet or resnet50, default googlenet; R in [64, 1024], "
               "default 224; N in [1, 1000], default 20)\n",
               why);
  return 2;
}

struct Times {
  std::vector<double> ours_fwd, ours_bwd, dnnl_fwd, dnnl_bwd;
};

double min_of(std::vector<double> v) { return *std::min_element(v.begin(), v.end()); }
double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::string model = "googlenet";
  long res = 224, block = 8, repeats = 20;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help") {
      std::printf(
          "gg_bench_pool: a model's max pools, forward and backward, our blocked loops against "
          "oneDNN's training pool, alternating\nusage: gg_bench_pool [--model googlenet|resnet50] "
          "[--res R] [--block 8|16] [--repeats N]\n");
      return 0;
    }
    if (i + 1 >= argc) return usage("an option lacks its value");
    if (a == "--model") {
      model = argv[++i];
      if (model != "googlenet" && model != "resnet50") return usage("--model is not known");
      continue;
    }
    if (a != "--res" && a != "--block" && a != "--repeats") return usage("unknown option");
    char* end = nullptr;
    const long v = std::strtol(argv[++i], &end, 10);
    if (*end != '\0') return usage("a value is not a whole number");
    (a == "--res" ? res : a == "--block" ? block : repeats) = v;
  }
  if (res < 64 || res > 1024) return usage("--res is out of range");
  if (block != 8 && block != 16) return usage("--block must be 8 or 16");
  if (repeats < 1 || repeats > 1000) return usage("--repeats is out of range");

  gg::kernels::ModelSpec spec = gg::kernels::default_spec(model);
  spec.input = {3, res, res};
  const gg::kernels::Graph g = gg::kernels::build_model(spec);
  const int64_t batch = 16;
  const dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream strm(eng);
  const memory::format_tag tag =
      block == 16 ? memory::format_tag::nChw16c : memory::format_tag::nChw8c;
  std::printf(
      "pool,shape,k,stride,block,vectors,threads,repeats,ours_fwd_min_ms,ours_fwd_median_ms,"
      "ours_bwd_min_ms,ours_bwd_median_ms,onednn_fwd_min_ms,onednn_fwd_median_ms,"
      "onednn_bwd_min_ms,onednn_bwd_median_ms\n");
  Times total;
  total.ours_fwd.assign(repeats, 0.);
  total.ours_bwd = total.dnnl_fwd = total.dnnl_bwd = total.ours_fwd;
  for (const gg::kernels::Node& n : g.nodes()) {
    if (n.op != gg::kernels::Op::MaxPool) continue;
    const gg::kernels::Dims& in = g.node(n.inputs[0]).out;
    const gg::kernels::BlockedPool s =
        gg::kernels::blocked_pool(n, in, batch, static_cast<int>(block));
    const memory::desc x_md({batch, in[0], in[1], in[2]}, memory::data_type::f32, tag);
    const memory::desc y_md({batch, n.out[0], n.out[1], n.out[2]}, memory::data_type::f32, tag);
    memory x(x_md, eng), y(y_md, eng), dy(y_md, eng), dx(x_md, eng);
    std::vector<uint8_t> arg(y_md.get_size() / 4);
    auto* px = static_cast<float*>(x.get_data_handle());
    auto* pdy = static_cast<float*>(dy.get_data_handle());
    uint32_t lcg = 1;  // distinct values at random: the argmax moves from window to window
    for (size_t i = 0; i < x_md.get_size() / 4; ++i) {
      lcg = lcg * 1664525u + 1013904223u;
      px[i] = static_cast<float>(lcg >> 8) * 0x1p-24f - 0.5f;
    }
    for (size_t i = 0; i < y_md.get_size() / 4; ++i) pdy[i] = static_cast<float>(i % 13) * 0.1f;
    // oneDNN's pool, ceil mode as right padding, as the executor builds it.
    const memory::dim k = s.k, st = s.stride, p = s.pad;
    const memory::dims pad_r = {std::max<memory::dim>(p, (s.oh - 1) * st + k - s.h - p),
                                std::max<memory::dim>(p, (s.ow - 1) * st + k - s.w - p)};
    namespace api = gg::kernels::onednn;
    const auto max = dnnl::algorithm::pooling_max;
    const api::PoolFwd fpd = api::pool_fwd(eng, max, x_md, y_md, {st, st}, {k, k}, {p, p}, pad_r);
    const api::PoolBwd bpd =
        api::pool_bwd(eng, max, x_md, y_md, {st, st}, {k, k}, {p, p}, pad_r, fpd);
    memory ws(fpd.workspace_desc(), eng);
    const dnnl::pooling_forward fwd(fpd);
    const dnnl::pooling_backward bwd(bpd);
    Times t;
    for (long r = 0; r < repeats; ++r) {
      auto t0 = Clock::now();
      gg::kernels::blocked_max_pool_forward(px, static_cast<float*>(y.get_data_handle()),
                                            arg.data(), s);
      t.ours_fwd.push_back(ms_since(t0));
      t0 = Clock::now();
      gg::kernels::blocked_max_pool_backward(pdy, arg.data(),
                                             static_cast<float*>(dx.get_data_handle()), s);
      t.ours_bwd.push_back(ms_since(t0));
      t0 = Clock::now();
      fwd.execute(strm, {{DNNL_ARG_SRC, x}, {DNNL_ARG_DST, y}, {DNNL_ARG_WORKSPACE, ws}});
      strm.wait();
      t.dnnl_fwd.push_back(ms_since(t0));
      t0 = Clock::now();
      bwd.execute(strm,
                  {{DNNL_ARG_DIFF_DST, dy}, {DNNL_ARG_DIFF_SRC, dx}, {DNNL_ARG_WORKSPACE, ws}});
      strm.wait();
      t.dnnl_bwd.push_back(ms_since(t0));
      total.ours_fwd[r] += t.ours_fwd.back();
      total.ours_bwd[r] += t.ours_bwd.back();
      total.dnnl_fwd[r] += t.dnnl_fwd.back();
      total.dnnl_bwd[r] += t.dnnl_bwd.back();
    }
    std::printf("%s,%ldx%ldx%ldx%ld,%d,%d,%ld,%s,%d,%ld,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f\n",
                n.name.c_str(), static_cast<long>(batch), static_cast<long>(in[0]),
                static_cast<long>(in[1]), static_cast<long>(in[2]), s.k, s.stride, block,
                gg::kernels::simd_name(), omp_get_max_threads(), repeats, min_of(t.ours_fwd),
                median_of(t.ours_fwd), min_of(t.ours_bwd), median_of(t.ours_bwd),
                min_of(t.dnnl_fwd), median_of(t.dnnl_fwd), min_of(t.dnnl_bwd),
                median_of(t.dnnl_bwd));
  }
  std::printf("total,,,,%ld,%s,%d,%ld,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f\n", block,
              gg::kernels::simd_name(), omp_get_max_threads(), repeats, min_of(total.ours_fwd),
              median_of(total.ours_fwd), min_of(total.ours_bwd), median_of(total.ours_bwd),
              min_of(total.dnnl_fwd), median_of(total.dnnl_fwd), min_of(total.dnnl_bwd),
              median_of(total.dnnl_bwd));
  return 0;
}
