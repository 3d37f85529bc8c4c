// The state one rank trains (weights, gradients, batch-norm running statistics, SGD momentum)
// and the step's work on it, wherever it lives: the trainer runs one step through this seam on
// every backend.
//
// The host copies are the network's ParamStore and the trainer's Sgd (its velocity and whether it
// has started). A host state works on them directly. A detached state keeps its own copies (on a
// GPU: kernels/cuda/cuda_executor.hpp's make_device_state), and the host copies of a part are
// current only after to_host(part): the step marks what it changes there as stale, and whoever
// writes a host copy hands it back with from_host(part). The weight and gradient exchanges mix
// the host copies (host-staged: the trainer brackets them with to_host / from_host).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "kernels/executor.hpp"
#include "kernels/optimizer.hpp"

namespace gg::kernels {

// The parts of a state, as flags.
enum StatePart : unsigned {
  kParams = 1,
  kGrads = 2,
  kBuffers = 4,
  kVelocity = 8,
  kAllParts = kParams | kGrads | kBuffers | kVelocity,
};

// A training forward's loss: the mean softmax cross-entropy of its batch and its top-1 hits.
// known = false where there is none to report: compute is emulated, or a device state's first
// step (a device state reports each step's loss one step late: lag says so).
struct StepLoss {
  double loss = 0;
  int64_t correct = 0;
  bool known = false;
  int lag = 0;  // how many forwards before this one it belongs to (a device state's: 1)
};

class TrainState {
 public:
  TrainState(Executor& exec, ParamStore& store, Sgd& host_sgd)
      : exec_(exec), store_(store), host_sgd_(host_sgd) {}
  virtual ~TrainState() = default;
  TrainState(const TrainState&) = delete;
  TrainState& operator=(const TrainState&) = delete;

  // "host", or where a detached state keeps the state ("device", "host copy").
  virtual const char* where() const = 0;
  bool detached() const { return detached_; }

  // The training forward of batch x (the executor's batch, plain NCHW) and its loss against
  // labels y (< 0: padding), whose gradient starts the next backward.
  virtual StepLoss forward(const float* x, const int32_t* y) = 0;
  // Backward from that gradient; ready(b) as soon as bucket b's gradients are final in the host
  // copy when staged_grads() (where the gradient exchange reads them), else in the state.
  virtual void backward(const BucketReady& ready) = 0;
  // Whether backward puts the gradients into the host copy bucket by bucket (set before the
  // first step where a gradient exchange needs them).
  virtual void stage_grads(bool staged) { staged_grads_ = staged; }
  bool staged_grads() const { return staged_grads_; }
  // kernels::Sgd's update, bit for bit: the whole state, or over [begin, end) (a bucket at a
  // time, then end_ranges()).
  virtual void update(float lr) = 0;
  virtual void update_range(float lr, int64_t begin, int64_t end) = 0;
  virtual void end_ranges() = 0;

  // The host copies of `parts` made current (nothing is copied where they are); and, after the
  // caller wrote the host copies of `parts`, the state takes them.
  void to_host(unsigned parts);
  void from_host(unsigned parts);
  // to_host of one part bucket by bucket, landed(b) as soon as bucket b's host copy is current,
  // in bucket order: a host-staged exchange sends the first buckets while the rest still copy.
  // (Everything at once, then the calls, where nothing is copied asynchronously.)
  void to_host_buckets(unsigned part, const std::vector<Bucket>& buckets,
                       const std::function<void(int)>& landed);
  // The parts whose host copies are not current.
  unsigned stale() const { return stale_; }
  // Something else changed `parts` where the state lives (a device exchange mixed them).
  void changed(unsigned parts) {
    if (detached_) mark_stale(parts);
  }

  // A device state's memory of one part (kParams, kVelocity, ...) and the stream its step runs
  // on (a cudaStream_t), for exchanges that mix on the device; nullptr elsewhere.
  virtual float* device_data(unsigned part) {
    (void)part;
    return nullptr;
  }
  virtual void* device_stream() { return nullptr; }

 protected:
  virtual void download(unsigned parts) = 0;  // only stale parts, state -> host copies
  virtual void upload(unsigned parts) = 0;    // host copies -> state
  // The stale kParams or kVelocity into its host copy `host` bucket by bucket, landed(b) as each
  // arrives, in bucket order (here: all at once, then the calls).
  virtual void download_buckets(unsigned part, float* host, const std::vector<Bucket>& buckets,
                                const std::function<void(int)>& landed);
  // The step changed `parts` in the state: their host copies are stale.
  virtual void mark_stale(unsigned parts) { stale_ |= parts; }

  Executor& exec_;
  ParamStore& store_;
  Sgd& host_sgd_;
  bool detached_ = false;
  bool staged_grads_ = false;
  unsigned stale_ = 0;
};

// The state in the host copies: the CPU backends' (and a host-authoritative GPU executor's), the
// loss on the host with `classes` classes.
std::unique_ptr<TrainState> make_host_state(Executor& exec, ParamStore& store, Sgd& sgd,
                                            int64_t classes);

// The state resident on the GPU of a CUDA executor (its resident mode): forward, loss, backward
// and the update only enqueue; the loss is read one step late through page-locked memory; the
// host copies are downloaded by to_host. std::invalid_argument for another executor or a build
// without the CUDA backend.
std::unique_ptr<TrainState> make_device_state(Executor& exec, ParamStore& store, Sgd& sgd);

// A CPU stand-in for a device state, for tests: the same executor, but the state kept in copies
// of its own, and every host copy the step makes stale filled with NaN until to_host(), so that a
// reader that forgets to_host() or a writer that forgets from_host() changes what training
// computes. `late_loss`: each step reports the step before's loss, as a device state does.
// Selected by GG_TEST_DETACHED_STATE=1 (=late: with late_loss; docs/testing.md).
std::unique_ptr<TrainState> make_detached_host_state(Executor& exec, ParamStore& store, Sgd& sgd,
                                                     int64_t classes, bool late_loss);

}  // namespace gg::kernels
