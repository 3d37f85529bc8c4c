#include "kernels/cuda/cuda_executor.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cuda/conv_stats.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/device_buffers.hpp"
#include "kernels/cuda/fusion_plan.hpp"

namespace gg::kernels {

int cuda_device_count(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    if (why) *why = cudaGetErrorString(e);
    return 0;
  }
  if (n == 0 && why) *why = "cudaGetDeviceCount reports 0 devices";
  return n;
}

namespace {
[[noreturn]] void no_device(const std::string& why) {
  throw std::runtime_error("CUDA backend: no CUDA device is present (" + why + ")");
}
}  // namespace

void select_cuda_device(int local_rank) {
  std::string why;
  const int n = cuda_device_count(&why);
  if (n == 0) no_device(why);
  GG_CUDA_CHECK(cudaSetDevice(std::max(0, local_rank) % n));
}

std::string cuda_describe() {
  int dev = 0, rt = 0, drv = 0;
  GG_CUDA_CHECK(cudaGetDevice(&dev));
  cudaDeviceProp p{};
  GG_CUDA_CHECK(cudaGetDeviceProperties(&p, dev));
  GG_CUDA_CHECK(cudaRuntimeGetVersion(&rt));
  GG_CUDA_CHECK(cudaDriverGetVersion(&drv));
  int cublas = 0;
  GG_CUBLAS_CHECK(cublasGetProperty(MAJOR_VERSION, &cublas));
  std::string s = p.name;
  s += " (sm_" + std::to_string(p.major * 10 + p.minor) + ", ";
  s += std::to_string(p.totalGlobalMem >> 20) + " MiB), CUDA runtime " + std::to_string(rt);
  s += ", driver " + std::to_string(drv) + ", cuDNN " + std::to_string(cudnnGetVersion());
  s += ", cuBLAS " + std::to_string(cublas);
  return s;
}

namespace {

using cuda::DeviceArray;
using cuda::DType;

int to_int(int64_t v, const char* what) {
  if (v < 0 || v > std::numeric_limits<int>::max())
    throw std::invalid_argument(std::string("CUDA backend: ") + what + " exceeds the int range");
  return static_cast<int>(v);
}

// cuDNN descriptors as RAII owners: one template over the type's create and destroy calls.
template <typename T, cudnnStatus_t (*Create)(T*), cudnnStatus_t (*Destroy)(T)>
struct CudnnDesc {
  T d = nullptr;
  CudnnDesc() { GG_CUDNN_CHECK(Create(&d)); }
  ~CudnnDesc() { Destroy(d); }
  CudnnDesc(const CudnnDesc&) = delete;
  CudnnDesc& operator=(const CudnnDesc&) = delete;
};
using TensorDesc =
    CudnnDesc<cudnnTensorDescriptor_t, cudnnCreateTensorDescriptor, cudnnDestroyTensorDescriptor>;
using FilterDesc =
    CudnnDesc<cudnnFilterDescriptor_t, cudnnCreateFilterDescriptor, cudnnDestroyFilterDescriptor>;
using ConvDesc = CudnnDesc<cudnnConvolutionDescriptor_t, cudnnCreateConvolutionDescriptor,
                           cudnnDestroyConvolutionDescriptor>;

Chw chw(const Dims& d) { return kernels::chw(d, "CUDA backend"); }

// One node's output on the device, its gradient, and what its backward keeps from forward.
struct Value {
  Chw s;
  int64_t elems = 0;  // batch * per-sample size
  DeviceArray<unsigned char> y, dy;
  int consumers = 0;
  bool zero_dy = false;  // nothing writes its gradient: zeroed before backward
  // Batch norm: the statistics the last forward normalised with.
  DeviceArray<float> mean, inv_std;
  DeviceArray<int32_t> argmax;  // max pool
  DeviceArray<float> denom;     // LRN
};

struct Conv {
  TensorDesc x, y;
  FilterDesc w;
  ConvDesc conv;
  cudnnConvolutionFwdAlgo_t fwd{};
  cudnnConvolutionBwdDataAlgo_t bwd_data{};
  cudnnConvolutionBwdFilterAlgo_t bwd_filter{};
  cudnnMathType_t fwd_math{}, data_math{}, filter_math{};
  bool backward_ready = false;
};

// GG_CUDA_PROFILE=1 in the environment: CUDA events around every node's forward and backward,
// and at the executor's end one table on stderr of the milliseconds per training step by kind of
// layer. For finding where a step goes (the events cost a little), not for the speed figures.
class OpProfile {
 public:
  explicit OpProfile(size_t nodes) : fwd_(2 * nodes), bwd_(2 * nodes) {
    for (auto* events : {&fwd_, &bwd_})
      for (cudaEvent_t& e : *events) GG_CUDA_CHECK(cudaEventCreate(&e));
  }
  ~OpProfile() {
    for (auto* events : {&fwd_, &bwd_})
      for (cudaEvent_t e : *events) cudaEventDestroy(e);
  }
  static bool wanted() {
    const char* v = std::getenv("GG_CUDA_PROFILE");
    return v && std::string(v) == "1";
  }
  void mark(bool backward, int id, bool end, cudaStream_t s) {
    auto& events = backward ? bwd_ : fwd_;
    GG_CUDA_CHECK(cudaEventRecord(events[2 * id + (end ? 1 : 0)], s));
    if (end) (backward ? pending_bwd_ : pending_fwd_).push_back(id);
  }
  // Adds the timed nodes' milliseconds (waits for their events).
  void collect(const Graph& g) {
    for (bool backward : {false, true}) {
      auto& events = backward ? bwd_ : fwd_;
      auto& pending = backward ? pending_bwd_ : pending_fwd_;
      for (const int id : pending) {
        float ms = 0;
        GG_CUDA_CHECK(cudaEventSynchronize(events[2 * id + 1]));
        GG_CUDA_CHECK(cudaEventElapsedTime(&ms, events[2 * id], events[2 * id + 1]));
        const auto label = labels_.find(id);
        ms_[std::string(backward ? "backward " : "forward ") +
            (label != labels_.end() ? label->second : op_name(g.nodes()[id].op))] += ms;
      }
      if (backward && !pending.empty()) ++steps_;
      pending.clear();
    }
  }
  // Names node id's row (a fused group's, under its last node).
  void label(int id, std::string name) { labels_[id] = std::move(name); }
  void print(const char* what) const {
    if (steps_ == 0) return;
    double total = 0;
    for (const auto& [k, v] : ms_) total += v;
    std::vector<std::pair<double, std::string>> rows;
    for (const auto& [k, v] : ms_) rows.emplace_back(v, k);
    std::sort(rows.rbegin(), rows.rend());
    std::fprintf(stderr, "GG_CUDA_PROFILE %s: %d training steps, %.2f ms per step in layers\n",
                 what, steps_, total / steps_);
    for (const auto& [v, k] : rows)
      std::fprintf(stderr, "GG_CUDA_PROFILE   %-26s %9.3f ms  %5.1f%%\n", k.c_str(), v / steps_,
                   100.0 * v / total);
  }

 private:
  std::vector<cudaEvent_t> fwd_, bwd_;
  std::vector<int> pending_fwd_, pending_bwd_;
  std::map<std::string, double> ms_;
  std::map<int, std::string> labels_;
  int steps_ = 0;
};

class CudaExecutorImpl final : public CudaExecutor {
 public:
  CudaExecutorImpl(const Graph& g, int64_t batch, ParamStore& store,
                   const std::vector<Bucket>& buckets, Precision precision, CudaOptions o)
      : CudaExecutor(batch),
        g_(g),
        store_(store),
        opt_(o),
        act_(precision == Precision::Bf16 ? DType::BF16 : DType::F32),
        nhwc_(o.nhwc) {
    if (nhwc_) check_nhwc(g);
    GG_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    GG_CUDNN_CHECK(cudnnCreate(&cudnn_));
    GG_CUDNN_CHECK(cudnnSetStream(cudnn_, stream_));
    GG_CUBLAS_CHECK(cublasCreate(&cublas_));
    GG_CUBLAS_CHECK(cublasSetStream(cublas_, stream_));
    GG_CUBLAS_CHECK(cublasSetMathMode(cublas_, act_ == DType::F32 && opt_.tf32
                                                   ? CUBLAS_TF32_TENSOR_OP_MATH
                                                   : CUBLAS_DEFAULT_MATH));
    dev_ = std::make_unique<cuda::DeviceBuffers>(g.param_count(), g.buffer_count(), buckets,
                                                 store.grads.data(), stream_);
    if (shadowed()) {
      // Each convolution's and fully connected layer's weight gets a slot of its own, 256-byte
      // aligned (cuDNN's and cuBLAS's fast kernels want 16 bytes at least); so does each
      // convolution's weight gradient (a fully connected layer's goes to fp32 directly).
      shadow_at_.assign(g.params().size(), -1);
      grad_shadow_at_.assign(g.params().size(), -1);
      int64_t elems = 0, grad_elems = 0;
      for (const Node& n : g.nodes()) {
        if (n.op != Op::Conv && n.op != Op::FullyConnected) continue;
        const auto p = static_cast<size_t>(n.params.at(0));
        shadow_at_[p] = (elems + 127) / 128 * 128;
        elems = shadow_at_[p] + g.params()[p].size();
        if (n.op != Op::Conv) continue;
        grad_shadow_at_[p] = (grad_elems + 127) / 128 * 128;
        grad_elems = grad_shadow_at_[p] + g.params()[p].size();
      }
      params_lp_ = DeviceArray<unsigned char>(elems * cuda::dtype_size(act_));
      grads_lp_ = DeviceArray<unsigned char>(grad_elems * cuda::dtype_size(act_));
    }
    const auto& nodes = g.nodes();
    values_.resize(nodes.size());
    convs_.resize(nodes.size());
    conv_stats_.resize(nodes.size());
    stats_reader_.assign(nodes.size(), -1);
    bn_sums_.resize(nodes.size());
    for (const Node& n : nodes)
      for (int in : n.inputs) values_[in].consumers++;
    plan_ = cuda::plan_fusion(g, opt_.fuse);
    input_ = DeviceArray<float>(batch * numel(g.input_dims()));
    logits_ = DeviceArray<float>(batch * g.classes());
    labels_ = DeviceArray<int32_t>(batch);
    loss_ = DeviceArray<float>(2 + batch);  // the sum, the count, each row's loss
    GG_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&host_logits_),
                                 sizeof(float) * batch * g.classes()));
    GG_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&host_loss_), sizeof(float) * 2));
    GG_CUDA_CHECK(cudaEventCreateWithFlags(&loss_event_, cudaEventDisableTiming));
    GG_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&host_labels_),
                                 sizeof(int32_t) * std::max<int64_t>(1, batch)));
    dropout_step_dev_ = DeviceArray<unsigned char>(2 * sizeof(uint64_t));
    // Both step kernels run once here, so that neither is first loaded inside a graph capture
    // (which drivers before CUDA 12.3 refuse under lazy loading).
    cuda::advance_dropout_step(step_dev(), stream_);
    cuda::set_dropout_step(step_dev(), 0, stream_);
    // cuBLAS's workspace of our own, so that it allocates nothing inside a graph capture.
    cublas_ws_ = DeviceArray<unsigned char>(int64_t{32} << 20);
    GG_CUBLAS_CHECK(cublasSetWorkspace(cublas_, cublas_ws_.get(), cublas_ws_.size()));
    for (size_t id = 0; id < nodes.size(); ++id) compile_forward(static_cast<int>(id));
    for (int id = static_cast<int>(nodes.size()) - 1; id >= 0; --id) order_.push_back(id);
    fire_at_ = bucket_completion(g, buckets, order_);
    buckets_ = static_cast<int>(buckets.size());
    if (opt_.conv_stats) plan_conv_stats();
    grow_workspace();
    GG_CUDA_CHECK(cudaStreamSynchronize(stream_));
    if (OpProfile::wanted()) {
      profile_ = std::make_unique<OpProfile>(nodes.size());
      for (const cuda::BnFusion& f : plan_.groups)
        profile_->label(f.relu, f.add >= 0 ? "BatchNorm+Add+Relu" : "BatchNorm+Relu");
    }
  }

  ~CudaExecutorImpl() override {
    if (stream_) cudaStreamSynchronize(stream_);
    if (profile_) {
      try {
        profile_->collect(g_);
        profile_->print(("batch " + std::to_string(batch_)).c_str());
      } catch (const std::exception&) {
      }
      profile_.reset();
    }
    dev_.reset();
    if (host_logits_) cudaFreeHost(host_logits_);
    if (host_loss_) cudaFreeHost(host_loss_);
    if (loss_event_) cudaEventDestroy(loss_event_);
    if (host_labels_) cudaFreeHost(host_labels_);
    if (graph_) cudaGraphExecDestroy(graph_);
    if (cublas_) cublasDestroy(cublas_);
    if (cudnn_) cudnnDestroy(cudnn_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  // ---- the Executor contract ----

  const float* forward(const float* x, bool train) override {
    if (!resident_) {
      // Every weight goes up at once: every bucket's gate first, in the order forward reads them.
      if (gate_)
        for (int b = buckets_ - 1; b >= 0; --b) gate_(b);
      dev_->upload_params(store_.params.data());
      dev_->upload_buffers(store_.buffers.data());
    }
    upload_input(x);
    forward_device(train);
    GG_CUDA_CHECK(cudaMemcpyAsync(host_logits_, logits_.get(), sizeof(float) * logits_.size(),
                                  cudaMemcpyDeviceToHost, stream_));
    if (!resident_ && train) dev_->download_buffers(store_.buffers.data());
    GG_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return host_logits_;
  }

  void backward(const float* dlogits, const BucketReady& ready) override {
    if (!trained_) throw std::logic_error("backward needs a training forward first");
    GG_CUDA_CHECK(cudaMemcpyAsync(logits_.get(), dlogits, sizeof(float) * logits_.size(),
                                  cudaMemcpyHostToDevice, stream_));
    seed_output_gradient();
    backward_device(ready);
    if (resident_) synchronize();
  }

  // ---- the CUDA extras ----

  void set_resident(bool r) override {
    synchronize();
    resident_ = r;
  }
  bool resident() const override { return resident_; }
  cuda::DeviceBuffers& device() override { return *dev_; }
  float* device_input() override { return input_.get(); }

  void forward_device(bool train) override {
    trained_ = false;
    if (train) prepare_backward();
    // The dropout masks' step, in device memory: a replayed graph advances it itself.
    if (train && capturing_)
      cuda::advance_dropout_step(step_dev(), stream_);
    else if (train)
      cuda::set_dropout_step(step_dev(), dropout_step_, stream_);
    if (shadowed() && g_.param_count() > 0) shadow_weights();
    if (profile_) profile_->collect(g_);
    for (size_t id = 0; id < values_.size(); ++id) {
      if (profile_) profile_->mark(false, static_cast<int>(id), false, stream_);
      forward_node(static_cast<int>(id), train);
      if (profile_) profile_->mark(false, static_cast<int>(id), true, stream_);
    }
    const Value& out = values_[g_.output()];
    cuda::cast(logits_.get(), DType::F32, out.y.get(), act_, out.elems, stream_);
    trained_ = train;
    if (train) ++dropout_step_;
  }
  uint64_t* step_dev() const { return reinterpret_cast<uint64_t*>(dropout_step_dev_.get()); }

  void loss_device(const int32_t* labels) override {
    if (!trained_) throw std::logic_error("loss_device needs a training forward first");
    // In a capture through page-locked memory, which the captured copy reads again at every
    // replay (stage_labels refills it); else from the caller's memory, read before this returns.
    const int32_t* from = labels;
    if (capturing_) {
      std::memcpy(host_labels_, labels, sizeof(int32_t) * batch_);
      from = host_labels_;
    }
    GG_CUDA_CHECK(cudaMemcpyAsync(labels_.get(), from, sizeof(int32_t) * batch_,
                                  cudaMemcpyHostToDevice, stream_));
    // The gradient overwrites the fp32 logits buffer, then seeds backward.
    cuda::softmax_xent(logits_.get(), loss_.get(), logits_.get(), labels_.get(), batch_,
                       g_.classes(), stream_);
    GG_CUDA_CHECK(cudaMemcpyAsync(host_loss_, loss_.get(), sizeof(float) * 2,
                                  cudaMemcpyDeviceToHost, stream_));
    // Outside a capture, last_loss waits for this copy alone, not for backward behind it.
    loss_copied_ = !capturing_;
    if (loss_copied_) GG_CUDA_CHECK(cudaEventRecord(loss_event_, stream_));
    seed_output_gradient();
  }

  double last_loss() override {
    if (loss_copied_)
      GG_CUDA_CHECK(cudaEventSynchronize(loss_event_));
    else
      synchronize();
    return host_loss_[1] > 0 ? host_loss_[0] / host_loss_[1] : 0.0;
  }

  void upload_input(const float* x) override {
    GG_CUDA_CHECK(cudaMemcpyAsync(input_.get(), x, sizeof(float) * input_.size(),
                                  cudaMemcpyHostToDevice, stream_));
  }

  void set_stage_grads(bool staged) override { stage_grads_ = staged; }

  void backward_device(const BucketReady& ready) override {
    if (!trained_) throw std::logic_error("backward needs a training forward first");
    if (capturing_ && ready)
      throw std::logic_error(
          "CUDA graphs: bucket callbacks (staging, host waits) cannot run inside a capture");
    for (size_t id = 1; id < values_.size(); ++id) {
      Value& v = values_[id];
      if (v.zero_dy) GG_CUDA_CHECK(cudaMemsetAsync(v.dy.get(), 0, v.dy.size(), stream_));
    }
    std::vector<int> fired;
    for (size_t pos = 0; pos < order_.size(); ++pos) {
      if (profile_) profile_->mark(true, order_[pos], false, stream_);
      backward_node(order_[pos]);
      if (profile_) profile_->mark(true, order_[pos], true, stream_);
      for (int b : fire_at_[pos]) {
        if (resident_ && !stage_grads_) {
          if (ready) ready(b);
        } else {
          dev_->on_bucket_ready(b);
          fired.push_back(b);
        }
      }
    }
    // Host-authoritative or staged: each bucket reaches ParamStore::grads while later ones still
    // compute.
    for (int b : fired) {
      dev_->wait_bucket_host(b);
      if (ready) ready(b);
    }
    if (!resident_) synchronize();
    if (!capturing_) eager_backward_ = true;
  }

  void synchronize() override { GG_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

  void capture_step(const std::function<void()>& enqueue) override {
    if (!resident_) throw std::logic_error("CUDA graphs need the resident mode");
    if (!eager_backward_ || !dev_->sgd_started())
      throw std::logic_error(
          "CUDA graphs: run one training step (backward and device().sgd_step) eagerly before "
          "capturing one");
    if (profile_)
      throw std::invalid_argument(
          "CUDA graphs: GG_CUDA_PROFILE's events wait inside the step, which a graph cannot; "
          "unset it");
    synchronize();
    // Each training forward in the graph advances the device's dropout step first; replay_step
    // sets it from the host's count before every launch.
    const uint64_t before = dropout_step_;
    capturing_ = true;
    GG_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    cudaGraph_t graph = nullptr;
    // A failed capture leaves the counters as they were and clears CUDA's sticky last error, so
    // that the next launch's check does not report it again.
    const auto abandon = [&] {
      capturing_ = false;
      dropout_step_ = before;
      trained_ = false;
      (void)cudaGetLastError();
    };
    try {
      enqueue();
    } catch (...) {
      (void)cudaStreamEndCapture(stream_, &graph);
      if (graph) cudaGraphDestroy(graph);
      abandon();
      throw;
    }
    capturing_ = false;
    // The capture advanced the host's count for training forwards that did not run: each replay
    // runs them.
    const uint64_t forwards = dropout_step_ - before;
    dropout_step_ = before;
    cudaError_t e = cudaStreamEndCapture(stream_, &graph);
    cudaGraphExec_t exec = nullptr;
    if (e == cudaSuccess) e = cudaGraphInstantiate(&exec, graph, 0);
    if (graph) cudaGraphDestroy(graph);
    if (e != cudaSuccess) {
      abandon();  // an earlier graph stays, and replays as before
      GG_CUDA_CHECK(e);
    }
    if (graph_) GG_CUDA_CHECK(cudaGraphExecDestroy(graph_));
    graph_ = exec;
    forwards_per_replay_ = forwards;
  }
  void replay_step() override {
    if (!graph_) throw std::logic_error("replay_step needs capture_step first");
    // From the host's count, which set_dropout_step may have moved since the last replay.
    cuda::set_dropout_step(step_dev(), dropout_step_ - 1, stream_);
    GG_CUDA_CHECK(cudaGraphLaunch(graph_, stream_));
    dropout_step_ += forwards_per_replay_;
    loss_copied_ = false;  // the graph's loss copy has no event of ours: last_loss waits for all
  }
  void stage_labels(const int32_t* labels) override {
    synchronize();
    std::memcpy(host_labels_, labels, sizeof(int32_t) * batch_);
  }

 private:
  // ---- compile ----

  void* alloc_act(DeviceArray<unsigned char>& a, int64_t elems) {
    a = DeviceArray<unsigned char>(elems * cuda::dtype_size(act_));
    if (a.size() > 0) GG_CUDA_CHECK(cudaMemsetAsync(a.get(), 0, a.size(), stream_));
    return a.get();
  }

  float* param(const Node& n, size_t i) const {
    return dev_->params() + g_.params()[n.params.at(i)].offset;
  }
  float* grad(const Node& n, size_t i) const {
    return dev_->grads() + g_.params()[n.params.at(i)].offset;
  }
  float* buffer(const Node& n, size_t i) const {
    return dev_->buffers() + g_.buffers()[n.buffers.at(i)].offset;
  }
  // A convolution's or fully connected layer's weight in the activations' type and layout: the
  // fp32 master, or its shadow (bf16, and convolution filters in cuDNN's NHWC layout
  // {k, r, s, c} when channels-last), and the same for its gradient.
  bool shadowed() const { return act_ == DType::BF16 || nhwc_; }
  const void* weight_act(const Node& n) const {
    const auto p = static_cast<size_t>(n.params.at(0));
    if (!shadowed()) return dev_->params() + g_.params()[p].offset;
    return params_lp_.get() + shadow_at_[p] * cuda::dtype_size(act_);
  }
  void* weight_grad_act(const Node& n) const {
    const auto p = static_cast<size_t>(n.params.at(0));
    if (!shadowed()) return dev_->grads() + g_.params()[p].offset;
    if (grad_shadow_at_[p] < 0)
      throw std::logic_error("CUDA backend: only convolutions' weight gradients have a shadow");
    return grads_lp_.get() + grad_shadow_at_[p] * cuda::dtype_size(act_);
  }
  // The shadow from the fp32 masters: each weight cast, channels-last each filter transposed
  // {k, c, r*s} -> {k, r*s, c}.
  void shadow_weights() {
    for (const Node& n : g_.nodes()) {
      if (n.op != Op::Conv && n.op != Op::FullyConnected) continue;
      const TensorSpec& w = g_.params()[n.params[0]];
      void* to = const_cast<void*>(weight_act(n));
      if (nhwc_ && n.op == Op::Conv)
        cuda::transpose_channels(to, act_, dev_->params() + w.offset, DType::F32, w.dims[0],
                                 w.dims[1], w.dims[2] * w.dims[3], true, stream_);
      else
        cuda::cast(to, act_, dev_->params() + w.offset, DType::F32, w.size(), stream_);
    }
  }
  // Channels-last covers every layer but LRN, and dropout and fully connected layers over
  // feature vectors only (their masks and weights follow the channels-first order).
  static void check_nhwc(const Graph& g) {
    if (chw(g.node(g.output()).out).plane() != 1)
      throw std::invalid_argument(
          "CUDA backend: channels-last (nhwc) needs a graph whose output is a feature vector; run "
          "it channels-first");
    for (const Node& n : g.nodes()) {
      const char* why = nullptr;
      if (n.op == Op::Lrn) why = "LRN has no channels-last kernel";
      if ((n.op == Op::Dropout || n.op == Op::FullyConnected) &&
          chw(g.node(n.inputs[0]).out).plane() != 1)
        why = "it reads images, whose values it orders channels-first";
      if (why)
        throw std::invalid_argument("CUDA backend: channels-last (nhwc) cannot run layer " +
                                    n.name + ": " + why + "; run it channels-first");
    }
  }
  cudnnDataType_t cudnn_type() const {
    return act_ == DType::F32 ? CUDNN_DATA_FLOAT : CUDNN_DATA_BFLOAT16;
  }
  cudaDataType_t blas_type() const { return act_ == DType::F32 ? CUDA_R_32F : CUDA_R_16BF; }

  void compile_forward(int id) {
    const Node& n = g_.node(id);
    Value& v = values_[id];
    v.s = chw(n.out);
    v.elems = batch_ * v.s.size();
    if (n.op == Op::Input && act_ == DType::F32 && !nhwc_) {
      // The input is read where it was uploaded.
    } else if (absorbed(id)) {
      // A fused batch norm's or add's output: the fused pass never writes it.
    } else {
      alloc_act(v.y, v.elems);
    }
    switch (n.op) {
      case Op::Conv:
        return compile_conv(id, n);
      case Op::BatchNorm:
        v.mean = DeviceArray<float>(v.s.c);
        v.inv_std = DeviceArray<float>(v.s.c);
        bn_scratch_ = std::max(bn_scratch_, cuda::bn_scratch_floats(bn_shape(n)));
        return;
      case Op::MaxPool:
        v.argmax = DeviceArray<int32_t>(v.elems);
        return;
      case Op::Lrn:
        v.denom = DeviceArray<float>(v.elems);
        return;
      case Op::FullyConnected:
        to_int(batch_, "batch");
        to_int(numel(g_.node(n.inputs[0]).out), "fully connected input");
        to_int(n.fc.out_features, "fully connected output");
        return;
      default:
        return;
    }
  }

  const void* y_of(int t) const {
    if (t == 0 && act_ == DType::F32 && !nhwc_) return input_.get();
    return values_[t].y.get();
  }

  cudnnMathType_t conv_math() const {
    if (act_ == DType::BF16) return CUDNN_TENSOR_OP_MATH;
    return opt_.tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
  }
  bool strict() const { return act_ == DType::F32 && !opt_.tf32; }
  bool math_allowed(cudnnMathType_t m) const {
    // Strict fp32 refuses tensor-core candidates; otherwise whatever cuDNN proposes.
    return !strict() || (m != CUDNN_TENSOR_OP_MATH && m != CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION);
  }
  // The math type to run a chosen candidate with: strict fp32 always runs FMA_MATH, which rules
  // TF32 out whatever the candidate's label.
  cudnnMathType_t run_math(cudnnMathType_t chosen) const {
    return strict() ? CUDNN_FMA_MATH : chosen;
  }

  // The most workspace one convolution algorithm may take: a quarter of the device memory free
  // when it is chosen. Timing every candidate on what cuDNN asks for can take tens of GiB for a
  // ResNet-50 layer, and ranks sharing one GPU choose at the same time; an algorithm that needs
  // more than this is passed over for the next best.
  static size_t workspace_cap() {
    size_t free = 0, total = 0;
    GG_CUDA_CHECK(cudaMemGetInfo(&free, &total));
    return free / 4;
  }
  // Whether cuDNN's candidates are timed (else its heuristics choose alone, as deterministic runs
  // need: timing may choose otherwise from one run to the next).
  bool timed() const { return opt_.find_algorithms && !opt_.deterministic; }
  // The first usable candidate of a list cuDNN returned best-first.
  template <typename Perf>
  Perf choose(const std::vector<Perf>& perf, int count, const Node& n, const char* what,
              size_t cap) const {
    for (int i = 0; i < count; ++i)
      if (perf[i].status == CUDNN_STATUS_SUCCESS && math_allowed(perf[i].mathType) &&
          perf[i].memory <= cap &&
          (!opt_.deterministic || perf[i].determinism == CUDNN_DETERMINISTIC))
        return perf[i];
    std::string m = "CUDA backend: cuDNN offers no ";
    m += what;
    m += " algorithm for ";
    m += n.name;
    throw std::runtime_error(m);
  }
  // The workspace to time candidates with: the most any usable heuristic candidate asks for, at
  // most `cap`.
  template <typename Perf>
  size_t most_memory(const std::vector<Perf>& perf, int count, size_t cap) const {
    size_t most = 0;
    for (int i = 0; i < count; ++i)
      if (perf[i].status == CUDNN_STATUS_SUCCESS && math_allowed(perf[i].mathType))
        most = std::max(most, perf[i].memory);
    return std::min(most, cap);
  }
  void note_workspace(size_t bytes) { workspace_need_ = std::max(workspace_need_, bytes); }
  // A scratch workspace for timing candidates, or none (then cuDNN's heuristics decide alone)
  // when the device cannot spare it.
  static bool try_workspace(DeviceArray<unsigned char>& ws, size_t bytes) {
    try {
      ws = DeviceArray<unsigned char>(static_cast<int64_t>(bytes));
      return true;
    } catch (const std::runtime_error&) {
      (void)cudaGetLastError();
      return false;
    }
  }

  void compile_conv(int id, const Node& n) {
    const int in = n.inputs[0];
    const Chw xs = values_[in].s;
    const Chw ys = values_[id].s;
    convs_[id] = std::make_unique<Conv>();
    Conv& c = *convs_[id];
    const cudnnDataType_t t = cudnn_type();
    const cudnnTensorFormat_t layout = nhwc_ ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
    GG_CUDNN_CHECK(cudnnSetTensor4dDescriptor(c.x.d, layout, t, to_int(batch_, "batch"),
                                              to_int(xs.c, "channels"), to_int(xs.h, "height"),
                                              to_int(xs.w, "width")));
    GG_CUDNN_CHECK(cudnnSetTensor4dDescriptor(c.y.d, layout, t, to_int(batch_, "batch"),
                                              to_int(ys.c, "channels"), to_int(ys.h, "height"),
                                              to_int(ys.w, "width")));
    const int k = to_int(n.conv.kernel, "kernel");
    GG_CUDNN_CHECK(cudnnSetFilter4dDescriptor(c.w.d, t, layout, to_int(ys.c, "channels"),
                                              to_int(xs.c, "channels"), k, k));
    const int p = to_int(n.conv.pad, "padding"), s = to_int(n.conv.stride, "stride");
    GG_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(c.conv.d, p, p, s, s, 1, 1,
                                                   CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    GG_CUDNN_CHECK(cudnnSetConvolutionMathType(c.conv.d, conv_math()));
    int on = 0, oc = 0, oh = 0, ow = 0;
    GG_CUDNN_CHECK(
        cudnnGetConvolution2dForwardOutputDim(c.conv.d, c.x.d, c.w.d, &on, &oc, &oh, &ow));
    if (oc != ys.c || oh != ys.h || ow != ys.w)
      throw std::logic_error(n.name + ": cuDNN's output shape differs from the graph's");

    int max = 0;
    GG_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithmMaxCount(cudnn_, &max));
    std::vector<cudnnConvolutionFwdAlgoPerf_t> perf(std::max(1, max));
    int count = 0;
    GG_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(cudnn_, c.x.d, c.w.d, c.conv.d, c.y.d,
                                                          max, &count, perf.data()));
    const size_t cap = workspace_cap();
    DeviceArray<unsigned char> ws;
    if (timed() && try_workspace(ws, most_memory(perf, count, cap))) {
      GG_CUDNN_CHECK(cudnnFindConvolutionForwardAlgorithmEx(
          cudnn_, c.x.d, y_of(in), c.w.d, weight_act(n), c.conv.d, c.y.d, values_[id].y.get(), max,
          &count, perf.data(), ws.get(), static_cast<size_t>(ws.size())));
    }
    const auto chosen = choose(perf, count, n, "forward convolution", cap);
    c.fwd = chosen.algo;
    c.fwd_math = run_math(chosen.mathType);
    size_t bytes = 0;
    GG_CUDNN_CHECK(cudnnSetConvolutionMathType(c.conv.d, c.fwd_math));
    GG_CUDNN_CHECK(cudnnGetConvolutionForwardWorkspaceSize(cudnn_, c.x.d, c.w.d, c.conv.d, c.y.d,
                                                           c.fwd, &bytes));
    note_workspace(bytes);
    GG_CUDNN_CHECK(cudnnSetConvolutionMathType(c.conv.d, conv_math()));
  }

  // Backward state, made on the first training forward: an executor that only evaluates holds no
  // gradients.
  void prepare_backward() {
    if (backward_ready_) return;
    const auto& nodes = g_.nodes();
    const int output = g_.output();
    for (size_t id = 1; id < nodes.size(); ++id) {
      Value& v = values_[id];
      if (!absorbed(static_cast<int>(id))) alloc_act(v.dy, v.elems);
      v.zero_dy = v.consumers == 0 && static_cast<int>(id) != output;
    }
    for (size_t id = 0; id < nodes.size(); ++id) {
      if (nodes[id].op == Op::BatchNorm && batch_ * values_[id].s.plane() < 2)
        throw std::invalid_argument(nodes[id].name +
                                    ": training batch norm needs more than one value per channel");
      if (nodes[id].op == Op::Conv) compile_conv_backward(static_cast<int>(id), nodes[id]);
    }
    if (bn_scratch_ > 0) bn_scratch_buf_ = DeviceArray<float>(bn_scratch_);
    grow_workspace();
    backward_ready_ = true;
  }

  void compile_conv_backward(int id, const Node& n) {
    Conv& c = *convs_[id];
    const int in = n.inputs[0];
    const Value& v = values_[id];
    // Filter gradient.
    {
      int max = 0;
      GG_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(cudnn_, &max));
      std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> perf(std::max(1, max));
      int count = 0;
      GG_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
          cudnn_, c.x.d, c.y.d, c.conv.d, c.w.d, max, &count, perf.data()));
      const size_t cap = workspace_cap();
      DeviceArray<unsigned char> ws;
      if (timed() && try_workspace(ws, most_memory(perf, count, cap))) {
        GG_CUDNN_CHECK(cudnnFindConvolutionBackwardFilterAlgorithmEx(
            cudnn_, c.x.d, y_of(in), c.y.d, v.dy.get(), c.conv.d, c.w.d, weight_grad_act(n), max,
            &count, perf.data(), ws.get(), static_cast<size_t>(ws.size())));
      }
      const auto chosen = choose(perf, count, n, "filter-gradient convolution", cap);
      c.bwd_filter = chosen.algo;
      c.filter_math = run_math(chosen.mathType);
      size_t bytes = 0;
      GG_CUDNN_CHECK(cudnnSetConvolutionMathType(c.conv.d, c.filter_math));
      GG_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterWorkspaceSize(cudnn_, c.x.d, c.y.d, c.conv.d,
                                                                    c.w.d, c.bwd_filter, &bytes));
      note_workspace(bytes);
      GG_CUDNN_CHECK(cudnnSetConvolutionMathType(c.conv.d, conv_math()));
    }
    if (in == 0) return;  // no gradient w.r.t. the data
    int max = 0;
    GG_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(cudnn_, &max));
    std::vector<cudnnConvolutionBwdDataAlgoPerf_t> perf(std::max(1, max));
    int count = 0;
    GG_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(cudnn_, c.w.d, c.y.d, c.conv.d,
                                                               c.x.d, max, &count, perf.data()));
    // Timing writes the input's gradient buffer, which backward overwrites anyway.
    const size_t cap = workspace_cap();
    DeviceArray<unsigned char> ws;
    if (timed() && try_workspace(ws, most_memory(perf, count, cap))) {
      GG_CUDNN_CHECK(cudnnFindConvolutionBackwardDataAlgorithmEx(
          cudnn_, c.w.d, weight_act(n), c.y.d, v.dy.get(), c.conv.d, c.x.d, values_[in].dy.get(),
          max, &count, perf.data(), ws.get(), static_cast<size_t>(ws.size())));
    }
    const auto chosen = choose(perf, count, n, "data-gradient convolution", cap);
    c.bwd_data = chosen.algo;
    c.data_math = run_math(chosen.mathType);
    size_t bytes = 0;
    GG_CUDNN_CHECK(cudnnSetConvolutionMathType(c.conv.d, c.data_math));
    GG_CUDNN_CHECK(cudnnGetConvolutionBackwardDataWorkspaceSize(cudnn_, c.w.d, c.y.d, c.conv.d,
                                                                c.x.d, c.bwd_data, &bytes));
    note_workspace(bytes);
    GG_CUDNN_CHECK(cudnnSetConvolutionMathType(c.conv.d, conv_math()));
  }

  // One workspace for every convolution, as large as the largest chosen algorithm asks.
  void grow_workspace() {
    if (workspace_need_ <= static_cast<size_t>(workspace_.size())) return;
    GG_CUDA_CHECK(cudaStreamSynchronize(stream_));
    workspace_ = DeviceArray<unsigned char>(static_cast<int64_t>(workspace_need_));
  }

  cuda::BnShape bn_shape(const Node& n) const {
    const Chw s = chw(n.out);
    cuda::BnShape b;
    b.batch = batch_;
    b.c = s.c;
    b.plane = s.plane();
    b.eps = n.bn.eps;
    b.momentum = n.bn.momentum;
    b.nhwc = nhwc_;
    return b;
  }
  cuda::PoolShape pool_shape(const Node& n) const {
    const Chw in = values_[n.inputs[0]].s, out = chw(n.out);
    cuda::PoolShape p;
    p.planes = batch_ * out.c;
    p.c = out.c;
    p.nhwc = nhwc_;
    p.ih = in.h;
    p.iw = in.w;
    p.oh = out.h;
    p.ow = out.w;
    p.k = n.pool.kernel;
    p.stride = n.pool.stride;
    p.pad = n.pool.pad;
    return p;
  }
  cuda::LrnShape lrn_shape(const Node& n) const {
    const Chw s = chw(n.out);
    cuda::LrnShape l;
    l.batch = batch_;
    l.c = s.c;
    l.plane = s.plane();
    l.size = n.lrn.size;
    l.alpha = n.lrn.alpha;
    l.beta = n.lrn.beta;
    l.k = n.lrn.k;
    return l;
  }
  cuda::DropoutKey dropout_key(const Node& n, int id) const {
    return {n.dropout.seed, id, step_dev(), n.dropout.p};
  }

  // ---- run ----

  void seed_output_gradient() {
    // logits_ holds the fp32 gradient of the loss w.r.t. the logits.
    Value& out = values_[g_.output()];
    cuda::cast(out.dy.get(), act_, logits_.get(), DType::F32, out.elems, stream_);
  }

  void forward_node(int id, bool train) {
    const Node& n = g_.node(id);
    Value& v = values_[id];
    void* y = v.y.get();
    const void* x = n.inputs.empty() ? nullptr : y_of(n.inputs[0]);
    switch (n.op) {
      case Op::Input:
        if (nhwc_)
          cuda::transpose_channels(y, act_, input_.get(), DType::F32, batch_, v.s.c, v.s.plane(),
                                   true, stream_);
        else if (act_ != DType::F32)
          cuda::cast(y, act_, input_.get(), DType::F32, v.elems, stream_);
        return;
      case Op::Conv: {
        if (train && conv_stats_[id]) {
          const int bn = stats_reader_[id];
          float* sums = bn_sums_[bn].get();
          conv_stats_[id]->run(cudnn_, x, weight_act(n), y, sums, sums + values_[bn].s.c,
                               workspace_.get());
          return;
        }
        const Conv& c = *convs_[id];
        const float one = 1.f, zero = 0.f;
        GG_CUDNN_CHECK(cudnnSetConvolutionMathType(c.conv.d, c.fwd_math));
        GG_CUDNN_CHECK(cudnnConvolutionForward(
            cudnn_, &one, c.x.d, x, c.w.d, weight_act(n), c.conv.d, c.fwd, workspace_.get(),
            static_cast<size_t>(workspace_.size()), &zero, c.y.d, y));
        if (n.conv.bias)
          cuda::bias_add(y, param(n, 1), batch_, v.s.c, v.s.plane(), nhwc_, act_, stream_);
        return;
      }
      case Op::BatchNorm: {
        const cuda::BnShape b = bn_shape(n);
        if (train && bn_sums_[id].size() > 0)  // its convolution summed them (plan_conv_stats)
          cuda::bn_statistics_from_sums(v.mean.get(), v.inv_std.get(), buffer(n, 0), buffer(n, 1),
                                        bn_sums_[id].get(), bn_sums_[id].get() + b.c, b, stream_);
        else
          cuda::bn_statistics(v.mean.get(), v.inv_std.get(), buffer(n, 0), buffer(n, 1), x, b,
                              train, bn_scratch_buf_.get(), act_, stream_);
        if (group_of(id) < 0)  // fused: the ReLU's node applies it
          cuda::bn_apply(y, x, nullptr, false, v.mean.get(), v.inv_std.get(), param(n, 0),
                         param(n, 1), b, act_, stream_);
        return;
      }
      case Op::Relu:
        if (group_of(id) >= 0) return fused_forward(plan_.groups[group_of(id)]);
        return cuda::relu_forward(y, x, v.elems, act_, stream_);
      case Op::MaxPool:
        return cuda::max_pool_forward(y, v.argmax.get(), x, pool_shape(n), act_, stream_);
      case Op::AvgPool:
        return cuda::avg_pool_forward(y, x, pool_shape(n), act_, stream_);
      case Op::GlobalAvgPool: {
        const Chw in = values_[n.inputs[0]].s;
        return cuda::global_avg_pool_forward(y, x, batch_, in.c, in.plane(), nhwc_, act_, stream_);
      }
      case Op::FullyConnected:
        return fc_forward(n, v, x);
      case Op::Add:
        if (group_of(id) >= 0) return;  // the ReLU's node adds
        return cuda::add_forward(y, x, y_of(n.inputs[1]), v.elems, act_, stream_);
      case Op::Concat: {
        int64_t first = 0;
        for (int in : n.inputs) {
          const Chw s = values_[in].s;
          cuda::slice_to_concat(y, y_of(in), batch_, s.c, s.plane(), v.s.c, first, nhwc_, act_,
                                stream_);
          first += s.c;
        }
        return;
      }
      case Op::Dropout:
        if (train) return cuda::dropout_forward(y, x, v.elems, dropout_key(n, id), act_, stream_);
        GG_CUDA_CHECK(cudaMemcpyAsync(y, x, v.elems * cuda::dtype_size(act_),
                                      cudaMemcpyDeviceToDevice, stream_));
        return;
      case Op::Lrn:
        return cuda::lrn_forward(y, v.denom.get(), x, lrn_shape(n), act_, stream_);
    }
    throw std::logic_error("CUDA backend: unhandled op");
  }

  // ---- fusion ----

  // CudaOptions::conv_stats: each batch norm whose input is a convolution without bias that no
  // other layer reads gets its statistics from that convolution's epilogue, where cuDNN builds
  // a plan for it.
  void plan_conv_stats() {
    if (!nhwc_ || act_ != cuda::DType::BF16)
      throw std::invalid_argument(
          "CUDA backend: conv_stats (the batch-norm statistics in the convolution's epilogue) "
          "needs channels-last (nhwc) and bf16 activations");
    const auto& nodes = g_.nodes();
    for (size_t id = 0; id < nodes.size(); ++id) {
      const Node& bn = nodes[id];
      if (bn.op != Op::BatchNorm) continue;
      const int in = bn.inputs[0];
      const Node& conv = nodes[static_cast<size_t>(in)];
      if (conv.op != Op::Conv || conv.conv.bias || values_[in].consumers != 1) continue;
      const Chw xs = values_[conv.inputs[0]].s, ys = values_[in].s;
      cuda::ConvStatsShape s;
      s.n = batch_;
      s.c = xs.c;
      s.h = xs.h;
      s.w = xs.w;
      s.k = ys.c;
      s.r = s.s = conv.conv.kernel;
      s.pad_h = s.pad_w = conv.conv.pad;
      s.stride_h = s.stride_w = conv.conv.stride;
      try {
        auto fused = std::make_unique<cuda::ConvStats>(cudnn_, s);
        note_workspace(static_cast<size_t>(fused->workspace_bytes()));
        conv_stats_[static_cast<size_t>(in)] = std::move(fused);
      } catch (const std::runtime_error& e) {
        conv_stats_skipped_.push_back(conv.name + ": " + e.what());
        continue;
      }
      stats_reader_[static_cast<size_t>(in)] = static_cast<int>(id);
      bn_sums_[id] = DeviceArray<float>(2 * ys.c);
      ++conv_stats_fused_;
    }
  }
  int conv_stats_fused() const override { return conv_stats_fused_; }
  const std::vector<std::string>& conv_stats_skipped() const override {
    return conv_stats_skipped_;
  }

  // A fused group's batch norm or add, whose output and gradient are never formed.
  bool absorbed(int id) const { return plan_.absorbed(id); }
  int group_of(int id) const { return plan_.group_of[static_cast<size_t>(id)]; }

  void fused_forward(const cuda::BnFusion& f) {
    const Node& bn = g_.node(f.bn);
    const Value& b = values_[f.bn];
    cuda::bn_apply(values_[f.relu].y.get(), y_of(bn.inputs[0]), f.res >= 0 ? y_of(f.res) : nullptr,
                   true, b.mean.get(), b.inv_std.get(), param(bn, 0), param(bn, 1), bn_shape(bn),
                   act_, stream_);
  }
  void fused_backward(const cuda::BnFusion& f) {
    const Node& bn = g_.node(f.bn);
    const Value& b = values_[f.bn];
    Value& relu = values_[f.relu];
    const int x = bn.inputs[0];
    cuda::BnGrad g;
    g.dy = relu.dy.get();
    g.relu_y = relu.y.get();
    // The gated gradient goes straight into the residual's gradient when this writes it first;
    // else into the ReLU's own gradient, in place, and from there added to the residual's.
    if (f.res > 0 && !f.acc_res) {
      g.dz = values_[f.res].dy.get();
    } else {
      g.dz = relu.dy.get();
      if (f.res > 0) g.dres = values_[f.res].dy.get();
    }
    if (x != 0) {
      g.dx = values_[x].dy.get();
      g.acc_x = f.acc_x;
    }
    cuda::bn_backward(g, grad(bn, 0), grad(bn, 1), y_of(x), b.mean.get(), b.inv_std.get(),
                      param(bn, 0), bn_shape(bn), bn_scratch_buf_.get(), act_, stream_);
  }

  // Row-major y {N, out} = x {N, in} W^T + b: in cuBLAS's column-major terms y^T = W^T' x^T with
  // W stored {out, in}, i.e. op(A) = transpose of the {in, out} column-major view of W.
  void fc_forward(const Node& n, Value& v, const void* x) {
    const int in = static_cast<int>(numel(g_.node(n.inputs[0]).out));
    const int out = static_cast<int>(n.fc.out_features), nb = static_cast<int>(batch_);
    const float one = 1.f, zero = 0.f;
    GG_CUBLAS_CHECK(cublasGemmEx(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, out, nb, in, &one,
                                 weight_act(n), blas_type(), in, x, blas_type(), in, &zero,
                                 v.y.get(), blas_type(), out, gemm_compute(), CUBLAS_GEMM_DEFAULT));
    if (n.fc.bias) cuda::bias_add(v.y.get(), param(n, 1), batch_, out, 1, false, act_, stream_);
  }

  cublasComputeType_t gemm_compute() const {
    return act_ == DType::F32 && opt_.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  }

  void backward_node(int id) {
    const Node& n = g_.node(id);
    Value& v = values_[id];
    const void* dy = v.dy.get();
    const int in = n.inputs.empty() ? 0 : n.inputs[0];
    void* dx = in == 0 ? nullptr : values_[in].dy.get();
    const std::vector<bool>& accs = plan_.acc[static_cast<size_t>(id)];
    const bool acc = !accs.empty() && accs[0];
    const void* x = n.inputs.empty() ? nullptr : y_of(in);
    switch (n.op) {
      case Op::Input:
        return;
      case Op::Conv:
        return conv_backward(id, n, v, x, dx, acc);
      case Op::BatchNorm: {
        if (group_of(id) >= 0) return;  // the ReLU's node ran it
        cuda::BnGrad g;
        g.dy = dy;
        g.dx = dx;
        g.acc_x = acc;
        return cuda::bn_backward(g, grad(n, 0), grad(n, 1), x, v.mean.get(), v.inv_std.get(),
                                 param(n, 0), bn_shape(n), bn_scratch_buf_.get(), act_, stream_);
      }
      case Op::Relu:
        if (group_of(id) >= 0) return fused_backward(plan_.groups[group_of(id)]);
        if (dx) cuda::relu_backward(dx, dy, x, v.elems, act_, acc, stream_);
        return;
      case Op::MaxPool:
        if (dx) cuda::max_pool_backward(dx, dy, v.argmax.get(), pool_shape(n), act_, acc, stream_);
        return;
      case Op::AvgPool:
        if (dx) cuda::avg_pool_backward(dx, dy, pool_shape(n), act_, acc, stream_);
        return;
      case Op::GlobalAvgPool:
        if (dx) {
          const Chw s = values_[in].s;
          cuda::global_avg_pool_backward(dx, dy, batch_, s.c, s.plane(), nhwc_, act_, acc, stream_);
        }
        return;
      case Op::FullyConnected:
        return fc_backward(n, v, x, dx, acc);
      case Op::Add:
        if (group_of(id) >= 0) return;  // the ReLU's node wrote both gradients
        for (size_t i = 0; i < 2; ++i) {
          const int t = n.inputs[i];
          if (t != 0) cuda::accumulate(values_[t].dy.get(), dy, v.elems, act_, accs[i], stream_);
        }
        return;
      case Op::Concat: {
        int64_t first = 0;
        for (size_t i = 0; i < n.inputs.size(); ++i) {
          const int t = n.inputs[i];
          const Chw s = values_[t].s;
          if (t != 0)
            cuda::concat_to_slice(values_[t].dy.get(), dy, batch_, s.c, s.plane(), v.s.c, first,
                                  nhwc_, act_, accs[i], stream_);
          first += s.c;
        }
        return;
      }
      case Op::Dropout:
        if (dx) cuda::dropout_backward(dx, dy, v.elems, dropout_key(n, id), act_, acc, stream_);
        return;
      case Op::Lrn:
        if (dx) cuda::lrn_backward(dx, dy, x, v.denom.get(), lrn_shape(n), act_, acc, stream_);
        return;
    }
    throw std::logic_error("CUDA backend: unhandled op");
  }

  void conv_backward(int id, const Node& n, Value& v, const void* x, void* dx, bool acc) {
    const Conv& c = *convs_[id];
    const float one = 1.f, zero = 0.f, beta = acc ? 1.f : 0.f;
    void* ws = workspace_.get();
    const size_t ws_bytes = static_cast<size_t>(workspace_.size());
    GG_CUDNN_CHECK(cudnnSetConvolutionMathType(c.conv.d, c.filter_math));
    GG_CUDNN_CHECK(cudnnConvolutionBackwardFilter(cudnn_, &one, c.x.d, x, c.y.d, v.dy.get(),
                                                  c.conv.d, c.bwd_filter, ws, ws_bytes, &zero,
                                                  c.w.d, weight_grad_act(n)));
    if (shadowed()) {
      const TensorSpec& w = g_.params()[n.params[0]];
      if (nhwc_)
        cuda::transpose_channels(dev_->grads() + w.offset, DType::F32, weight_grad_act(n), act_,
                                 w.dims[0], w.dims[1], w.dims[2] * w.dims[3], false, stream_);
      else
        cuda::cast(dev_->grads() + w.offset, DType::F32, weight_grad_act(n), act_, w.size(),
                   stream_);
    }
    if (n.conv.bias)
      cuda::bias_grad(grad(n, 1), v.dy.get(), batch_, v.s.c, v.s.plane(), nhwc_, act_, stream_);
    if (!dx) return;
    GG_CUDNN_CHECK(cudnnSetConvolutionMathType(c.conv.d, c.data_math));
    GG_CUDNN_CHECK(cudnnConvolutionBackwardData(cudnn_, &one, c.w.d, weight_act(n), c.y.d,
                                                v.dy.get(), c.conv.d, c.bwd_data, ws, ws_bytes,
                                                &beta, c.x.d, dx));
  }

  // dW {out, in} = dy^T x and dx {N, in} = dy W, in cuBLAS's column-major terms.
  void fc_backward(const Node& n, Value& v, const void* x, void* dx, bool acc) {
    const int in = static_cast<int>(numel(g_.node(n.inputs[0]).out));
    const int out = static_cast<int>(n.fc.out_features), nb = static_cast<int>(batch_);
    const float one = 1.f, zero = 0.f, beta = acc ? 1.f : 0.f;
    // The weight gradient is fp32 whatever the inputs (cuBLAS accumulates in fp32).
    GG_CUBLAS_CHECK(cublasGemmEx(cublas_, CUBLAS_OP_N, CUBLAS_OP_T, in, out, nb, &one, x,
                                 blas_type(), in, v.dy.get(), blas_type(), out, &zero, grad(n, 0),
                                 CUDA_R_32F, in, gemm_compute(), CUBLAS_GEMM_DEFAULT));
    if (n.fc.bias) cuda::bias_grad(grad(n, 1), v.dy.get(), batch_, out, 1, false, act_, stream_);
    if (!dx) return;
    GG_CUBLAS_CHECK(cublasGemmEx(cublas_, CUBLAS_OP_N, CUBLAS_OP_N, in, nb, out, &one,
                                 weight_act(n), blas_type(), in, v.dy.get(), blas_type(), out,
                                 &beta, dx, blas_type(), in, gemm_compute(), CUBLAS_GEMM_DEFAULT));
  }

  const Graph g_;  // a copy: the caller's graph may go away first
  ParamStore& store_;
  CudaOptions opt_;
  DType act_;
  bool nhwc_;
  cudaStream_t stream_ = nullptr;
  cudnnHandle_t cudnn_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  std::unique_ptr<cuda::DeviceBuffers> dev_;
  // shadowed(): the weights of convolutions and fully connected layers at shadow_at_[param], the
  // gradients of the convolutions' ones at grad_shadow_at_[param] (elements; -1: none).
  DeviceArray<unsigned char> params_lp_, grads_lp_;
  std::vector<int64_t> shadow_at_, grad_shadow_at_;
  DeviceArray<float> input_, logits_, loss_;
  DeviceArray<int32_t> labels_;
  float* host_logits_ = nullptr;
  float* host_loss_ = nullptr;
  int32_t* host_labels_ = nullptr;  // page-locked: the labels a (captured) upload reads
  DeviceArray<unsigned char> dropout_step_dev_;  // two uint64_t: see cuda::DropoutKey
  DeviceArray<unsigned char> cublas_ws_;
  cudaGraphExec_t graph_ = nullptr;
  uint64_t forwards_per_replay_ = 0;
  bool capturing_ = false;
  bool eager_backward_ = false;  // a backward ran outside a capture (a capture needs one first)
  std::vector<Value> values_;
  std::vector<std::unique_ptr<Conv>> convs_;
  cuda::FusionPlan plan_;
  // CudaOptions::conv_stats, by node: the convolution's fused plan, the batch norm reading it
  // (by the convolution's id), and that batch norm's sums (sum, then sum of squares).
  std::vector<std::unique_ptr<cuda::ConvStats>> conv_stats_;
  std::vector<int> stats_reader_;
  std::vector<DeviceArray<float>> bn_sums_;
  std::vector<std::string> conv_stats_skipped_;
  int conv_stats_fused_ = 0;
  DeviceArray<unsigned char> workspace_;
  size_t workspace_need_ = 0;
  int64_t bn_scratch_ = 0;
  DeviceArray<float> bn_scratch_buf_;
  std::vector<int> order_;
  std::vector<std::vector<int>> fire_at_;
  int buckets_ = 0;
  bool backward_ready_ = false;
  bool trained_ = false;
  bool resident_ = false;
  bool stage_grads_ = false;
  cudaEvent_t loss_event_ = nullptr;
  bool loss_copied_ = false;  // loss_event_ marks the last loss_device's copy to the host
  std::unique_ptr<OpProfile> profile_;
};

}  // namespace

std::unique_ptr<CudaExecutor> make_cuda_executor(const Graph& g, int64_t batch, ParamStore& store,
                                                 const std::vector<Bucket>& buckets,
                                                 Precision precision, CudaOptions options) {
  std::string why;
  if (cuda_device_count(&why) == 0) no_device(why);
  if (static_cast<int64_t>(store.params.size()) != g.param_count() ||
      static_cast<int64_t>(store.grads.size()) != g.param_count() ||
      static_cast<int64_t>(store.buffers.size()) != g.buffer_count())
    throw std::invalid_argument("CUDA backend: parameter store does not match the graph");
  return std::make_unique<CudaExecutorImpl>(g, batch, store, buckets, precision, options);
}

}  // namespace gg::kernels
