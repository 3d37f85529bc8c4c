#include "gossip/comm/transport.hpp"

#include <sched.h>

#include <algorithm>
#include <array>
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

void Transport::count_peers(int peers) {
  peers_ = peers;
  counters_ = std::make_unique<std::atomic<int64_t>[]>(static_cast<size_t>(peers) * kCounters);
}

void Transport::add(int peer, Counter c, int64_t n) {
  if (peer < 0 || peer >= peers_) return;
  counters_[static_cast<size_t>(peer) * kCounters + c].fetch_add(n, std::memory_order_relaxed);
}

void Transport::count_sent(int peer, int64_t floats) {
  add(peer, kBucketsSent, 1);
  add(peer, kBytesSent, floats * static_cast<int64_t>(sizeof(float)));
}

void Transport::count_received(int peer, int64_t floats) {
  add(peer, kBucketsReceived, 1);
  add(peer, kBytesReceived, floats * static_cast<int64_t>(sizeof(float)));
}

void Transport::count_in_place(int peer, int64_t floats) {
  count_sent(peer, floats);
  count_received(peer, floats);
  add(peer, kInPlace, 1);
}

std::vector<TransportTraffic> Transport::traffic() const {
  TransportTraffic t{name(), std::vector<PeerTraffic>(peers_)};
  for (int r = 0; r < peers_; ++r) {
    const std::atomic<int64_t>* c = &counters_[static_cast<size_t>(r) * kCounters];
    PeerTraffic& out = t.peers[r];
    out.buckets_sent = c[kBucketsSent].load(std::memory_order_relaxed);
    out.bytes_sent = c[kBytesSent].load(std::memory_order_relaxed);
    out.buckets_received = c[kBucketsReceived].load(std::memory_order_relaxed);
    out.bytes_received = c[kBytesReceived].load(std::memory_order_relaxed);
    out.buckets_in_place = c[kInPlace].load(std::memory_order_relaxed);
  }
  return {t};
}

void Transport::publish(int, int64_t, int) {
  throw std::logic_error(std::string(name()) + " transport cannot pair in place");
}
void Transport::average_in_place(int, int64_t, int) {
  throw std::logic_error(std::string(name()) + " transport cannot pair in place");
}

namespace {

// Isend/Irecv, one receive slot per link and bucket: with k peers a step (layout.links), the
// expects and sends of a bucket take its slots in order, and received / finish_send find theirs
// by the peer (a step's recv_from's are distinct, and so are its send_to's). Messages are tagged
// by bucket; MPI keeps the order of two messages from one rank with one tag, and a step's
// buckets are all mixed before the next step's are expected.
class P2pTransport final : public Transport {
 public:
  P2pTransport(const mpi::Comm& comm, const BufferLayout& layout)
      : comm_(comm.dup()),
        layout_(layout),
        links_(std::clamp(layout.links, 1, partners::kMaxLinks)),
        recv_(static_cast<size_t>(layout.count) * links_),
        recv_req_(layout.buckets.size() * links_),
        send_req_(layout.buckets.size() * links_),
        slots_(layout.buckets.size()) {
    count_peers(comm_.size());
  }
  const char* name() const override { return "p2p"; }

  void expect(int from, int64_t step, int b) override {
    const int s = slots_[b].from.take(from, step, links_);
    const kernels::Bucket& k = layout_.buckets[b];
    GG_MPI_CHECK(MPI_Irecv(recv_.data() + s * layout_.count + k.begin, checked_count(k), MPI_FLOAT,
                           from, b, comm_.get(), recv_req_[at(b, s)].out()));
  }
  void send(int to, int64_t step, int b, const float* data) override {
    const int s = slots_[b].to.take(to, step, links_);
    const kernels::Bucket& k = layout_.buckets[b];
    GG_MPI_CHECK(MPI_Isend(data, checked_count(k), MPI_FLOAT, to, b, comm_.get(),
                           send_req_[at(b, s)].out()));
    count_sent(to, k.size());
  }
  const float* received(int from, int64_t, int b) override {
    const int s = slots_[b].from.find(from);
    mpi::Request& r = recv_req_[at(b, s)];
    if (timeout_s_ > 0 || while_waiting_)
      wait_until(
          [&] {
            waiting();
            return r.test();
          },
          timeout_s_, from, b, "p2p receive");
    else
      r.wait();
    count_received(from, layout_.buckets[b].size());
    return recv_.data() + s * layout_.count + layout_.buckets[b].begin;
  }
  void finish_send(int to, int64_t, int b) override {
    mpi::Request& r = send_req_[at(b, slots_[b].to.find(to))];
    if (timeout_s_ > 0)
      wait_until([&] { return r.test(); }, timeout_s_, to, b, "p2p send");
    else
      r.wait();
  }
  void release(int, int64_t, int) override {}

 private:
  // One side (receives or sends) of bucket b's slots in its latest step: the peer each slot was
  // taken for (-1: free).
  struct Side {
    std::array<int, partners::kMaxLinks> peer;
    int64_t step = -1;
    int take(int p, int64_t t, int slots) {
      if (step != t) peer.fill(-1), step = t;
      for (int s = 0; s < slots; ++s)
        if (peer[s] < 0) return peer[s] = p, s;
      throw std::logic_error("p2p: more links in a step than the transport was made for");
    }
    int find(int p) const {
      for (size_t s = 0; s < peer.size(); ++s)
        if (peer[s] == p) return static_cast<int>(s);
      throw std::logic_error("p2p: no bucket expected from or sent to rank " + std::to_string(p));
    }
  };
  struct Slots {
    Side from, to;
  };
  size_t at(int b, int slot) const { return static_cast<size_t>(b) * links_ + slot; }

  mpi::Comm comm_;
  BufferLayout layout_;
  int links_;
  std::vector<float> recv_;
  std::vector<mpi::Request> recv_req_, send_req_;
  std::vector<Slots> slots_;
};

// MPI_Put into the partner's MPI_Win_allocate window under one passive-target epoch
// (MPI_Win_lock_all) for the window's lifetime, with notification by flags in the window:
//   arrived[b]  the step + 1 of the last bucket b put here (written by the sender),
//   ready[b]    the step + 1 up to which this rank's slot of bucket b may be overwritten
//               (written by this rank once it has mixed the bucket).
// Sender, bucket b of step t: wait until the target's ready[b] > t (an atomic read, polled),
// MPI_Put the bucket, flush, set the target's arrived[b] = t + 1, flush. Receiver: poll its own
// arrived[b] until it passes t, MPI_Win_sync, read; release sets ready[b] = t + 2. Every flag
// access is an MPI accumulate operation (MPI_Accumulate with MPI_REPLACE, MPI_Fetch_and_op with
// MPI_NO_OP), which MPI makes atomic with respect to each other; polling through MPI also drives
// progress where MPICH implements them with active messages. No epoch depends on who the
// partner is, so partners may change every step.
class RmaTransport final : public Transport {
 public:
  RmaTransport(const mpi::Comm& comm, const BufferLayout& layout)
      : comm_(comm.dup()), layout_(layout), nb_(static_cast<int64_t>(layout.buckets.size())) {
    for (const kernels::Bucket& k : layout.buckets) checked_count(k);
    data_offset_ = line_up(2 * nb_ * 2) * static_cast<int64_t>(sizeof(float));
    const int64_t bytes =
        data_offset_ + line_up(layout.count) * static_cast<int64_t>(sizeof(float));
    window_ = std::make_unique<mpi::Window>(comm_, bytes, mpi::Window::Kind::Allocate);
    int64_t* flags = static_cast<int64_t*>(window_->base());
    std::fill(flags, flags + nb_, int64_t{0});            // arrived: nothing yet
    std::fill(flags + nb_, flags + 2 * nb_, int64_t{1});  // ready: free for step 0
    GG_MPI_CHECK(MPI_Win_lock_all(MPI_MODE_NOCHECK, window_->get()));
    GG_MPI_CHECK(MPI_Win_sync(window_->get()));
    count_peers(comm_.size());
    comm_.barrier();  // every rank's flags are set before anyone reads them
  }
  ~RmaTransport() override {
    if (!comm_.peer_lost()) MPI_Win_unlock_all(window_->get());
  }
  const char* name() const override { return "rma"; }

  void expect(int, int64_t, int) override {}
  void send(int to, int64_t step, int b, const float* data) override {
    wait_until([&] { return read_flag(to, kReady, b) > step; }, timeout_s_, to, b,
               "rma: the partner's slot to free");
    const kernels::Bucket& k = layout_.buckets[b];
    const int n = checked_count(k);
    GG_MPI_CHECK(MPI_Put(data, n, MPI_FLOAT, to,
                         static_cast<MPI_Aint>(data_offset_ + k.begin * sizeof(float)), n,
                         MPI_FLOAT, window_->get()));
    GG_MPI_CHECK(MPI_Win_flush(to, window_->get()));  // the data is there before the flag
    write_flag(to, kArrived, b, step + 1);
    count_sent(to, k.size());
  }
  const float* received(int from, int64_t step, int b) override {
    const int self = comm_.rank();
    wait_until(
        [&] {
          waiting();
          return read_flag(self, kArrived, b) > step;
        },
        timeout_s_, from, b, "rma: the partner's bucket");
    GG_MPI_CHECK(MPI_Win_sync(window_->get()));
    count_received(from, layout_.buckets[b].size());
    return reinterpret_cast<const float*>(static_cast<const char*>(window_->base()) +
                                          data_offset_) +
           layout_.buckets[b].begin;
  }
  void release(int, int64_t step, int b) override { write_flag(comm_.rank(), kReady, b, step + 2); }

 private:
  static constexpr int kArrived = 0, kReady = 1;
  MPI_Aint flag_disp(int which, int b) const {
    return static_cast<MPI_Aint>((which * nb_ + b) * static_cast<int64_t>(sizeof(int64_t)));
  }
  int64_t read_flag(int rank, int which, int b) const {
    int64_t v = 0;
    GG_MPI_CHECK(MPI_Fetch_and_op(nullptr, &v, MPI_INT64_T, rank, flag_disp(which, b), MPI_NO_OP,
                                  window_->get()));
    GG_MPI_CHECK(MPI_Win_flush(rank, window_->get()));
    return v;
  }
  void write_flag(int rank, int which, int b, int64_t v) const {
    GG_MPI_CHECK(MPI_Accumulate(&v, 1, MPI_INT64_T, rank, flag_disp(which, b), 1, MPI_INT64_T,
                                MPI_REPLACE, window_->get()));
    GG_MPI_CHECK(MPI_Win_flush(rank, window_->get()));
  }

  mpi::Comm comm_;
  BufferLayout layout_;
  int64_t nb_ = 0;
  int64_t data_offset_ = 0;  // bytes: the flags first, then the buckets
  std::unique_ptr<mpi::Window> window_;
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
    count_peers(comm.size());
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
    wait_until(
        [&] {
          progress();
          waiting();
          return published.load(std::memory_order_acquire) >= step + 1;
        },
        timeout_s_, peer, b, "shm in-place average: the partner's bucket");
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
    count_in_place(peer, k.size());
    // Nobody sent into this step's receive slot: it is free for the sender two steps on.
    release(peer, step, b);
    std::atomic_ref<int64_t> averaged(flag(theirs, kAveraged, b));
    wait_until(
        [&] {
          progress();
          return averaged.load(std::memory_order_acquire) >= step + 1;
        },
        timeout_s_, peer, b, "shm in-place average: the partner's half");
  }

  void expect(int, int64_t, int) override {}
  void send(int to, int64_t step, int b, const float* data) override {
    char* seg = segment(to);
    const int slot = static_cast<int>(step & 1);
    // The slot was last used at step - 2; the receiver must have mixed it.
    std::atomic_ref<int64_t> done(flag(seg, 2 + slot, b));
    wait_until(
        [&] {
          progress();
          return done.load(std::memory_order_acquire) >= step - 1;
        },
        timeout_s_, to, b, "shm send: the partner to free its receive slot");
    const kernels::Bucket& k = layout_.buckets[b];
    std::memcpy(payload(seg, slot) + k.begin, data, k.size() * sizeof(float));
    std::atomic_ref<int64_t>(flag(seg, slot, b)).store(step + 1, std::memory_order_release);
    count_sent(to, k.size());
  }
  const float* received(int from, int64_t step, int b) override {
    char* seg = segments_[node_rank_self()];
    const int slot = static_cast<int>(step & 1);
    std::atomic_ref<int64_t> ready(flag(seg, slot, b));
    wait_until(
        [&] {
          progress();
          waiting();
          return ready.load(std::memory_order_acquire) == step + 1;
        },
        timeout_s_, from, b, "shm receive");
    count_received(from, layout_.buckets[b].size());
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
  AutoTransport(const mpi::Comm& comm, const BufferLayout& layout, bool home) : probe_(comm.dup()) {
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
    if (shm_ && remote_)
      shm_->set_progress([c = probe_.get()] {
        int flag = 0;
        MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, c, &flag, MPI_STATUS_IGNORE);
      });
  }
  const char* name() const override { return remote_ ? (shm_ ? "auto" : "p2p") : "shm"; }
  void set_timeout(double seconds) override {
    for (Transport* t : {shm_.get(), remote_.get()})
      if (t) t->set_timeout(seconds);
  }
  void set_while_waiting(std::function<void()> f) override {
    for (Transport* t : {shm_.get(), remote_.get()})
      if (t) t->set_while_waiting(f);
  }
  void expect(int from, int64_t t, int b) override { pick(from).expect(from, t, b); }
  void send(int to, int64_t t, int b, const float* d) override { pick(to).send(to, t, b, d); }
  const float* received(int from, int64_t t, int b) override {
    return pick(from).received(from, t, b);
  }
  // The shm half counts steps in its slot flags: a step whose bucket came through p2p frees this
  // rank's shm slot of that step too, or a sender on this node would wait two steps later for a
  // release that never comes. (p2p needs no release: its receive buffer for bucket b is posted
  // again only by this rank's next exchange of b, after this one is mixed, and messages from one
  // sender with one tag match in order, so a later step's bucket can never land in an earlier
  // step's receive.) Releasing every half keeps this right for any remote half with slots.
  void release(int from, int64_t t, int b) override {
    for (Transport* used : {shm_.get(), remote_.get()})
      if (used) used->release(from, t, b);
  }
  void finish_send(int to, int64_t t, int b) override { pick(to).finish_send(to, t, b); }
  float* shared_home() override { return shm_ ? shm_->shared_home() : nullptr; }
  bool pairs_in_place(int peer) const override {
    return shm_ && to_node_.at(peer) != MPI_UNDEFINED && shm_->pairs_in_place(peer);
  }
  void publish(int peer, int64_t t, int b) override { shm_->publish(peer, t, b); }
  void average_in_place(int peer, int64_t t, int b) override {
    shm_->average_in_place(peer, t, b);
    if (remote_) remote_->release(peer, t, b);
  }
  std::vector<TransportTraffic> traffic() const override {
    std::vector<TransportTraffic> out;
    for (const Transport* t : {shm_.get(), remote_.get()})
      if (t)
        for (TransportTraffic& half : t->traffic()) out.push_back(std::move(half));
    return out;
  }

 private:
  Transport& pick(int peer) {
    const bool local = to_node_.at(peer) != MPI_UNDEFINED;
    Transport* t = local && shm_ ? shm_.get() : remote_.get();
    if (!t) t = shm_.get();
    return *t;
  }
  std::vector<int> to_node_;
  mpi::Comm probe_;                          // no messages: MPI_Iprobe on it drives progress
  std::unique_ptr<Transport> shm_, remote_;  // remote_: partners on other nodes (p2p)
};

}  // namespace

std::unique_ptr<Transport> make_p2p_transport(const mpi::Comm& comm, const BufferLayout& layout) {
  return std::make_unique<P2pTransport>(comm, layout);
}

namespace {
// shm's and rma's slots hold one partner's bucket a step.
void one_link(const char* transport, const BufferLayout& layout) {
  if (layout.links > 1)
    throw std::invalid_argument(std::string("gossip.transport ") + transport +
                                " carries one peer a step, and the schedule gives " +
                                std::to_string(layout.links) + ": set gossip.transport = p2p");
}
}  // namespace

std::unique_ptr<Transport> make_rma_transport(const mpi::Comm& comm, const BufferLayout& layout) {
  one_link("rma", layout);
  return std::make_unique<RmaTransport>(comm, layout);
}

std::unique_ptr<Transport> make_shm_transport(const mpi::Comm& comm, const mpi::Comm& node,
                                              const BufferLayout& layout, bool home) {
  one_link("shm", layout);
  return std::make_unique<ShmTransport>(comm, node, layout, home);
}

std::unique_ptr<Transport> make_auto_transport(const mpi::Comm& comm, const BufferLayout& layout,
                                               bool home) {
  one_link("auto", layout);
  return std::make_unique<AutoTransport>(comm, layout, home);
}

std::unique_ptr<Transport> make_transport(TransportKind kind, const mpi::Comm& comm,
                                          const BufferLayout& layout, bool home) {
  switch (kind) {
    case TransportKind::P2p:
      return make_p2p_transport(comm, layout);
    case TransportKind::Rma:
      return make_rma_transport(comm, layout);
    case TransportKind::Auto:
      return make_auto_transport(comm, layout, home);
    case TransportKind::Shm:
      break;
  }
  mpi::Comm node = comm.split_shared();
  int spans = node.size() < comm.size();
  GG_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &spans, 1, MPI_INT, MPI_MAX, comm.get()));
  if (spans)
    throw std::invalid_argument(
        "the shm transport needs every rank on one node; use auto, p2p or rma across nodes");
  return make_shm_transport(comm, node, layout, home);
}

}  // namespace gg::gossip
