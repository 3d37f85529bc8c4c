#include "gossip/comm/cuda_ipc_exchange.hpp"

#include <stdexcept>

#ifdef GG_HAVE_CUDA
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/device_buffers.hpp"
#endif

namespace gg::gossip {

#ifndef GG_HAVE_CUDA

bool cuda_ipc_built() { return false; }

std::unique_ptr<WeightExchange> make_cuda_ipc_exchange(const mpi::Comm&, float*,
                                                       std::vector<kernels::Bucket>,
                                                       const partners::Schedule&, void*) {
  throw std::invalid_argument("the CUDA IPC exchange needs the CUDA backend, not in this build");
}

#else

bool cuda_ipc_built() { return true; }

namespace {

// Message tags on the exchange's own communicator.
constexpr int kPublished = 1;  // "every bucket of my outbox for step s is recorded": the step
constexpr int kRead = 2;       // "I have copied your outbox": no payload

std::vector<uint8_t> word(int64_t v) {
  std::vector<uint8_t> b(sizeof v);
  std::memcpy(b.data(), &v, sizeof v);
  return b;
}

// The floats the buckets cover (they tile [0, n) in some order).
int64_t extent(const std::vector<kernels::Bucket>& buckets) {
  int64_t n = 0;
  for (const kernels::Bucket& b : buckets) n = std::max(n, b.end);
  return n;
}

cudaEvent_t make_event(unsigned flags) {
  cudaEvent_t e = nullptr;
  GG_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming | flags));
  return e;
}

class CudaIpcExchange final : public WeightExchange {
 public:
  CudaIpcExchange(const mpi::Comm& world, float* x, std::vector<kernels::Bucket> buckets,
                  partners::Schedule schedule, cudaStream_t stream)
      : comm_(world.dup()),
        x_(x),
        buckets_(std::move(buckets)),
        n_(extent(buckets_)),
        schedule_(std::move(schedule)),
        stream_(stream),
        outbox_(n_),
        inbox_(n_),
        peers_(static_cast<size_t>(comm_.size())) {
    GG_CUDA_CHECK(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking));
    for (size_t b = 0; b < buckets_.size(); ++b) {
      ready_.push_back(make_event(0));
      published_.push_back(make_event(cudaEventInterprocess));
    }
    read_ = make_event(0);
    mixed_ = make_event(0);
    exchange_handles();
  }

  ~CudaIpcExchange() override {
    // What a partner still owes or is owed is settled, so that no outbox is freed while it is
    // read; a failure here (a partner gone) leaves it to the job's end.
    try {
      GG_CUDA_CHECK(cudaStreamSynchronize(side_));
      settle();
    } catch (const std::exception&) {
    }
    for (Peer& p : peers_) {
      if (p.outbox) cudaIpcCloseMemHandle(p.outbox);
      for (cudaEvent_t e : p.published) cudaEventDestroy(e);
    }
    for (cudaEvent_t e : ready_) cudaEventDestroy(e);
    for (cudaEvent_t e : published_) cudaEventDestroy(e);
    cudaEventDestroy(read_);
    cudaEventDestroy(mixed_);
    cudaStreamDestroy(side_);
  }

  const char* name() const override { return "cuda-ipc"; }
  bool host_memory() const override { return false; }

  void begin_step(int64_t step) override {
    settle();  // last step's outbox read by its reader, and ours of the partner's done
    peers_now_ = partners::partners(schedule_, comm_.rank(), step);
    if (peers_now_.links() != 1 || peers_now_.weighted)
      throw std::logic_error("CUDA IPC exchange: one unweighted link a step only");
    step_ = step;
    started_ = true;
  }

  // Bucket b is final on the compute stream (enqueued): on the side stream, it goes into the
  // outbox behind it, and the outbox's event for b is recorded.
  void on_bucket_ready(int b) override {
    const kernels::Bucket& k = buckets_.at(static_cast<size_t>(b));
    GG_CUDA_CHECK(cudaEventRecord(ready_[b], stream_));
    GG_CUDA_CHECK(cudaStreamWaitEvent(side_, ready_[b], 0));
    GG_CUDA_CHECK(cudaMemcpyAsync(outbox_.get() + k.begin, x_ + k.begin, bytes(k),
                                  cudaMemcpyDeviceToDevice, side_));
    GG_CUDA_CHECK(cudaEventRecord(published_[b], side_));
  }

  // Tells the reader every bucket is recorded, waits for the partner's word, then reads and
  // mixes each of its buckets as its event fires; the compute stream waits for the mixing.
  double finish_step() override {
    if (!started_) return 0;
    started_ = false;
    const auto t0 = std::chrono::steady_clock::now();
    comm_.send_bytes(word(step_), peers_now_.send_to, kPublished);
    reader_ = peers_now_.send_to;
    const int from_rank = peers_now_.recv_from;
    if (comm_.recv_bytes(from_rank, kPublished) != word(step_))
      throw std::runtime_error("CUDA IPC exchange: rank " + std::to_string(from_rank) +
                               " published another step than " + std::to_string(step_));
    Peer& from = open(from_rank);
    for (size_t b = 0; b < buckets_.size(); ++b) {
      const kernels::Bucket& k = buckets_[b];
      GG_CUDA_CHECK(cudaStreamWaitEvent(side_, from.published[b], 0));
      GG_CUDA_CHECK(cudaMemcpyAsync(inbox_.get() + k.begin, from.outbox + k.begin, bytes(k),
                                    cudaMemcpyDeviceToDevice, side_));
    }
    GG_CUDA_CHECK(cudaEventRecord(read_, side_));
    owner_ = from_rank;
    for (const kernels::Bucket& k : buckets_)
      kernels::cuda::mix_pair(x_ + k.begin, inbox_.get() + k.begin, k.size(), side_);
    GG_CUDA_CHECK(cudaEventRecord(mixed_, side_));
    GG_CUDA_CHECK(cudaStreamWaitEvent(stream_, mixed_, 0));
    sent_ += static_cast<int64_t>(bytes({0, n_}));
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  // The weights after the update: every bucket at once.
  double exchange_all(int64_t step) override {
    const auto t0 = std::chrono::steady_clock::now();
    begin_step(step);
    for (size_t b = 0; b < buckets_.size(); ++b) on_bucket_ready(static_cast<int>(b));
    finish_step();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  // The pipelined and overlapped weight exchanges are not served (the trainer runs them
  // host-staged); nothing is kept from step to step.
  void start_all(int64_t) override { unsupported("start_all"); }
  double wait_bucket(int) override { return 0; }
  void start_delayed(int64_t) override { unsupported("start_delayed"); }
  double finish_delayed() override { return 0; }
  std::vector<float> delayed_delta() override { return {}; }
  void set_delayed_delta(const std::vector<float>& d) override {
    if (!d.empty()) unsupported("set_delayed_delta");
  }
  std::vector<double> take_distances() override { return {}; }
  double distance() const override { return 0; }
  void restore_distance(double) override {}
  int64_t bytes_sent() const override { return sent_; }

 private:
  struct Peer {
    cudaIpcMemHandle_t mem{};
    std::vector<cudaIpcEventHandle_t> events;
    float* outbox = nullptr;  // opened
    std::vector<cudaEvent_t> published;
  };

  static size_t bytes(const kernels::Bucket& k) {
    return static_cast<size_t>(k.size()) * sizeof(float);
  }

  // Every rank's outbox and bucket events (a collective), opened when a step first pairs this
  // rank with it.
  void exchange_handles() {
    const size_t nb = buckets_.size();
    std::string mine(sizeof(cudaIpcMemHandle_t) + nb * sizeof(cudaIpcEventHandle_t), '\0');
    cudaIpcMemHandle_t mem{};
    GG_CUDA_CHECK(cudaIpcGetMemHandle(&mem, outbox_.get()));
    std::memcpy(mine.data(), &mem, sizeof mem);
    for (size_t b = 0; b < nb; ++b) {
      cudaIpcEventHandle_t e{};
      GG_CUDA_CHECK(cudaIpcGetEventHandle(&e, published_[b]));
      std::memcpy(mine.data() + sizeof mem + b * sizeof e, &e, sizeof e);
    }
    for (int root = 0; root < comm_.size(); ++root) {
      std::string h = root == comm_.rank() ? mine : std::string();
      comm_.broadcast(h, root);
      if (h.size() != mine.size())
        throw std::runtime_error("CUDA IPC exchange: rank " + std::to_string(root) +
                                 " sent handles of another size (other buckets?)");
      Peer& p = peers_[static_cast<size_t>(root)];
      std::memcpy(&p.mem, h.data(), sizeof mem);
      p.events.resize(nb);
      for (size_t b = 0; b < nb; ++b)
        std::memcpy(&p.events[b], h.data() + sizeof mem + b * sizeof(cudaIpcEventHandle_t),
                    sizeof(cudaIpcEventHandle_t));
    }
  }

  Peer& open(int rank) {
    Peer& p = peers_.at(static_cast<size_t>(rank));
    if (!p.outbox) {
      void* ptr = nullptr;
      GG_CUDA_CHECK(cudaIpcOpenMemHandle(&ptr, p.mem, cudaIpcMemLazyEnablePeerAccess));
      p.outbox = static_cast<float*>(ptr);
      for (const cudaIpcEventHandle_t& h : p.events) {
        cudaEvent_t e = nullptr;
        GG_CUDA_CHECK(cudaIpcOpenEventHandle(&e, h));
        p.published.push_back(e);
      }
    }
    return p;
  }

  // Every rank first tells the owner of what it read last step that the copy is done, then
  // waits to hear the same from its own last reader: all sends before any receive, so no cycle.
  void settle() {
    if (owner_ >= 0) {
      GG_CUDA_CHECK(cudaEventSynchronize(read_));
      comm_.send_bytes({}, owner_, kRead);
      owner_ = -1;
    }
    if (reader_ >= 0) {
      comm_.recv_bytes(reader_, kRead);
      reader_ = -1;
    }
  }

  [[noreturn]] static void unsupported(const char* what) {
    throw std::logic_error(std::string("CUDA IPC exchange: ") + what +
                           " is not served (the trainer runs it host-staged)");
  }

  mpi::Comm comm_;
  float* x_;
  std::vector<kernels::Bucket> buckets_;
  int64_t n_;
  partners::Schedule schedule_;
  cudaStream_t stream_;  // the state's compute stream
  cudaStream_t side_ = nullptr;
  kernels::cuda::DeviceArray<float> outbox_, inbox_;
  std::vector<cudaEvent_t> ready_, published_;  // per bucket
  cudaEvent_t read_ = nullptr, mixed_ = nullptr;
  std::vector<Peer> peers_;
  partners::Partners peers_now_;
  int64_t step_ = 0;
  bool started_ = false;
  int reader_ = -1;  // who read our outbox last step (owes us a kRead)
  int owner_ = -1;   // whose outbox we read last step (we owe it a kRead)
  int64_t sent_ = 0;
};

}  // namespace

std::unique_ptr<WeightExchange> make_cuda_ipc_exchange(const mpi::Comm& world, float* device_buffer,
                                                       std::vector<kernels::Bucket> buckets,
                                                       const partners::Schedule& schedule,
                                                       void* stream) {
  return std::make_unique<CudaIpcExchange>(world, device_buffer, std::move(buckets), schedule,
                                           static_cast<cudaStream_t>(stream));
}

#endif

}  // namespace gg::gossip
