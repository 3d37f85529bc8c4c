// bench/compute: training throughput of one network on one process: forward + loss + backward +
// SGD update, images/s as the median over timed steps after warm-up, and the peak resident
// memory of the process. The same measurement in PyTorch is torch_bench.py; run.sh runs both.
// Prints one CSV row: impl,model,batch,res,threads,precision,median_step_s,images_per_s,
// peak_rss_mb,params
#include <omp.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#ifdef GG_HAVE_CUDA
#include "kernels/cuda/cuda_executor.hpp"
#include "kernels/cuda/device_buffers.hpp"
#endif
#include "kernels/loss.hpp"
#include "kernels/models.hpp"
#include "kernels/net.hpp"
#include "kernels/optimizer.hpp"

using namespace gg;
using Clock = std::chrono::steady_clock;

namespace {

struct Args {
  std::string model = "resnet50";
  int64_t batch = 16, res = 224, classes = 1000;
  int threads = 2, steps = 10, warmup = 3;
  std::string precision = "fp32", backend = "onednn", layout = "native", fuse, graph, conv_stats;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(
      stderr,
      "gg_bench_compute: %s\nusage: gg_bench_compute [--model NAME] [--batch B] [--res R] "
      "[--classes N] [--threads T] [--steps N] [--warmup N] [--precision fp32|tf32|bf16] "
      "[--backend onednn|reference|cuda] [--layout native|plain|nhwc] [--fuse on|off] "
      "[--graph on|off] [--conv-stats on|off]\n"
      "  cuda: fp32 is strict fp32, tf32 lets convolutions and GEMMs use TF32; the "
      "step keeps everything on the GPU (input uploaded once, loss and SGD on the "
      "device) and ends in a stream synchronisation; --fuse off runs batch norm, "
      "residual add and ReLU one layer at a time (default on: fused); --layout nhwc "
      "keeps activations channels-last (default: channels-first); --graph on captures "
      "the step in a CUDA graph in the second warm-up step and replays it (default "
      "off); --conv-stats on gives each batch norm its statistics from its convolution's epilogue "
      "(cuDNN's graph API; nhwc and bf16 only; default off); the CSV's impl says each "
      "(gossipgrad-cuda-nhwc, ...-unfused, ...-graph, ...-convstats)\n",
      why.c_str());
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--help" || k == "-h") usage("training images/s of one network");
    if (i + 1 >= argc) usage("option " + k + " needs a value");
    const std::string v = argv[++i];
    try {
      if (k == "--model")
        a.model = v;
      else if (k == "--batch")
        a.batch = std::stoll(v);
      else if (k == "--res")
        a.res = std::stoll(v);
      else if (k == "--classes")
        a.classes = std::stoll(v);
      else if (k == "--threads")
        a.threads = std::stoi(v);
      else if (k == "--steps")
        a.steps = std::stoi(v);
      else if (k == "--warmup")
        a.warmup = std::stoi(v);
      else if (k == "--precision")
        a.precision = v;
      else if (k == "--backend")
        a.backend = v;
      else if (k == "--layout")
        a.layout = v;
      else if (k == "--fuse")
        a.fuse = v;
      else if (k == "--graph")
        a.graph = v;
      else if (k == "--conv-stats")
        a.conv_stats = v;
      else
        usage("unknown option " + k);
    } catch (const std::logic_error&) {
      usage("option " + k + " needs a number, got '" + v + "'");
    }
  }
  if (a.batch < 1 || a.res < 1 || a.threads < 1 || a.steps < 1 || a.warmup < 0)
    usage("batch, res, threads and steps must be positive");
  if (a.precision != "fp32" && a.precision != "bf16" && a.precision != "tf32")
    usage("precision '" + a.precision + "' is unknown (fp32, tf32 or bf16)");
  if (a.layout != "native" && a.layout != "plain" && a.layout != "nhwc")
    usage("layout '" + a.layout +
          "' is unknown (native: as gossipgrad train keeps the weights; plain; nhwc: cuda's "
          "channels-last)");
  if (a.layout == "nhwc" && a.backend != "cuda") usage("--layout nhwc needs --backend cuda");
  if (a.precision == "tf32" && a.backend != "cuda") usage("tf32 needs --backend cuda");
  if (!a.fuse.empty() && a.fuse != "on" && a.fuse != "off")
    usage("--fuse '" + a.fuse + "' is unknown (on or off)");
  if (!a.fuse.empty() && a.backend != "cuda") usage("--fuse needs --backend cuda");
  if (!a.graph.empty() && a.graph != "on" && a.graph != "off")
    usage("--graph '" + a.graph + "' is unknown (on or off)");
  if (!a.graph.empty() && a.backend != "cuda") usage("--graph needs --backend cuda");
  if (!a.conv_stats.empty() && a.conv_stats != "on" && a.conv_stats != "off")
    usage("--conv-stats '" + a.conv_stats + "' is unknown (on or off)");
  if (a.conv_stats == "on" && (a.backend != "cuda" || a.layout != "nhwc" || a.precision != "bf16"))
    usage("--conv-stats on needs --backend cuda --layout nhwc --precision bf16");
  if (a.graph == "on" && a.warmup < 2)
    usage(
        "--graph on runs one warm-up step eagerly and captures the next: give --warmup 2 or "
        "more");
  if (a.precision == "bf16" && a.backend == "onednn" && !kernels::bf16_supported())
    usage("bf16 needs a CPU with AVX512_BF16 (or AMX); this one has neither");
  return a;
}

double peak_rss_mb() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  try {
    omp_set_num_threads(a.threads);
    kernels::ModelSpec spec;
    spec.name = a.model;
    spec.input = {3, a.res, a.res};
    spec.classes = a.classes;
    const kernels::Backend backend = kernels::parse_backend(a.backend);
    const kernels::Precision precision =
        kernels::parse_precision(a.precision == "tf32" ? "fp32" : a.precision);
    kernels::Net net(kernels::build_model(spec), backend, 1 << 20, precision);
    kernels::init_params(net.graph(), net.store(), 1);
    if (a.layout == "native") net.use_native_layout();  // as the trainer does
    const kernels::SgdOptions sgd_options{0.9f, 1e-4f, false};
    kernels::Sgd sgd(net.graph().param_count(), sgd_options);

    std::mt19937 rng(7);
    std::normal_distribution<float> normal;
    std::vector<float> x(a.batch * 3 * a.res * a.res);
    for (float& v : x) v = normal(rng);
    std::vector<int32_t> y(a.batch);
    for (int64_t i = 0; i < a.batch; ++i) y[i] = static_cast<int32_t>(rng() % a.classes);
    std::vector<float> dlogits(a.batch * a.classes);

    std::vector<double> times;
    std::function<void()> step;
#ifdef GG_HAVE_CUDA
    std::unique_ptr<kernels::CudaExecutor> gpu;
    if (backend == kernels::Backend::Cuda) {
      kernels::select_cuda_device(0);
      std::fprintf(stderr, "gg_bench_compute: %s\n", kernels::cuda_describe().c_str());
      kernels::CudaOptions o;
      o.tf32 = a.precision == "tf32";
      o.fuse = a.fuse != "off";
      o.nhwc = a.layout == "nhwc";
      o.conv_stats = a.conv_stats == "on";
      gpu = kernels::make_cuda_executor(net.graph(), a.batch, net.store(), net.buckets(), precision,
                                        o);
      if (o.conv_stats) {
        std::fprintf(stderr,
                     "gg_bench_compute: %d convolutions give their batch norm's "
                     "statistics; %zu could not:\n",
                     gpu->conv_stats_fused(), gpu->conv_stats_skipped().size());
        for (const std::string& why : gpu->conv_stats_skipped())
          std::fprintf(stderr, "  %s\n", why.c_str());
      }
      // Resident: weights, input and labels go up once; a step never leaves the GPU.
      gpu->set_resident(true);
      gpu->device().upload_params(net.store().params.data());
      gpu->device().upload_buffers(net.store().buffers.data());
      gpu->forward(x.data(), false);  // uploads the input into device_input()
      const auto enqueue = [&] {
        gpu->forward_device(true);
        gpu->loss_device(y.data());
        gpu->backward_device({});
        gpu->device().sgd_step(0.01f, sgd_options);
      };
      // --graph on: the first warm-up step eagerly, the second captured and replayed, then
      // replays (the capture is not timed).
      step = [&, enqueue, graphed = false, eager = 0]() mutable {
        if (a.graph != "on" || eager < 1) {
          enqueue();
          ++eager;
        } else {
          if (!graphed) gpu->capture_step(enqueue);
          graphed = true;
          gpu->replay_step();
        }
        gpu->synchronize();
      };
    }
#endif
    if (!step) {
      kernels::Executor& ex = net.at_batch(a.batch);
      step = [&] {
        const float* logits = ex.forward(x.data(), true);
        kernels::softmax_cross_entropy(logits, y.data(), a.batch, a.classes, dlogits.data());
        ex.backward(dlogits.data(), {});
        sgd.step(net.store().params.data(), net.store().grads.data(), 0.01f);
      };
    }
    for (int s = 0; s < a.warmup + a.steps; ++s) {
      const auto t0 = Clock::now();
      step();
      const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
      if (s >= a.warmup) times.push_back(dt);
      std::fprintf(stderr, "\rgg_bench_compute %s: step %d/%d %.3f s", a.model.c_str(), s + 1,
                   a.warmup + a.steps, dt);
    }
    std::fprintf(stderr, "\n");
    std::sort(times.begin(), times.end());
    const double med = times[times.size() / 2];
    std::string impl = "gossipgrad-" + a.backend;
    if (a.layout == "nhwc") impl += "-nhwc";
    if (a.fuse == "off") impl += "-unfused";
    if (a.graph == "on") impl += "-graph";
    if (a.conv_stats == "on") impl += "-convstats";
    std::printf("%s,%s,%lld,%lld,%d,%s,%.6g,%.4g,%.1f,%lld\n", impl.c_str(), a.model.c_str(),
                static_cast<long long>(a.batch), static_cast<long long>(a.res), a.threads,
                a.precision.c_str(), med, a.batch / med, peak_rss_mb(),
                static_cast<long long>(net.graph().param_count()));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gg_bench_compute: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
