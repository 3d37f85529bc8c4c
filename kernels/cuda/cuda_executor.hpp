// The CUDA backend: convolutions through cuDNN (algorithms chosen by cuDNN's find / heuristics,
// workspace sized by its own queries), fully connected layers through cuBLAS, everything else in
// small kernels; parameters, gradients and statistics in flat device buffers laid out as the host
// ParamStore. fp32 runs may use TF32 tensor cores; bf16 runs keep activations in bf16 over fp32
// master weights. This header needs no CUDA headers.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "kernels/executor.hpp"
#include "kernels/loss.hpp"

namespace gg::kernels {

namespace cuda {
class DeviceBuffers;
}

struct CudaOptions {
  bool tf32 = true;             // fp32 convolutions and GEMMs may round inputs to TF32
  bool find_algorithms = true;  // time cuDNN's candidates (cudnnFind*Ex), else its heuristics
  // A batch norm read only by a ReLU, or only by a residual add read only by a ReLU, runs with
  // them as one pass forward and one backward (the add's gradient is the buffer that pass writes,
  // not a copy); false runs each layer alone. Off by default (so in `gossipgrad train`) until the
  // fused kernels have passed tests/cuda on a GPU: they were written without one (docs/gpu.md);
  // gg_bench_compute and the GPU tests turn it on.
  bool fuse = false;
  // Activations channels-last (NHWC) and convolution filters in cuDNN's NHWC layout (a shadow of
  // the fp32 master weights, transposed each forward), which tensor-core convolutions read
  // without transposing. Refused (std::invalid_argument, one line) for a graph with a layer it
  // does not cover: LRN, dropout over images, a fully connected layer over images.
  bool nhwc = false;
  // Training forward: a convolution whose output only a batch norm reads gives that batch norm's
  // statistics from its epilogue (cuDNN's graph API, conv_stats.hpp), so the statistics pass over
  // it is not run. Needs nhwc and bf16 activations (std::invalid_argument otherwise); where cuDNN
  // has no plan for a shape on this GPU, or the build has no cudnn-frontend, that convolution
  // runs as before and conv_stats_skipped() says why. Off by default until tests/cuda has passed
  // on a GPU: it was written without one (docs/gpu.md).
  bool conv_stats = false;
  // The same algorithms and the same bits every run (a resumed run computes what an
  // uninterrupted one does): cuDNN's heuristics alone (no timing, which may choose otherwise from
  // run to run) among its deterministic algorithms. cuBLAS and our kernels are deterministic
  // anyway.
  bool deterministic = false;
};

// Two ways to run:
//  - host-authoritative (default): the Executor contract as the CPU backends keep it. Every
//    forward uploads the host parameters and statistics; a training forward brings the running
//    statistics back; backward copies each gradient bucket to ParamStore::grads on a side stream
//    as soon as backward completes it, and calls ready(b) once bucket b is on the host (the
//    buckets copy while backward still runs). The optimizer may run on the host.
//  - resident (set_resident(true)): parameters, statistics and the SGD velocity stay on the device
//    (device() holds them; upload/download them explicitly). forward_device / loss_device /
//    backward_device enqueue work without waiting for it; backward_device calls ready(b) as soon
//    as bucket b's gradients are *enqueued*, so the callback can enqueue staging after them
//    (device().on_bucket_ready(b)), and device().sgd_step updates on the GPU.
class CudaExecutor : public Executor {
 public:
  virtual void set_resident(bool resident) = 0;
  virtual bool resident() const = 0;
  virtual cuda::DeviceBuffers& device() = 0;

  // The fp32 input batch on the device, batch x input dims, that forward_device reads; and its
  // copy from the host on the compute stream (read from pageable memory before this returns).
  virtual float* device_input() = 0;
  virtual void upload_input(const float* x) = 0;
  virtual void forward_device(bool train) = 0;
  // Softmax cross-entropy of the last forward's logits against host labels (< 0: padding),
  // computed on the device; its gradient becomes backward_device's starting point. The labels
  // are copied asynchronously: page-locked ones must stay unchanged until the stream has run.
  virtual void loss_device(const int32_t* labels) = 0;
  // The mean loss of the last loss_device (waits for its copy to the host, not for what was
  // enqueued after it; in a replayed graph, for the whole stream).
  virtual double last_loss() = 0;
  virtual void backward_device(const BucketReady& ready) = 0;
  // Resident: backward_device stages each gradient bucket to ParamStore::grads as the
  // host-authoritative mode does, and calls ready(b) once it is there (a gradient exchange that
  // mixes on the host); false (the default) calls ready(b) when bucket b is enqueued.
  virtual void set_stage_grads(bool staged) = 0;
  // Waits for everything enqueued on the compute stream.
  virtual void synchronize() = 0;

  // CUDA graphs, resident only. capture_step runs `enqueue` (one training step's device work:
  // forward_device(true), loss_device, backward_device, device().sgd_step, ...) under stream
  // capture into a graph instead of running it; replay_step launches that graph, all of it for
  // the cost of one launch. A replay reads the labels stage_labels (or loss_device, at capture)
  // staged last, draws the next step's dropout masks, and repeats every other host-side argument
  // as captured (the learning rate among them). Needs one whole step run eagerly first
  // (backward's buffers, cuDNN's and cuBLAS's choices, the SGD velocity's start); refuses
  // GG_CUDA_PROFILE (its events wait) and bucket callbacks in the captured backward (staging
  // waits for the host). set_dropout_step before a replay moves the masks as it does eagerly.
  virtual void capture_step(const std::function<void()>& enqueue) = 0;
  virtual void replay_step() = 0;
  // Copies labels for the next replay (waits for the last one to have read the previous).
  virtual void stage_labels(const int32_t* labels) = 0;
  // CudaOptions::conv_stats: the convolutions that run with the statistics in their epilogue, and
  // one line for each that could not and why.
  virtual int conv_stats_fused() const = 0;
  virtual const std::vector<std::string>& conv_stats_skipped() const = 0;

 protected:
  using Executor::Executor;
};

std::unique_ptr<CudaExecutor> make_cuda_executor(const Graph& g, int64_t batch, ParamStore& store,
                                                 const std::vector<Bucket>& buckets,
                                                 Precision precision, CudaOptions options = {});

// How many CUDA devices this process sees; 0 with the runtime's reason in `why` when none.
int cuda_device_count(std::string* why = nullptr);
// One rank per GPU: makes device (local_rank mod device count) current for this process.
// Throws a one-line std::runtime_error when no device is present.
void select_cuda_device(int local_rank);
// The name of the current device and the CUDA / cuDNN / cuBLAS versions, for benchmark headers.
std::string cuda_describe();

}  // namespace gg::kernels
