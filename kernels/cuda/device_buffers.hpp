// The GPU copies of a network's flat buffers (parameters, gradients, batch-norm statistics, SGD
// velocity), laid out exactly as the host ParamStore, so a gradient bucket is the same range on
// both sides; and the staging of buckets between them on a side stream:
//
//   1. backward, on the compute stream, finishes bucket b and calls on_bucket_ready(b): an event
//      is recorded there, the copy stream waits on it and copies the range device -> host (page-
//      locked), then records "b is on the host". The call returns at once; compute goes on.
//   2. wait_bucket_host(b) blocks the calling thread until that copy is done (an event wait, not
//      a device-wide sync); the gossip engine then exchanges and mixes the host range.
//   3. upload_bucket(b) copies the mixed range back on the copy stream; the compute stream is
//      made to wait for it, so an update enqueued afterwards sees it.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "kernels/graph.hpp"
#include "kernels/optimizer.hpp"

namespace gg::kernels::cuda {

// A device allocation of `n` elements of T, freed on destruction.
template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  explicit DeviceArray(int64_t n);
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  DeviceArray(DeviceArray&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr, o.n_ = 0; }
  DeviceArray& operator=(DeviceArray&& o) noexcept;
  ~DeviceArray();
  T* get() const { return p_; }
  int64_t size() const { return n_; }

 private:
  T* p_ = nullptr;
  int64_t n_ = 0;
};

class DeviceBuffers {
 public:
  // host_grads: the host gradient buffer the gossip engine reads (ParamStore::grads, possibly a
  // shared-memory window). It is page-locked in place when CUDA allows it; otherwise buckets go
  // through a page-locked staging buffer and a host copy.
  DeviceBuffers(int64_t params, int64_t buffers, std::vector<Bucket> buckets, float* host_grads,
                cudaStream_t compute);
  ~DeviceBuffers();
  DeviceBuffers(const DeviceBuffers&) = delete;
  DeviceBuffers& operator=(const DeviceBuffers&) = delete;

  float* params() const { return params_.get(); }
  float* grads() const { return grads_.get(); }
  float* buffers() const { return buffers_.get(); }
  float* velocity() const { return velocity_.get(); }
  int64_t param_count() const { return params_.size(); }
  const std::vector<Bucket>& buckets() const { return buckets_; }

  // The staging hooks (see the top of this file).
  void on_bucket_ready(int b);
  void wait_bucket_host(int b);
  void upload_bucket(int b);
  void upload_grads();  // every bucket, e.g. after an allreduce of the whole host buffer

  // Whole-buffer copies on the compute stream; the download ones wait for their copy.
  void upload_params(const float* host);
  void download_params(float* host);
  void upload_buffers(const float* host);
  void download_buffers(float* host);
  void upload_velocity(const float* host);
  void download_velocity(float* host);
  void download_grads(float* host);

  // SGD with momentum on the device (kernels::Sgd's update), on the compute stream.
  void sgd_step(float lr, const SgdOptions& o);
  bool sgd_started() const { return sgd_started_; }
  void set_sgd_started(bool s) { sgd_started_ = s; }

  cudaStream_t compute() const { return compute_; }
  cudaStream_t copy() const { return copy_; }
  bool host_grads_pinned() const { return registered_ || already_pinned_; }

 private:
  float* host_bucket(int b) const;

  DeviceArray<float> params_, grads_, buffers_, velocity_;
  std::vector<Bucket> buckets_;
  float* host_grads_;
  float* staging_ = nullptr;  // page-locked, when host_grads_ could not be
  bool registered_ = false;
  bool already_pinned_ = false;
  cudaStream_t compute_;
  cudaStream_t copy_ = nullptr;
  std::vector<cudaEvent_t> done_, on_host_, uploaded_;
  bool sgd_started_ = false;
};

}  // namespace gg::kernels::cuda
