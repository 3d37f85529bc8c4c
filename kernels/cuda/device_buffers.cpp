#include "kernels/cuda/device_buffers.hpp"

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/cuda_kernels.hpp"

namespace gg::kernels::cuda {

template <typename T>
DeviceArray<T>::DeviceArray(int64_t n) : n_(n) {
  if (n <= 0) return;
  void* p = nullptr;
  const size_t bytes = static_cast<size_t>(n) * sizeof(T);
  if (cudaMalloc(&p, bytes) != cudaSuccess) {
    (void)cudaGetLastError();
    size_t free = 0, total = 0;
    (void)cudaMemGetInfo(&free, &total);
    throw std::runtime_error("CUDA backend: out of device memory: " + std::to_string(bytes >> 20) +
                             " MiB asked for, " + std::to_string(free >> 20) + " of " +
                             std::to_string(total >> 20) +
                             " MiB free (a smaller train.batch, or fewer ranks on this GPU)");
  }
  p_ = static_cast<T*>(p);
}

template <typename T>
DeviceArray<T>& DeviceArray<T>::operator=(DeviceArray&& o) noexcept {
  if (this != &o) {
    if (p_) cudaFree(p_);
    p_ = o.p_;
    n_ = o.n_;
    o.p_ = nullptr;
    o.n_ = 0;
  }
  return *this;
}

template <typename T>
DeviceArray<T>::~DeviceArray() {
  if (p_) cudaFree(p_);  // no throwing from a destructor; a failed free leaks at worst
}

template class DeviceArray<float>;
template class DeviceArray<uint16_t>;
template class DeviceArray<int32_t>;
template class DeviceArray<unsigned char>;

DeviceBuffers::DeviceBuffers(int64_t params, int64_t buffers, std::vector<Bucket> buckets,
                             float* host_grads, cudaStream_t compute)
    : params_(params),
      grads_(params),
      buffers_(buffers),
      velocity_(params),
      buckets_(std::move(buckets)),
      host_grads_(host_grads),
      compute_(compute) {
  const size_t bytes = static_cast<size_t>(params) * sizeof(float);
  if (buffers > 0)
    GG_CUDA_CHECK(cudaMemsetAsync(buffers_.get(), 0, buffers * sizeof(float), compute_));
  if (params > 0) {
    GG_CUDA_CHECK(cudaMemsetAsync(params_.get(), 0, bytes, compute_));
    GG_CUDA_CHECK(cudaMemsetAsync(grads_.get(), 0, bytes, compute_));
    GG_CUDA_CHECK(cudaMemsetAsync(velocity_.get(), 0, bytes, compute_));
  }
  GG_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking));
  // Page-lock the host gradients where they are, so the bucket copies are truly asynchronous.
  if (params > 0 && host_grads_) {
    const cudaError_t e = cudaHostRegister(host_grads_, bytes, cudaHostRegisterDefault);
    if (e == cudaSuccess) {
      registered_ = true;
    } else {
      (void)cudaGetLastError();  // clear the sticky-free error and fall back
      already_pinned_ = e == cudaErrorHostMemoryAlreadyRegistered;
      if (!already_pinned_)
        GG_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&staging_), bytes));
    }
  }
  for (auto* events : {&done_, &on_host_, &uploaded_}) {
    events->resize(buckets_.size(), nullptr);
    for (cudaEvent_t& e : *events)
      GG_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
}

DeviceBuffers::~DeviceBuffers() {
  if (copy_) cudaStreamSynchronize(copy_);
  for (auto* events : {&done_, &on_host_, &uploaded_})
    for (cudaEvent_t e : *events)
      if (e) cudaEventDestroy(e);
  if (copy_) cudaStreamDestroy(copy_);
  if (registered_) cudaHostUnregister(host_grads_);
  if (staging_) cudaFreeHost(staging_);
}

float* DeviceBuffers::host_bucket(int b) const {
  return (staging_ ? staging_ : host_grads_) + buckets_.at(b).begin;
}

void DeviceBuffers::on_bucket_ready(int b) {
  const Bucket& k = buckets_.at(b);
  GG_CUDA_CHECK(cudaEventRecord(done_[b], compute_));
  GG_CUDA_CHECK(cudaStreamWaitEvent(copy_, done_[b], 0));
  GG_CUDA_CHECK(cudaMemcpyAsync(host_bucket(b), grads_.get() + k.begin, k.size() * sizeof(float),
                                cudaMemcpyDeviceToHost, copy_));
  GG_CUDA_CHECK(cudaEventRecord(on_host_[b], copy_));
}

void DeviceBuffers::wait_bucket_host(int b) {
  GG_CUDA_CHECK(cudaEventSynchronize(on_host_.at(b)));
  if (staging_) {
    const Bucket& k = buckets_[b];
    std::memcpy(host_grads_ + k.begin, staging_ + k.begin, k.size() * sizeof(float));
  }
}

void DeviceBuffers::upload_bucket(int b) {
  const Bucket& k = buckets_.at(b);
  if (staging_) {
    // The staging range may still be the source of an earlier upload on the copy stream.
    GG_CUDA_CHECK(cudaStreamSynchronize(copy_));
    std::memcpy(staging_ + k.begin, host_grads_ + k.begin, k.size() * sizeof(float));
  }
  // The device range may still be read by work queued on the compute stream (the last update,
  // the memset at construction): the copy stream is non-blocking, so it waits for that first.
  GG_CUDA_CHECK(cudaEventRecord(done_[b], compute_));
  GG_CUDA_CHECK(cudaStreamWaitEvent(copy_, done_[b], 0));
  GG_CUDA_CHECK(cudaMemcpyAsync(grads_.get() + k.begin, host_bucket(b), k.size() * sizeof(float),
                                cudaMemcpyHostToDevice, copy_));
  GG_CUDA_CHECK(cudaEventRecord(uploaded_[b], copy_));
  GG_CUDA_CHECK(cudaStreamWaitEvent(compute_, uploaded_[b], 0));
}

void DeviceBuffers::upload_grads() {
  for (size_t b = 0; b < buckets_.size(); ++b) upload_bucket(static_cast<int>(b));
}

namespace {
void copy_in(float* dev, const float* host, int64_t n, cudaStream_t s) {
  if (n > 0)
    GG_CUDA_CHECK(cudaMemcpyAsync(dev, host, n * sizeof(float), cudaMemcpyHostToDevice, s));
}
void copy_out(float* host, const float* dev, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  GG_CUDA_CHECK(cudaMemcpyAsync(host, dev, n * sizeof(float), cudaMemcpyDeviceToHost, s));
  GG_CUDA_CHECK(cudaStreamSynchronize(s));
}
}  // namespace

void DeviceBuffers::upload_params(const float* host) {
  copy_in(params_.get(), host, params_.size(), compute_);
}
void DeviceBuffers::download_params(float* host) {
  copy_out(host, params_.get(), params_.size(), compute_);
}
void DeviceBuffers::upload_buffers(const float* host) {
  copy_in(buffers_.get(), host, buffers_.size(), compute_);
}
void DeviceBuffers::download_buffers(float* host) {
  copy_out(host, buffers_.get(), buffers_.size(), compute_);
}
void DeviceBuffers::upload_velocity(const float* host) {
  copy_in(velocity_.get(), host, velocity_.size(), compute_);
}
void DeviceBuffers::download_velocity(float* host) {
  copy_out(host, velocity_.get(), velocity_.size(), compute_);
}

void DeviceBuffers::download_grads(float* host) {
  copy_out(host, grads_.get(), grads_.size(), compute_);
}

void DeviceBuffers::sgd_step(float lr, const SgdOptions& o) {
  sgd_update(params_.get(), velocity_.get(), grads_.get(), params_.size(), lr, o.momentum,
             o.weight_decay, o.nesterov, !sgd_started_, compute_);
  sgd_started_ = true;
}

}  // namespace gg::kernels::cuda
