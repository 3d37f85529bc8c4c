// bench/compute, the ceiling: the best training-convolution and matmul throughput oneDNN reaches
// on this CPU with the given threads and precision, for run.sh to state each model's achieved
// share of it. Convolutions are timed forward, backward-data and backward-weights (the three a
// training step runs), direct algorithm only, over ResNet-50's 3x3 and 1x1 shapes at batch 16;
// FLOPs are the direct count, 2 x N x K x C x R x S x P x Q per pass. Matmul: M = N = K = 2048.
// Each case: the median of timed runs after warm-up, repeated for at least --seconds.
// Also the arithmetic bound no kernel can pass: the instruction peak, every thread issuing
// independent FMAs (fp32: 512-bit on AVX-512, 256-bit on AVX2) or bf16 dot products (vdpbf16ps:
// 2 multiply-adds per fp32 lane) on registers only, no memory traffic.
// Prints CSV rows: op,shape,precision,threads,gflops; row "instruction_peak" is the bound, the
// last row (op "ceiling") the best training-convolution figure, the one run.sh divides by.
// With --model: the floor of that model's training step on oneDNN's kernels instead (see
// model_floor), one CSV row per layer shape and a last row "floor" in milliseconds per step.
// With --model and --algorithms: each 3x3 stride-1 shape of the model (where oneDNN's fp32
// Winograd applies) timed by direct and by Winograd, pass by pass (model_algorithms), the evidence
// for the executor's choice between them (kernels/onednn/onednn_executor.cpp, winograd_pays).
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "dnnl.hpp"
#include "kernels/graph.hpp"
#include "kernels/models.hpp"
#include "kernels/onednn/api.hpp"
#include "kernels/onednn/onednn_executor.hpp"
#include "kernels/optimizer.hpp"

namespace {

using dnnl::memory;
using dt = memory::data_type;
using tag = memory::format_tag;
using Clock = std::chrono::steady_clock;

struct Args {
  int threads = 2;
  std::string precision = "fp32";
  double seconds = 0;  // 0: 1 second per case, 0.05 in the model mode (many shapes)
  std::string model;   // the model mode: this model's own layers
  int64_t res = 224, batch = 16;
  bool algorithms = false;  // with --model: each 3x3 stride-1 layer by direct and by Winograd
};

[[noreturn]] void usage(const std::string& why, bool help = false) {
  std::fprintf(
      help ? stdout : stderr,
      "gg_bench_peak: %s\nusage: gg_bench_peak [--threads T] [--precision fp32|bf16] "
      "[--seconds S]\n       gg_bench_peak --model NAME [--res R] [--batch B] [--threads T] "
      "[--precision P] [--seconds S] [--algorithms]\n",
      why.c_str());
  std::exit(help ? 0 : 2);
}

Args parse(int argc, char** argv) {
  Args a;
  bool seconds_given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--help" || k == "-h")
      usage(
          "oneDNN's best convolution and matmul GFLOP/s and the instruction peak on this CPU; "
          "with --model, the floor of that model's training step (its layer shapes alone at "
          "oneDNN's best, and the SGD update), in ms; with --model and --algorithms, each "
          "3x3 stride-1 layer's passes by direct and by Winograd",
          true);
    if (k == "--algorithms") {
      a.algorithms = true;
      continue;
    }
    if (i + 1 >= argc) usage("option " + k + " needs a value");
    const std::string v = argv[++i];
    try {
      if (k == "--threads")
        a.threads = std::stoi(v);
      else if (k == "--precision")
        a.precision = v;
      else if (k == "--seconds") {
        a.seconds = std::stod(v);
        seconds_given = true;
      } else if (k == "--model")
        a.model = v;
      else if (k == "--res")
        a.res = std::stol(v);
      else if (k == "--batch")
        a.batch = std::stol(v);
      else
        usage("unknown option " + k);
    } catch (const std::logic_error&) {
      usage("option " + k + " needs a number, not '" + v + "'");
    }
  }
  if (a.threads < 1) usage("--threads must be >= 1");
  if (a.precision != "fp32" && a.precision != "bf16") usage("--precision must be fp32 or bf16");
  if (a.seconds < 0 || (a.seconds == 0 && seconds_given)) usage("--seconds must be > 0");
  if (a.seconds == 0) a.seconds = a.model.empty() ? 1.0 : 0.05;
  if (a.res < 1 || a.batch < 1) usage("--res and --batch must be >= 1");
  if (a.algorithms && (a.model.empty() || a.precision != "fp32"))
    usage("--algorithms needs --model and fp32 (oneDNN has Winograd in fp32 only)");
  return a;
}

// Median seconds of `run` (which ends by waiting on the stream), after two warm-up runs,
// repeated at least 5 times and for at least `seconds`.
double time_it(const std::function<void()>& run, double seconds) {
  run();
  run();
  std::vector<double> t;
  const auto start = Clock::now();
  while (t.size() < 5 || std::chrono::duration<double>(Clock::now() - start).count() < seconds) {
    const auto t0 = Clock::now();
    run();
    t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::nth_element(t.begin(), t.begin() + static_cast<long>(t.size() / 2), t.end());
  return t[t.size() / 2];
}

memory fresh(const memory::desc& md, const dnnl::engine& eng) {
  memory m(md, eng);
  // Small finite values: denormals or NaNs must not change the speed.
  if (gg::kernels::onednn::type_of(md) == dt::f32) {
    auto* p = static_cast<float*>(m.get_data_handle());
    for (size_t i = 0; i < md.get_size() / sizeof(float); ++i) p[i] = 0.01f * (i % 7);
  } else {
    auto* p = static_cast<uint16_t*>(m.get_data_handle());
    for (size_t i = 0; i < md.get_size() / 2; ++i) p[i] = 0x3c23;  // 0.01 in bf16
  }
  return m;
}

struct Conv {
  const char* name;
  int64_t n, c, k, h, r, stride;
};

void print(const char* op, const std::string& shape, const Args& a, double gflops) {
  std::printf("%s,%s,%s,%d,%.1f\n", op, shape.c_str(), a.precision.c_str(), a.threads, gflops);
  std::fflush(stdout);
}

// One convolution's shape, any padding.
struct ConvShape {
  int64_t n, c, k, h, w, r, stride, pad;
};

struct PassTimes {
  double forward = 0, backward_data = 0, backward_weights = 0;  // seconds, medians
};

// The median time of each of a layer's three training passes (convolution or inner product:
// the same arguments), on memories in the layouts the primitives chose.
template <class Fwd, class Data, class Weights>
PassTimes time_passes(const typename Fwd::primitive_desc& f, const typename Data::primitive_desc& d,
                      const typename Weights::primitive_desc& g, const Args& a,
                      const dnnl::engine& eng, dnnl::stream& s) {
  memory x = fresh(f.src_desc(), eng), wt = fresh(f.weights_desc(), eng),
         y = fresh(f.dst_desc(), eng), dx = fresh(d.diff_src_desc(), eng),
         dy = fresh(d.diff_dst_desc(), eng), dw = fresh(g.diff_weights_desc(), eng);
  memory wd = d.weights_desc() == f.weights_desc() ? wt : fresh(d.weights_desc(), eng);
  memory xg = g.src_desc() == f.src_desc() ? x : fresh(g.src_desc(), eng);
  memory dyg = g.diff_dst_desc() == d.diff_dst_desc() ? dy : fresh(g.diff_dst_desc(), eng);
  Fwd fp(f);
  Data dp(d);
  Weights gp(g);
  PassTimes t;
  t.forward = time_it(
      [&] {
        fp.execute(s, {{DNNL_ARG_SRC, x}, {DNNL_ARG_WEIGHTS, wt}, {DNNL_ARG_DST, y}});
        s.wait();
      },
      a.seconds);
  t.backward_data = time_it(
      [&] {
        dp.execute(s, {{DNNL_ARG_DIFF_DST, dy}, {DNNL_ARG_WEIGHTS, wd}, {DNNL_ARG_DIFF_SRC, dx}});
        s.wait();
      },
      a.seconds);
  t.backward_weights = time_it(
      [&] {
        gp.execute(s, {{DNNL_ARG_SRC, xg}, {DNNL_ARG_DIFF_DST, dyg}, {DNNL_ARG_DIFF_WEIGHTS, dw}});
        s.wait();
      },
      a.seconds);
  return t;
}

// The three training passes of one convolution under one algorithm; throws dnnl::error where
// oneDNN has no implementation of it.
PassTimes conv_times(const ConvShape& cv, dnnl::algorithm alg, const Args& a,
                     const dnnl::engine& eng, dnnl::stream& s) {
  const dt act = a.precision == "bf16" ? dt::bf16 : dt::f32;
  const int64_t oh = (cv.h + 2 * cv.pad - cv.r) / cv.stride + 1;
  const int64_t ow = (cv.w + 2 * cv.pad - cv.r) / cv.stride + 1;
  const memory::dims src{cv.n, cv.c, cv.h, cv.w}, w{cv.k, cv.c, cv.r, cv.r},
      dst{cv.n, cv.k, oh, ow}, st{cv.stride, cv.stride}, pd{cv.pad, cv.pad};
  const memory::desc src_md(src, act, tag::any), w_md(w, act, tag::any), dst_md(dst, act, tag::any),
      dw_md(w, dt::f32, tag::any);
  namespace api = gg::kernels::onednn;
  const memory::desc no_bias;
  const api::ConvFwd f = api::conv_fwd(eng, alg, src_md, w_md, no_bias, dst_md, st, pd, pd);
  const api::ConvBwdD d = api::conv_bwd_data(eng, alg, src_md, w_md, dst_md, st, pd, pd, f);
  const api::ConvBwdW g =
      api::conv_bwd_weights(eng, alg, src_md, dw_md, no_bias, dst_md, st, pd, pd, f);
  return time_passes<dnnl::convolution_forward, dnnl::convolution_backward_data,
                     dnnl::convolution_backward_weights>(f, d, g, a, eng, s);
}

// Forward, backward-data and backward-weights of one convolution; returns the training GFLOP/s
// (three passes' FLOPs over their summed median times) and prints each pass.
double conv(const Conv& cv, const Args& a, const dnnl::engine& eng, dnnl::stream& s) {
  const int64_t pad = cv.r / 2, out = (cv.h + 2 * pad - cv.r) / cv.stride + 1;
  const PassTimes t = conv_times({cv.n, cv.c, cv.k, cv.h, cv.h, cv.r, cv.stride, pad},
                                 dnnl::algorithm::convolution_direct, a, eng, s);
  const double flops = 2.0 * cv.n * cv.k * cv.c * cv.r * cv.r * out * out;
  char shape[96];
  std::snprintf(shape, sizeof shape, "%s n%ld c%ld k%ld %ldx%ld r%ld s%ld", cv.name,
                static_cast<long>(cv.n), static_cast<long>(cv.c), static_cast<long>(cv.k),
                static_cast<long>(cv.h), static_cast<long>(cv.h), static_cast<long>(cv.r),
                static_cast<long>(cv.stride));
  print("conv_forward", shape, a, flops / t.forward / 1e9);
  print("conv_backward_data", shape, a, flops / t.backward_data / 1e9);
  print("conv_backward_weights", shape, a, flops / t.backward_weights / 1e9);
  const double training = 3 * flops / (t.forward + t.backward_data + t.backward_weights) / 1e9;
  print("conv_training", shape, a, training);
  return training;
}

double matmul(const Args& a, const dnnl::engine& eng, dnnl::stream& s) {
  const int64_t m = 2048;
  const dt act = a.precision == "bf16" ? dt::bf16 : dt::f32;
  const memory::desc am({m, m}, act, tag::ab), bm({m, m}, act, tag::any),
      cm({m, m}, dt::f32, tag::ab);
  const auto pd = gg::kernels::onednn::matmul(eng, am, bm, cm);
  memory x = fresh(pd.src_desc(), eng), w = fresh(pd.weights_desc(), eng),
         y = fresh(pd.dst_desc(), eng);
  dnnl::matmul mm(pd);
  const double t = time_it(
      [&] {
        mm.execute(s, {{DNNL_ARG_SRC, x}, {DNNL_ARG_WEIGHTS, w}, {DNNL_ARG_DST, y}});
        s.wait();
      },
      a.seconds);
  const double g = 2.0 * m * m * m / t / 1e9;
  print("matmul", "m2048 n2048 k2048", a, g);
  return g;
}

// Register-only FMA (fp32) or bf16 dot-product rounds on all threads: kAcc independent
// accumulators per thread hide the instruction latency (4 cycles on Zen 3 and 4, Ice Lake and
// Sapphire Rapids, two FMA pipes: 8 in flight at least). Each returns a sum of the accumulators'
// first lanes, which keeps them live. Built for the instructions they use and called only on CPUs
// that have them (instruction_peak).
constexpr int kAcc = 12;  // 12 accumulators + 2 operands: within AVX2's 16 ymm registers

__attribute__((target("avx512f"))) float fma_round_zmm(long iters) {
  float sink = 0;
#pragma omp parallel reduction(+ : sink)
  {
    __m512 acc[kAcc];
    for (__m512& v : acc) v = _mm512_setzero_ps();
    const __m512 x = _mm512_set1_ps(1e-7f), y = _mm512_set1_ps(1.0f);
    for (long k = 0; k < iters; ++k) {
#pragma GCC unroll 12
      for (__m512& v : acc) v = _mm512_fmadd_ps(x, y, v);
    }
    alignas(64) float lanes[16];
    for (const __m512& v : acc) {
      _mm512_store_ps(lanes, v);
      sink += lanes[0];
    }
  }
  return sink;
}

__attribute__((target("avx512f,avx512bf16"))) float dpbf16_round_zmm(long iters) {
  float sink = 0;
#pragma omp parallel reduction(+ : sink)
  {
    __m512 acc[kAcc];
    for (__m512& v : acc) v = _mm512_setzero_ps();
    const __m512bh xb = (__m512bh)_mm512_set1_epi16(0x3380),
                   yb = (__m512bh)_mm512_set1_epi16(0x3f80);
    for (long k = 0; k < iters; ++k) {
#pragma GCC unroll 12
      for (__m512& v : acc) v = _mm512_dpbf16_ps(v, xb, yb);
    }
    alignas(64) float lanes[16];
    for (const __m512& v : acc) {
      _mm512_store_ps(lanes, v);
      sink += lanes[0];
    }
  }
  return sink;
}

__attribute__((target("avx2,fma"))) float fma_round_ymm(long iters) {
  float sink = 0;
#pragma omp parallel reduction(+ : sink)
  {
    __m256 acc[kAcc];
    for (__m256& v : acc) v = _mm256_setzero_ps();
    const __m256 x = _mm256_set1_ps(1e-7f), y = _mm256_set1_ps(1.0f);
    for (long k = 0; k < iters; ++k) {
#pragma GCC unroll 12
      for (__m256& v : acc) v = _mm256_fmadd_ps(x, y, v);
    }
    alignas(32) float lanes[8];
    for (const __m256& v : acc) {
      _mm256_store_ps(lanes, v);
      sink += lanes[0];
    }
  }
  return sink;
}

struct InstructionPeak {
  const char* name = "";  // the instruction, as the CSV row names it
  double gflops = 0;      // 0: the CPU lacks it
};

// The best GFLOP/s of the widest FMA (fp32: AVX-512F, else AVX2 with FMA) or bf16 dot product
// (AVX512_BF16 only: AVX2 has none) this CPU has and oneDNN may use, over rounds repeated for at
// least `seconds`.
InstructionPeak instruction_peak(const Args& a) {
  struct Kind {
    bool present;
    const char* name;
    float (*round)(long);
    int flops;  // per instruction: lanes x 2 (multiply-add), x 2 again for a dot product of pairs
  };
  // What oneDNN's kernels use here (its effective ISA): a run capped with ONEDNN_MAX_CPU_ISA (an
  // AVX-512 CPU measured as an AVX2 machine) gets the peak of the instructions it is capped to.
  const int block = gg::kernels::onednn_weight_block();  // 16: AVX-512, 8: AVX2, 0: older
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && block != 0;
  const bool avx512 = __builtin_cpu_supports("avx512f") && block == 16;
  const bool bf16 = __builtin_cpu_supports("avx512bf16") && gg::kernels::bf16_supported();
  const std::vector<Kind> kinds =
      a.precision == "bf16" ? std::vector<Kind>{{bf16, "zmm vdpbf16ps", dpbf16_round_zmm, 16 * 4}}
                            : std::vector<Kind>{{avx512, "zmm vfmadd", fma_round_zmm, 16 * 2},
                                                {avx2, "ymm vfmadd", fma_round_ymm, 8 * 2}};
  const auto k = std::find_if(kinds.begin(), kinds.end(), [](const Kind& k) { return k.present; });
  InstructionPeak p;
  if (k == kinds.end()) return p;
  p.name = k->name;
  const long iters = 1L << 22;  // a few milliseconds per round
  const double flops = static_cast<double>(iters) * kAcc * omp_get_max_threads() * k->flops;
  float sink = 0;
  const auto start = Clock::now();
  do {
    const auto t0 = Clock::now();
    sink += k->round(iters);
    const double t = std::chrono::duration<double>(Clock::now() - t0).count();
    p.gflops = std::max(p.gflops, flops / t / 1e9);
  } while (std::chrono::duration<double>(Clock::now() - start).count() < a.seconds);
  if (sink < 0) std::printf("#\n");  // keeps the rounds' results live
  return p;
}

// The best of oneDNN's algorithms for each pass of one convolution: direct, and in fp32 also
// Winograd and oneDNN's own choice (auto) where it has them.
PassTimes best_conv(const ConvShape& cv, const Args& a, const dnnl::engine& eng, dnnl::stream& s) {
  using dnnl::algorithm;
  PassTimes best = conv_times(cv, algorithm::convolution_direct, a, eng, s);
  if (a.precision != "fp32") return best;
  for (algorithm alg : {algorithm::convolution_winograd, algorithm::convolution_auto}) {
    try {
      const PassTimes t = conv_times(cv, alg, a, eng, s);
      best.forward = std::min(best.forward, t.forward);
      best.backward_data = std::min(best.backward_data, t.backward_data);
      best.backward_weights = std::min(best.backward_weights, t.backward_weights);
    } catch (const dnnl::error&) {
      // no implementation of this algorithm for this shape
    }
  }
  return best;
}

// The three training passes of a fully connected layer reading `in` (batched dims).
PassTimes fc_times(const memory::dims& in, int64_t out, const Args& a, const dnnl::engine& eng,
                   dnnl::stream& s) {
  const dt act = a.precision == "bf16" ? dt::bf16 : dt::f32;
  memory::dims w_dims = in;
  w_dims[0] = out;
  const memory::desc src_md(in, act, tag::any), w_md(w_dims, act, tag::any),
      dw_md(w_dims, dt::f32, tag::any), dst_md({in[0], out}, dt::f32, tag::nc),
      ddst_md({in[0], out}, act, tag::nc);
  namespace api = gg::kernels::onednn;
  const memory::desc no_bias;
  const api::IpFwd f = api::ip_fwd(eng, src_md, w_md, no_bias, dst_md);
  const api::IpBwdD d = api::ip_bwd_data(eng, src_md, w_md, ddst_md, f);
  const api::IpBwdW g = api::ip_bwd_weights(eng, src_md, dw_md, no_bias, ddst_md, f);
  return time_passes<dnnl::inner_product_forward, dnnl::inner_product_backward_data,
                     dnnl::inner_product_backward_weights>(f, d, g, a, eng, s);
}

// The model mode: what a training step of this model cannot go below with oneDNN's kernels on
// this CPU. Every convolution and fully connected layer of the model is timed alone at its own
// shape (distinct shapes once, counted as often as the model has them), each pass at the best of
// oneDNN's algorithms and layouts, no backward-data where the layer reads the input; beside it,
// the SGD update (momentum and weight decay) over the model's parameters, which a step does once
// whatever the batch. Prints each shape's milliseconds per step and, last, "floor": their sum.
// The model's layer shapes, each with how many layers have it: convolutions keyed (in, out,
// height, width, kernel, stride, pad, reads the input), fully connected (out, reads the input,
// input dims...).
struct ModelShapes {
  gg::kernels::Graph graph;
  std::map<std::vector<int64_t>, int> convs, fcs;
};

ModelShapes model_shapes(const Args& a) {
  namespace gk = gg::kernels;
  gk::ModelSpec spec = gk::default_spec(a.model);
  spec.input = {3, a.res, a.res};
  spec.classes = 1000;
  ModelShapes m{gk::build_model(spec), {}, {}};
  for (const gk::Node& n : m.graph.nodes()) {
    if (n.inputs.empty()) continue;
    const gk::Node& in = m.graph.node(n.inputs[0]);
    const int64_t reads_input = in.op == gk::Op::Input ? 1 : 0;
    if (n.op == gk::Op::Conv)
      m.convs[{in.out[0], n.out[0], in.out[1], in.out[2], n.conv.kernel, n.conv.stride, n.conv.pad,
               reads_input}]++;
    else if (n.op == gk::Op::FullyConnected) {
      std::vector<int64_t> key(in.out.begin(), in.out.end());
      key.insert(key.begin(), {n.fc.out_features, reads_input});
      m.fcs[key]++;
    }
  }
  return m;
}

std::string conv_name(const std::vector<int64_t>& k) {
  char name[128];
  std::snprintf(name, sizeof name, "conv c%ld k%ld %ldx%ld r%ld s%ld p%ld", static_cast<long>(k[0]),
                static_cast<long>(k[1]), static_cast<long>(k[2]), static_cast<long>(k[3]),
                static_cast<long>(k[4]), static_cast<long>(k[5]), static_cast<long>(k[6]));
  return name;
}

// The algorithms mode: every 3x3 stride-1 convolution shape of the model, its three passes timed
// by direct and by Winograd (milliseconds, one layer), and what the executor's rule
// (winograd_pays) runs it with: oneDNN's auto (which may pick Winograd) or direct.
int model_algorithms(const Args& a, const dnnl::engine& eng, dnnl::stream& s) {
  const ModelShapes m = model_shapes(a);
  std::printf(
      "layer,count,threads,direct_forward_ms,direct_backward_data_ms,direct_backward_weights_ms,"
      "winograd_forward_ms,winograd_backward_data_ms,winograd_backward_weights_ms,direct_ms,"
      "winograd_ms,executor_takes\n");
  for (const auto& [k, count] : m.convs) {
    if (k[4] != 3 || k[5] != 1) continue;
    const ConvShape cv{a.batch, k[0], k[1], k[2], k[3], k[4], k[5], k[6]};
    const bool data = k[7] == 0;
    const PassTimes d = conv_times(cv, dnnl::algorithm::convolution_direct, a, eng, s);
    PassTimes w;
    try {
      w = conv_times(cv, dnnl::algorithm::convolution_winograd, a, eng, s);
    } catch (const dnnl::error&) {
      std::printf("%s,%d,%d,,,,,,,,,no Winograd kernel\n", conv_name(k).c_str(), count, a.threads);
      continue;
    }
    const auto total = [&](const PassTimes& t) {
      return 1e3 * (t.forward + (data ? t.backward_data : 0) + t.backward_weights);
    };
    const int64_t oh = k[2] + 2 * k[6] - 2, ow = k[3] + 2 * k[6] - 2;  // 3x3, stride 1
    const bool takes = gg::kernels::onednn::winograd_pays(k[0], k[1], oh, ow);
    std::printf("%s,%d,%d,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%s\n", conv_name(k).c_str(),
                count, a.threads, 1e3 * d.forward, data ? 1e3 * d.backward_data : 0.0,
                1e3 * d.backward_weights, 1e3 * w.forward, data ? 1e3 * w.backward_data : 0.0,
                1e3 * w.backward_weights, total(d), total(w), takes ? "auto" : "direct");
    std::fflush(stdout);
  }
  return 0;
}

int model_floor(const Args& a, const dnnl::engine& eng, dnnl::stream& s) {
  namespace gk = gg::kernels;
  const ModelShapes shapes = model_shapes(a);
  const gk::Graph& g = shapes.graph;
  const auto& convs = shapes.convs;
  const auto& fcs = shapes.fcs;
  std::printf(
      "layer,count,precision,threads,forward_ms,backward_data_ms,backward_weights_ms,"
      "ms_per_step\n");
  double total = 0;
  const auto row = [&](const std::string& name, int count, const PassTimes& t, bool data) {
    const double ms = count * 1e3 * (t.forward + (data ? t.backward_data : 0) + t.backward_weights);
    total += ms;
    std::printf("%s,%d,%s,%d,%.3f,%.3f,%.3f,%.3f\n", name.c_str(), count, a.precision.c_str(),
                a.threads, 1e3 * t.forward, data ? 1e3 * t.backward_data : 0.0,
                1e3 * t.backward_weights, ms);
    std::fflush(stdout);
  };
  for (const auto& [k, count] : convs) {
    const ConvShape cv{a.batch, k[0], k[1], k[2], k[3], k[4], k[5], k[6]};
    row(conv_name(k), count, best_conv(cv, a, eng, s), k[7] == 0);
  }
  for (const auto& [k, count] : fcs) {
    memory::dims in{a.batch};
    in.insert(in.end(), k.begin() + 2, k.end());
    row("fc " + std::to_string(k[0]), count, fc_times(in, k[0], a, eng, s), k[1] == 0);
  }
  // The SGD update reads the weights, gradients and momentum and writes two of them back.
  const int64_t n = g.param_count();
  std::vector<float> w(static_cast<size_t>(n), 0.01f), grad(static_cast<size_t>(n), 0.001f);
  gk::Sgd sgd(n, {});
  sgd.step(w.data(), grad.data(), 0.1f);  // the first step seeds the momentum
  PassTimes update;
  update.forward = time_it([&] { sgd.step(w.data(), grad.data(), 0.1f); }, a.seconds);
  row("sgd update " + std::to_string(n) + " parameters", 1, update, false);
  std::printf("floor,%s %ldpx batch %ld,%s,%d,,,,%.3f\n", a.model.c_str(), static_cast<long>(a.res),
              static_cast<long>(a.batch), a.precision.c_str(), a.threads, total);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  omp_set_num_threads(a.threads);
  try {
    dnnl::engine eng(dnnl::engine::kind::cpu, 0);
    dnnl::stream s(eng);
    if (a.algorithms) return model_algorithms(a, eng, s);
    if (!a.model.empty()) return model_floor(a, eng, s);
    std::printf("op,shape,precision,threads,gflops\n");
    if (const InstructionPeak p = instruction_peak(a); p.gflops > 0)
      print("instruction_peak", p.name, a, p.gflops);
    else
      std::fprintf(stderr, "gg_bench_peak: no instruction peak (needs %s)\n",
                   a.precision == "bf16" ? "AVX512_BF16" : "AVX2 with FMA");
    matmul(a, eng, s);
    // ResNet-50's convolutions at batch 16 (224 input): the 3x3 of each stage and two 1x1.
    const std::vector<Conv> shapes = {
        {"res2 3x3", 16, 64, 64, 56, 3, 1},          {"res3 3x3", 16, 128, 128, 28, 3, 1},
        {"res4 3x3", 16, 256, 256, 14, 3, 1},        {"res5 3x3", 16, 512, 512, 7, 3, 1},
        {"res3 1x1 expand", 16, 128, 512, 28, 1, 1}, {"res4 1x1 reduce", 16, 1024, 256, 14, 1, 1}};
    double best = 0;
    for (const Conv& c : shapes) best = std::max(best, conv(c, a, eng, s));
    print("ceiling", "best conv_training", a, best);
  } catch (const dnnl::error& e) {
    std::fprintf(stderr, "gg_bench_peak: oneDNN: %s (status %d)\n", e.what(),
                 static_cast<int>(e.status));
    return 1;
  } catch (const std::exception& e) {  // an unknown model, an input too small for it
    std::fprintf(stderr, "gg_bench_peak: %s\n", e.what());
    return 2;
  }
  return 0;
}
