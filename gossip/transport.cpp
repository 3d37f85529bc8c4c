#include "gossip/transport.hpp"

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <thread>

namespace gg::gossip {
namespace {

int checked_count(const kernels::Bucket& b) {
  if (b.size() > mpi::kMaxCount) throw std::invalid_argument("bucket larger than 2^30 floats");
  return static_cast<int>(b.size());
}

// Waits for a flag another process sets, without burning a core when ranks outnumber cores:
// spin briefly, then yield, then sleep in short naps. With timeout_s > 0, a wait longer than
// that throws PartnerTimeout naming `peer`, `bucket` and `what` was awaited.
template <typename Ready>
void wait_until(Ready ready, double timeout_s = 0, int peer = -1, int bucket = -1,
                const char* what = "") {
  for (int i = 0; i < 2000; ++i)
    if (ready()) return;
  for (int i = 0; i < 200; ++i) {
    if (ready()) return;
    sched_yield();
  }
  const auto t0 = std::chrono::steady_clock::now();
  int naps = 0;
  while (!ready()) {
    std::this_thread::sleep_for(std::chrono::microseconds(20));
    if (timeout_s > 0 && ++naps % 512 == 0 &&
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > timeout_s)
      throw PartnerTimeout(peer, bucket, what);
  }
}

// Floats, rounded up to whole cache lines, so that two ranks writing neighbouring ranges never
// share a line.
int64_t line_up(int64_t floats) { return (floats + 15) / 16 * 16; }

}  // namespace

void Transport::publish(int, int64_t, int) {
  throw std::logic_error(std::string(name()) + " transport cannot pair in place");
}
void Transport::average_in_place(int, int64_t, int) {
  throw std::logic_error(std::string(name()) + " transport cannot pair in place");
}

namespace {

class P2pTransport final : public Transport {
 public:
  P2pTransport(const mpi::Comm& comm, const BufferLayout& layout)
      : comm_(comm.dup()),
        layout_(layout),
        recv_(layout.count),
        recv_req_(layout.buckets.size()),
        send_req_(layout.buckets.size()) {}
  const char* name() const override { return "p2p"; }

  void expect(int from, int64_t, int b) override {
    const kernels::Bucket& k = layout_.buckets[b];
    GG_MPI_CHECK(MPI_Irecv(recv_.data() + k.begin, checked_count(k), MPI_FLOAT, from, b,
                           comm_.get(), recv_req_[b].out()));
  }
  void send(int to, int64_t, int b, const float* data) override {
    const kernels::Bucket& k = layout_.buckets[b];
    GG_MPI_CHECK(
        MPI_Isend(data, checked_count(k), MPI_FLOAT, to, b, comm_.get(), send_req_[b].out()));
  }
  const float* received(int from, int64_t, int b) override {
    if (timeout_s_ > 0)
      wait_until([&] { return recv_req_[b].test(); }, timeout_s_, from, b, "p2p receive");
    else
      recv_req_[b].wait();
    return recv_.data() + layout_.buckets[b].begin;
  }
  void finish_send(int to, int64_t, int b) override {
    if (timeout_s_ > 0)
      wait_until([&] { return send_req_[b].test(); }, timeout_s_, to, b, "p2p send");
    else
      send_req_[b].wait();
  }
  void release(int, int64_t, int) override {}

 private:
  mpi::Comm comm_;
  BufferLayout layout_;
  std::vector<float> recv_;
  std::vector<mpi::Request> recv_req_, send_req_;
};

// One-member groups for PSCW, made once.
class SingletonGroups {
 public:
  explicit SingletonGroups(const mpi::Comm& comm) {
    MPI_Group all;
    GG_MPI_CHECK(MPI_Comm_group(comm.get(), &all));
    groups_.resize(comm.size());
    for (int r = 0; r < comm.size(); ++r) GG_MPI_CHECK(MPI_Group_incl(all, 1, &r, &groups_[r]));
    MPI_Group_free(&all);
  }
  ~SingletonGroups() {
    for (MPI_Group& g : groups_) MPI_Group_free(&g);
  }
  MPI_Group operator[](int r) const { return groups_.at(r); }

 private:
  std::vector<MPI_Group> groups_;
};

class RmaTransport final : public Transport {
 public:
  RmaTransport(const mpi::Comm& comm, const BufferLayout& layout)
      : comm_(comm.dup()), layout_(layout), groups_(comm_) {
    for (const kernels::Bucket& k : layout.buckets) checked_count(k);
    // Never below 4 KiB: Debian's MPICH 4.0.2 lost PSCW puts into 4- and 8-byte windows.
    const int64_t bytes = std::max<int64_t>(4096, layout.count * sizeof(float));
    window_ = std::make_unique<mpi::Window>(comm_, bytes, mpi::Window::Kind::Allocate);
  }
  const char* name() const override { return "rma"; }
  bool whole_step() const override { return true; }

  void begin_step(int from, int to, int64_t) override {
    GG_MPI_CHECK(MPI_Win_post(groups_[from], 0, window_->get()));
    GG_MPI_CHECK(MPI_Win_start(groups_[to], 0, window_->get()));
    waited_ = false;
  }
  void expect(int, int64_t, int) override {}
  void send(int to, int64_t, int b, const float* data) override {
    const kernels::Bucket& k = layout_.buckets[b];
    const int n = checked_count(k);
    GG_MPI_CHECK(MPI_Put(data, n, MPI_FLOAT, to, static_cast<MPI_Aint>(k.begin * sizeof(float)), n,
                         MPI_FLOAT, window_->get()));
  }
  void end_sends(int, int64_t) override { GG_MPI_CHECK(MPI_Win_complete(window_->get())); }
  const float* received(int, int64_t, int b) override {
    if (!waited_) {
      GG_MPI_CHECK(MPI_Win_wait(window_->get()));
      waited_ = true;
    }
    return static_cast<const float*>(window_->base()) + layout_.buckets[b].begin;
  }
  void release(int, int64_t, int) override {}

 private:
  mpi::Comm comm_;
  BufferLayout layout_;
  SingletonGroups groups_;
  std::unique_ptr<mpi::Window> window_;
  bool waited_ = false;
};

// comm rank -> rank in `node` (MPI_UNDEFINED when not on this node).
std::vector<int> node_ranks(const mpi::Comm& comm, const mpi::Comm& node) {
  MPI_Group g_comm, g_node;
  GG_MPI_CHECK(MPI_Comm_group(comm.get(), &g_comm));
  GG_MPI_CHECK(MPI_Comm_group(node.get(), &g_node));
  std::vector<int> all(comm.size()), out(comm.size());
  for (int i = 0; i < comm.size(); ++i) all[i] = i;
  GG_MPI_CHECK(MPI_Group_translate_ranks(g_comm, comm.size(), all.data(), g_node, out.data()));
  MPI_Group_free(&g_comm);
  MPI_Group_free(&g_node);
  return out;
}

class ShmTransport final : public Transport {
 public:
  ShmTransport(const mpi::Comm& comm, const mpi::Comm& node, const BufferLayout& layout, bool home)
      : node_(node.dup()),
        layout_(layout),
        to_node_(node_ranks(comm, node)),
        rank_(comm.rank()),
        home_floats_(home ? line_up(layout.count) : 0) {
    const int64_t nb = static_cast<int64_t>(layout.buckets.size());
    // ready[2][nb], done[2][nb], published[nb], averaged[nb], padded to 64 bytes
    flags_ = (6 * nb + 7) / 8 * 8;
    bytes_ = flags_ * 8 + (home_floats_ + 2 * layout.count) * static_cast<int64_t>(sizeof(float));
    window_ = std::make_unique<mpi::Window>(node_, bytes_, mpi::Window::Kind::Shared);
    std::memset(window_->base(), 0, bytes_);
    segments_.resize(node_.size());
    for (int r = 0; r < node_.size(); ++r)
      segments_[r] = static_cast<char*>(window_->shared_base(r));
    self_ = node_.rank();
    // A passive epoch for the window's lifetime: the unified memory model, where stores by one
    // process are seen by the others; ordering comes from the acquire/release flags below.
    GG_MPI_CHECK(MPI_Win_lock_all(MPI_MODE_NOCHECK, window_->get()));
    node_.barrier();  // every segment is zeroed before anyone writes
  }
  ~ShmTransport() override { MPI_Win_unlock_all(window_->get()); }
  const char* name() const override { return "shm"; }

  float* shared_home() override { return home_floats_ ? home(segments_[self_]) : nullptr; }
  bool pairs_in_place(int peer) const override {
    return home_floats_ > 0 && to_node_.at(peer) != MPI_UNDEFINED;
  }
  void publish(int, int64_t step, int b) override {
    std::atomic_ref<int64_t>(flag(segments_[self_], kPublished, b))
        .store(step + 1, std::memory_order_release);
  }
  void average_in_place(int peer, int64_t step, int b) override {
    char* mine = segments_[self_];
    char* theirs = segment(peer);
    std::atomic_ref<int64_t> published(flag(theirs, kPublished, b));
    wait_until([&] { return published.load(std::memory_order_acquire) >= step + 1; }, timeout_s_,
               peer, b, "shm in-place average: the partner's bucket");
    const kernels::Bucket& k = layout_.buckets[b];
    const int64_t half = std::min(k.size(), line_up(k.size() / 2));
    const int64_t lo = rank_ < peer ? 0 : half, hi = rank_ < peer ? half : k.size();
    float* __restrict a = home(mine) + k.begin;
    float* __restrict c = home(theirs) + k.begin;
    for (int64_t i = lo; i < hi; ++i) {
      const float m = 0.5f * (a[i] + c[i]);
      a[i] = m;
      c[i] = m;
    }
    std::atomic_ref<int64_t>(flag(mine, kAveraged, b)).store(step + 1, std::memory_order_release);
    // Nobody sent into this step's receive slot: it is free for the sender two steps on.
    release(peer, step, b);
    std::atomic_ref<int64_t> averaged(flag(theirs, kAveraged, b));
    wait_until([&] { return averaged.load(std::memory_order_acquire) >= step + 1; }, timeout_s_,
               peer, b, "shm in-place average: the partner's half");
  }

  void expect(int, int64_t, int) override {}
  void send(int to, int64_t step, int b, const float* data) override {
    char* seg = segment(to);
    const int slot = static_cast<int>(step & 1);
    // The slot was last used at step - 2; the receiver must have mixed it.
    std::atomic_ref<int64_t> done(flag(seg, 2 + slot, b));
    wait_until([&] { return done.load(std::memory_order_acquire) >= step - 1; }, timeout_s_, to, b,
               "shm send: the partner to free its receive slot");
    const kernels::Bucket& k = layout_.buckets[b];
    std::memcpy(payload(seg, slot) + k.begin, data, k.size() * sizeof(float));
    std::atomic_ref<int64_t>(flag(seg, slot, b)).store(step + 1, std::memory_order_release);
  }
  const float* received(int from, int64_t step, int b) override {
    char* seg = segments_[node_rank_self()];
    const int slot = static_cast<int>(step & 1);
    std::atomic_ref<int64_t> ready(flag(seg, slot, b));
    wait_until([&] { return ready.load(std::memory_order_acquire) == step + 1; }, timeout_s_, from,
               b, "shm receive");
    return payload(seg, slot) + layout_.buckets[b].begin;
  }
  void release(int, int64_t step, int b) override {
    char* seg = segments_[node_rank_self()];
    std::atomic_ref<int64_t>(flag(seg, 2 + static_cast<int>(step & 1), b))
        .store(step + 1, std::memory_order_release);
  }

 private:
  int node_rank_self() const { return self_; }
  char* segment(int comm_rank) const {
    const int r = to_node_.at(comm_rank);
    if (r == MPI_UNDEFINED)
      throw std::runtime_error("shm transport: rank " + std::to_string(comm_rank) +
                               " is on another node");
    return segments_[r];
  }
  static constexpr int kPublished = 4, kAveraged = 5;  // after ready[2] and done[2]
  int64_t& flag(char* seg, int which, int b) const {
    return reinterpret_cast<int64_t*>(
        seg)[which * static_cast<int64_t>(layout_.buckets.size()) + b];
  }
  float* home(char* seg) const { return reinterpret_cast<float*>(seg + flags_ * 8); }
  float* payload(char* seg, int slot) const {
    return home(seg) + home_floats_ + slot * layout_.count;
  }

  mpi::Comm node_;
  BufferLayout layout_;
  std::vector<int> to_node_;
  int rank_;                 // in comm
  int64_t home_floats_ = 0;  // 0: no home buffer in the window
  int64_t flags_ = 0, bytes_ = 0;
  std::unique_ptr<mpi::Window> window_;
  std::vector<char*> segments_;
  int self_ = -1;
};

class AutoTransport final : public Transport {
 public:
  AutoTransport(const mpi::Comm& comm, const BufferLayout& layout, bool home) {
    mpi::Comm node = comm.split_shared();
    to_node_ = node_ranks(comm, node);
    // Collective decisions: every rank of comm must create the same windows.
    int multi_node = node.size() < comm.size();
    GG_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &multi_node, 1, MPI_INT, MPI_MAX, comm.get()));
    int any_shared = node.size() > 1;
    GG_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &any_shared, 1, MPI_INT, MPI_MAX, comm.get()));
    // A single rank (p = 1) pairs with itself through shm: the exchange is the identity.
    if (any_shared || !multi_node) shm_ = make_shm_transport(comm, node, layout, home);
    if (multi_node) remote_ = make_p2p_transport(comm, layout);
  }
  const char* name() const override { return remote_ ? (shm_ ? "auto" : "p2p") : "shm"; }
  void set_timeout(double seconds) override {
    for (Transport* t : {shm_.get(), remote_.get()})
      if (t) t->set_timeout(seconds);
  }
  void begin_step(int from, int to, int64_t t) override {
    // Both halves of a step go through shm or p2p, which need no per-step set-up.
    (void)from, (void)to, (void)t;
  }
  void expect(int from, int64_t t, int b) override { pick(from).expect(from, t, b); }
  void send(int to, int64_t t, int b, const float* d) override { pick(to).send(to, t, b, d); }
  const float* received(int from, int64_t t, int b) override {
    return pick(from).received(from, t, b);
  }
  void release(int from, int64_t t, int b) override { pick(from).release(from, t, b); }
  void finish_send(int to, int64_t t, int b) override { pick(to).finish_send(to, t, b); }
  float* shared_home() override { return shm_ ? shm_->shared_home() : nullptr; }
  bool pairs_in_place(int peer) const override {
    return shm_ && to_node_.at(peer) != MPI_UNDEFINED && shm_->pairs_in_place(peer);
  }
  void publish(int peer, int64_t t, int b) override { shm_->publish(peer, t, b); }
  void average_in_place(int peer, int64_t t, int b) override { shm_->average_in_place(peer, t, b); }

 private:
  Transport& pick(int peer) {
    const bool local = to_node_.at(peer) != MPI_UNDEFINED;
    Transport* t = local && shm_ ? shm_.get() : remote_.get();
    if (!t) t = shm_.get();
    return *t;
  }
  std::vector<int> to_node_;
  std::unique_ptr<Transport> shm_, remote_;  // remote_: partners on other nodes (p2p)
};

}  // namespace

std::unique_ptr<Transport> make_p2p_transport(const mpi::Comm& comm, const BufferLayout& layout) {
  return std::make_unique<P2pTransport>(comm, layout);
}

std::unique_ptr<Transport> make_remote_transport(const mpi::Comm& comm,
                                                 const BufferLayout& layout) {
  return std::make_unique<RmaTransport>(comm, layout);
}

std::unique_ptr<Transport> make_shm_transport(const mpi::Comm& comm, const mpi::Comm& node,
                                              const BufferLayout& layout, bool home) {
  return std::make_unique<ShmTransport>(comm, node, layout, home);
}

std::unique_ptr<Transport> make_auto_transport(const mpi::Comm& comm, const BufferLayout& layout,
                                               bool home) {
  return std::make_unique<AutoTransport>(comm, layout, home);
}

std::unique_ptr<Transport> make_transport(const std::string& name, const mpi::Comm& comm,
                                          const BufferLayout& layout, bool home) {
  if (name == "p2p") return make_p2p_transport(comm, layout);
  if (name == "rma") return make_remote_transport(comm, layout);
  if (name == "auto") return make_auto_transport(comm, layout, home);
  if (name == "shm") {
    mpi::Comm node = comm.split_shared();
    int spans = node.size() < comm.size();
    GG_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &spans, 1, MPI_INT, MPI_MAX, comm.get()));
    if (spans)
      throw std::invalid_argument(
          "the shm transport needs every rank on one node; use auto or rma across nodes");
    return make_shm_transport(comm, node, layout, home);
  }
  throw std::invalid_argument("unknown transport '" + name + "' (expected auto, shm, rma or p2p)");
}

}  // namespace gg::gossip
