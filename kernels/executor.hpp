// The backend seam: a Graph compiled once for one backend and one batch size, run every step.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <new>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kernels/graph.hpp"
#include "kernels/param_layout.hpp"

namespace gg::kernels {

enum class Backend { Reference, OneDnn, Cuda };
// The names users write, one table for each enum (train.backend's and train.precision's choices).
inline constexpr std::pair<Backend, std::string_view> kBackendNames[] = {
    {Backend::Reference, "reference"}, {Backend::OneDnn, "onednn"}, {Backend::Cuda, "cuda"}};
constexpr std::span<const std::pair<Backend, std::string_view>> enum_names(Backend) {
  return kBackendNames;
}
// "reference" | "onednn" | "cuda"; throws std::invalid_argument otherwise, and for "cuda" in a
// build without the CUDA backend.
Backend parse_backend(const std::string& name);
const char* backend_name(Backend b);
// Whether this build has the CUDA backend (GG_HAVE_CUDA).
bool cuda_built();
// One rank per GPU: for the CUDA backend, makes device (local_rank mod device count) current;
// throws a one-line std::runtime_error when no device is present. Nothing for CPU backends.
void bind_device(Backend b, int local_rank);

// What activations and convolution / fully connected arithmetic run in. Parameters, gradients,
// batch-norm statistics and logits stay fp32 either way (bf16 keeps fp32 master weights).
enum class Precision { Fp32, Bf16 };
inline constexpr std::pair<Precision, std::string_view> kPrecisionNames[] = {
    {Precision::Fp32, "fp32"}, {Precision::Bf16, "bf16"}};
constexpr std::span<const std::pair<Precision, std::string_view>> enum_names(Precision) {
  return kPrecisionNames;
}
Precision parse_precision(const std::string& name);  // "fp32" | "bf16"; throws otherwise
const char* precision_name(Precision p);
// Whether oneDNN runs bf16 natively here (AVX512_BF16 or AMX): bf16 is refused elsewhere.
bool bf16_supported();

// Memory aligned to a cache line (64 bytes): the CPU kernels read blocked weights in place with
// aligned vector loads.
template <class T>
struct CacheAligned {
  using value_type = T;
  static constexpr std::align_val_t kAlign{64};
  CacheAligned() = default;
  template <class U>
  CacheAligned(const CacheAligned<U>&) {}
  T* allocate(size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), kAlign)); }
  void deallocate(T* p, size_t) { ::operator delete(p, kAlign); }
  friend bool operator==(const CacheAligned&, const CacheAligned&) { return true; }
  friend bool operator!=(const CacheAligned&, const CacheAligned&) { return false; }
};

// A flat float array that owns its (cache-line aligned) memory or lives in memory someone else
// owns (the gradient buffer in a node-shared window, which the partner on this node reads and
// writes in place).
class FlatBuffer {
 public:
  explicit FlatBuffer(int64_t n) : own_(n, 0.f), data_(own_.data()), size_(n) {}
  FlatBuffer(const FlatBuffer&) = delete;  // executors hold pointers into it
  // Copy the values in (same size only: the memory stays where it is, and pointers into it stay
  // valid); std::invalid_argument for another size.
  FlatBuffer& operator=(const FlatBuffer& b) { return assign(b.begin(), b.size()); }
  FlatBuffer& operator=(const std::vector<float>& v) {
    return assign(v.data(), static_cast<int64_t>(v.size()));
  }
  // Moves the contents into `memory` (at least size() floats, outliving this object) and uses it
  // from now on. Pointers taken before are stale.
  void adopt(float* memory);
  // Drops the contents and owns `n` zeros from now on (a network rebuilt at another size).
  void reallocate(int64_t n);
  bool external() const { return own_.empty() && size_ > 0; }

  float* data() { return data_; }
  const float* data() const { return data_; }
  int64_t size() const { return size_; }
  float* begin() { return data_; }
  float* end() { return data_ + size_; }
  const float* begin() const { return data_; }
  const float* end() const { return data_ + size_; }
  float& operator[](int64_t i) { return data_[i]; }
  float operator[](int64_t i) const { return data_[i]; }
  operator std::vector<float>() const { return {begin(), end()}; }  // a copy
  friend bool operator==(const FlatBuffer& a, const std::vector<float>& b) {
    return std::equal(a.begin(), a.end(), b.begin(), b.end());
  }

 private:
  FlatBuffer& assign(const float* v, int64_t n);

  std::vector<float, CacheAligned<float>> own_;
  float* data_;
  int64_t size_;
};

// The flat buffers every executor of a network views: parameters, their gradients (same layout)
// and batch-norm running statistics. Allocated once; never resized while executors exist.
struct ParamStore {
  explicit ParamStore(const Graph& g)
      : params(g.param_count()), grads(g.param_count()), buffers(g.buffer_count()) {}
  FlatBuffer params;
  FlatBuffer grads;
  FlatBuffer buffers;  // a FlatBuffer too: assigning to it copies in place (executors keep
                       // pointers into the running statistics)
  // How params and grads are laid out (plain unless Net::use_native_layout() chose otherwise);
  // only the oneDNN backend reads a layout that is not plain.
  ParamLayout layout;
};

// Fired during backward with the index of a bucket whose gradients are final.
using BucketReady = std::function<void(int bucket)>;

class Executor {
 public:
  virtual ~Executor() = default;
  int64_t batch() const { return batch_; }

  // x: batch x input dims, plain NCHW floats. Returns the logits, batch x classes, row-major;
  // valid until the next forward. In training mode batch norm uses batch statistics and updates
  // the running statistics in the ParamStore.
  virtual const float* forward(const float* x, bool train) = 0;

  // dlogits: batch x classes, the gradient of the loss w.r.t. the logits of the last forward
  // (which must have been a training forward). Overwrites ParamStore::grads and calls ready(b)
  // for every bucket as soon as all of its gradients are written, in bucket order.
  virtual void backward(const float* dlogits, const BucketReady& ready) = 0;

  // Dropout masks are a pure function of (seed, node, step, element), where the step counts this
  // executor's training forwards from 0. Setting it (to resume a run, or to repeat a forward with
  // the same masks) makes the next training forward use `step`; later ones count on from there.
  // Called after each node's forward or backward work with when it began and ended (per-layer
  // timelines). Backends that do not time layers ignore it.
  using LayerTrace =
      std::function<void(int node, bool backward, std::chrono::steady_clock::time_point begin,
                         std::chrono::steady_clock::time_point end)>;
  void set_layer_trace(LayerTrace t) { trace_ = std::move(t); }
  // Called in forward, for every bucket, before the first layer that reads the bucket's
  // parameters; nothing of bucket b is read before gate(b) returns, so a weight exchange may
  // finish behind the layers before (gossip.pipeline_weights). Backends that read every weight
  // up front call it for every bucket first.
  using BucketGate = std::function<void(int bucket)>;
  void set_bucket_gate(BucketGate g) { gate_ = std::move(g); }

  uint64_t dropout_step() const { return dropout_step_; }
  void set_dropout_step(uint64_t step) { dropout_step_ = step; }

 protected:
  explicit Executor(int64_t batch) : batch_(batch) {}
  int64_t batch_;
  uint64_t dropout_step_ = 0;  // backends advance it after every training forward
  LayerTrace trace_;
  BucketGate gate_;
};

// The parameter layout the backend's kernels read without reorders (kernels/param_layout.hpp):
// for oneDNN, convolution weights in 16 x 16 blocks on AVX-512 CPUs and 8 x 8 on AVX2 ones;
// plain otherwise.
ParamLayout native_param_layout(const Graph& g, Backend backend);

// Builds every primitive and buffer up front; forward/backward do not allocate.
// Bf16 needs the CUDA backend, or the oneDNN backend and bf16_supported(); std::invalid_argument
// otherwise. The CUDA backend throws std::runtime_error when no device is present.
// `deterministic`: the CUDA backend chooses its algorithms so that every run computes the same
// bits (CudaOptions::deterministic); the CPU backends always do.
std::unique_ptr<Executor> compile(const Graph& g, Backend backend, int64_t batch, ParamStore& store,
                                  const std::vector<Bucket>& buckets,
                                  Precision precision = Precision::Fp32,
                                  bool deterministic = false);

// For each position of a forward `order` (node ids), the buckets whose parameters are first read
// there (every bucket exactly once): where a backend calls its bucket gate.
std::vector<std::vector<int>> bucket_first_use(const Graph& g, const std::vector<Bucket>& buckets,
                                               const std::vector<int>& order);
// For each backward position, the buckets completed there. `order` lists the nodes in the order
// backward visits them; the result has one entry per element of `order`.
std::vector<std::vector<int>> bucket_completion(const Graph& g, const std::vector<Bucket>& buckets,
                                                const std::vector<int>& order);

}  // namespace gg::kernels
