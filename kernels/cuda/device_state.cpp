// The training state resident on the GPU (kernels/train_state.hpp): the CUDA executor's resident
// mode, its DeviceBuffers holding the weights, gradients, statistics and momentum.
#include <cuda_runtime_api.h>

#include <stdexcept>
#include <vector>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/cuda_executor.hpp"
#include "kernels/cuda/device_buffers.hpp"
#include "kernels/train_state.hpp"

namespace gg::kernels {
namespace {

class DeviceState final : public TrainState {
 public:
  DeviceState(CudaExecutor& e, ParamStore& s, Sgd& sgd) : TrainState(e, s, sgd), cuda_(e) {
    detached_ = true;
    cuda_.set_resident(true);
    upload(kParams | kBuffers | kVelocity);
    // The host copies a host-staged weight exchange sends, page-locked where they are, so that
    // their buckets copy while earlier ones are on the wire (else the copies wait, as before).
    pin(store_.params.data(), store_.params.size());
    pin(host_sgd_.velocity().data(), static_cast<int64_t>(host_sgd_.velocity().size()));
    GG_CUDA_CHECK(cudaEventCreateWithFlags(&updated_, cudaEventDisableTiming));
  }
  ~DeviceState() override {
    for (cudaEvent_t e : landed_) cudaEventDestroy(e);
    if (updated_) cudaEventDestroy(updated_);
    for (float* p : pinned_) cudaHostUnregister(p);
  }
  const char* where() const override { return "device"; }

  StepLoss forward(const float* x, const int32_t* y) override {
    StepLoss l;
    if (steps_ > 0) {  // the last step's, whose copy to the host has long been enqueued
      l.loss = cuda_.last_loss();
      l.known = true;
      l.lag = 1;
      l.correct = -1;  // not counted on the device
    }
    cuda_.upload_input(x);
    cuda_.forward_device(true);
    cuda_.loss_device(y);
    ++steps_;
    mark_stale(kBuffers);
    return l;
  }
  void stage_grads(bool staged) override {
    TrainState::stage_grads(staged);
    cuda_.set_stage_grads(staged);
  }
  void backward(const BucketReady& ready) override {
    cuda_.backward_device(ready);
    if (!staged_grads_) mark_stale(kGrads);
  }
  void update(float lr) override {
    cuda_.device().sgd_step(lr, host_sgd_.options());
    mark_stale(kParams | kVelocity);
  }
  void update_range(float, int64_t, int64_t) override {
    throw std::logic_error("a device state updates all of its weights at once");
  }
  void end_ranges() override {}

  float* device_data(unsigned part) override {
    cuda::DeviceBuffers& d = cuda_.device();
    switch (part) {
      case kParams:
        return d.params();
      case kGrads:
        return d.grads();
      case kBuffers:
        return d.buffers();
      case kVelocity:
        return d.velocity();
      default:
        throw std::invalid_argument("device_data: one part at a time");
    }
  }
  void* device_stream() override { return cuda_.device().compute(); }

  // Bucket by bucket on the copy stream, behind what the compute stream has enqueued (the
  // update), each handed over as soon as it has landed.
  void download_buckets(unsigned part, float* host, const std::vector<Bucket>& buckets,
                        const std::function<void(int)>& landed) override {
    cuda::DeviceBuffers& d = cuda_.device();
    const float* dev = device_data(part);
    while (landed_.size() < buckets.size()) {
      cudaEvent_t e = nullptr;
      GG_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      landed_.push_back(e);
    }
    GG_CUDA_CHECK(cudaEventRecord(updated_, d.compute()));
    GG_CUDA_CHECK(cudaStreamWaitEvent(d.copy(), updated_, 0));
    for (size_t b = 0; b < buckets.size(); ++b) {
      const Bucket& k = buckets[b];
      GG_CUDA_CHECK(cudaMemcpyAsync(host + k.begin, dev + k.begin,
                                    static_cast<size_t>(k.size()) * sizeof(float),
                                    cudaMemcpyDeviceToHost, d.copy()));
      GG_CUDA_CHECK(cudaEventRecord(landed_[b], d.copy()));
    }
    for (size_t b = 0; b < buckets.size(); ++b) {
      GG_CUDA_CHECK(cudaEventSynchronize(landed_[b]));
      landed(static_cast<int>(b));
    }
    if (part == kVelocity) host_sgd_.set_started(d.sgd_started());
  }

 protected:
  void download(unsigned parts) override {
    cuda::DeviceBuffers& d = cuda_.device();
    if (parts & kParams) d.download_params(store_.params.data());
    if (parts & kGrads) d.download_grads(store_.grads.data());
    if (parts & kBuffers) d.download_buffers(store_.buffers.data());
    if (parts & kVelocity) {
      d.download_velocity(host_sgd_.velocity().data());
      host_sgd_.set_started(d.sgd_started());
    }
  }
  void upload(unsigned parts) override {
    cuda::DeviceBuffers& d = cuda_.device();
    if (parts & kParams) d.upload_params(store_.params.data());
    if (parts & kGrads) d.upload_grads();
    if (parts & kBuffers) d.upload_buffers(store_.buffers.data());
    if (parts & kVelocity) {
      d.upload_velocity(host_sgd_.velocity().data());
      d.set_sgd_started(host_sgd_.started());
    }
  }

 private:
  void pin(float* p, int64_t n) {
    if (n <= 0) return;
    if (cudaHostRegister(p, static_cast<size_t>(n) * sizeof(float), cudaHostRegisterDefault) ==
        cudaSuccess)
      pinned_.push_back(p);
    else
      (void)cudaGetLastError();  // already pinned, or not allowed: the copies stay synchronous
  }

  CudaExecutor& cuda_;
  int64_t steps_ = 0;
  std::vector<float*> pinned_;
  std::vector<cudaEvent_t> landed_;  // per bucket
  cudaEvent_t updated_ = nullptr;
};

}  // namespace

std::unique_ptr<TrainState> make_device_state(Executor& exec, ParamStore& store, Sgd& sgd) {
  auto* cuda = dynamic_cast<CudaExecutor*>(&exec);
  if (!cuda) throw std::invalid_argument("a device-resident state needs a CUDA executor");
  return std::make_unique<DeviceState>(*cuda, store, sgd);
}

}  // namespace gg::kernels
