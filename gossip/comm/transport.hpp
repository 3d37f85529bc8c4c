// How one bucket of a flat buffer travels from a rank to its partner of the step. Each transport
// splits an exchange into a receive half and a send half, so the two halves of one step may go
// through different transports (auto: shared memory to a partner on this node, Isend/Irecv
// otherwise).
//
// Protocol for bucket b at step t, on every rank (partners from the schedule):
//   1. expect(from, t, b)        announce readiness to receive a bucket (Irecv, nothing)
//   2. send(to, t, b, data)      move this rank's bucket to `to` (store / put / Isend)
//   3. received(from, t, b)      block until the partner's bucket is here; returns a pointer to
//                                it, valid until release()
//   4. release(from, t, b)       the data has been mixed; the slot may be reused
// Zero-copy pairs (shm): when the flat buffer itself lives in the transport's shared memory
// (shared_home()) and this step's partner both sends to and receives from this rank, nothing is
// copied. Instead:
//   1. publish(peer, t, b)           this rank's bucket is final (a flag, no data moves)
//   2. average_in_place(peer, t, b)  once the partner's is final too, each of the two averages
//                                    its half of the bucket, reading both buffers and storing
//                                    the mean in both; returns when the partner's half is done
// Each rank reads one bucket's worth and writes one bucket's worth: the traffic of one memcpy.
// Windows and buffers are created once, in the constructor, over the whole flat buffer; they
// are freed in the destructor, which must run before MPI_Finalize.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "gossip/comm/exchange_options.hpp"
#include "gossip/comm/mpi.hpp"
#include "kernels/graph.hpp"

namespace gg::gossip {

// What one transport moved to and from one peer since it was made. A bucket averaged in place
// (shm pairs) counts as one bucket sent and one received, of the bucket's bytes, and in
// buckets_in_place.
struct PeerTraffic {
  int64_t buckets_sent = 0, bytes_sent = 0;
  int64_t buckets_received = 0, bytes_received = 0;
  int64_t buckets_in_place = 0;
};

// One transport's counters: `peers[r]` is the traffic with rank r of the communicator.
struct TransportTraffic {
  std::string transport;  // "shm", "rma" or "p2p"
  std::vector<PeerTraffic> peers;
};

// A wait on a partner that lasted longer than the transport's timeout: the partner died or hangs.
// The exchange adds the step and turns it into a message naming both ranks.
struct PartnerTimeout : std::runtime_error {
  PartnerTimeout(int peer, int bucket, const std::string& what)
      : std::runtime_error(what), peer(peer), bucket(bucket) {}
  int peer;
  int bucket;
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual const char* name() const = 0;
  // Waits on a partner (shm and rma flags, p2p requests) give up with PartnerTimeout after
  // `seconds` (0: wait forever, the default).
  virtual void set_timeout(double seconds) { timeout_s_ = seconds; }
  virtual void expect(int from, int64_t step, int bucket) = 0;
  virtual void send(int to, int64_t step, int bucket, const float* data) = 0;
  virtual const float* received(int from, int64_t step, int bucket) = 0;
  virtual void release(int from, int64_t step, int bucket) = 0;
  // Completes local send resources (p2p requests); called after received().
  virtual void finish_send(int to, int64_t step, int bucket) { (void)to, (void)step, (void)bucket; }
  // The flat buffer in memory the partners on this node can reach, when it was asked for and the
  // transport has such memory; nullptr otherwise.
  virtual float* shared_home() { return nullptr; }
  virtual bool pairs_in_place(int peer) const { return (void)peer, false; }
  virtual void publish(int peer, int64_t step, int bucket);
  virtual void average_in_place(int peer, int64_t step, int bucket);
  // Called on every poll of a wait that needs no MPI call itself (shm flags): auto sets it to
  // drive MPI progress, which its p2p half needs from this rank while it waits on a partner of
  // its node (a large send from another node completes only as the receiver's MPI progresses).
  void set_progress(std::function<void()> f) { progress_ = std::move(f); }
  // Called on every poll of a wait for a partner's bucket (received, and the first wait of
  // average_in_place), on the thread that waits: a pipelined exchange starts there the buckets
  // handed over meanwhile. It may send (never receive) other buckets.
  virtual void set_while_waiting(std::function<void()> f) { while_waiting_ = std::move(f); }
  // What this transport moved, per peer; auto reports each of its halves as its own entry.
  virtual std::vector<TransportTraffic> traffic() const;

 protected:
  void progress() const {
    if (progress_) progress_();
  }
  void waiting() const {
    if (while_waiting_) while_waiting_();
  }
  // Counters for `peers` ranks, set up by every transport that moves data itself. They are
  // relaxed atomics: concurrent threading sends and receives on several threads at once.
  void count_peers(int peers);
  void count_sent(int peer, int64_t floats);
  void count_received(int peer, int64_t floats);
  void count_in_place(int peer, int64_t floats);
  double timeout_s_ = 0;
  std::function<void()> progress_;
  std::function<void()> while_waiting_;

 private:
  enum Counter { kBucketsSent, kBytesSent, kBucketsReceived, kBytesReceived, kInPlace, kCounters };
  void add(int peer, Counter c, int64_t n);
  int peers_ = 0;
  std::unique_ptr<std::atomic<int64_t>[]> counters_;  // [peer][Counter]
};

// The layout every transport shares: bucket b covers elements [begin, end) of a flat buffer of
// `count` floats; `links`: the most peers a step sends each bucket to and receives it from (the
// schedule's, partners::links). Only p2p carries more than one; the others refuse it
// (std::invalid_argument, one line naming the fix).
struct BufferLayout {
  int64_t count = 0;
  std::vector<kernels::Bucket> buckets;
  int links = 1;
};

// Isend/Irecv into a private receive buffer (one per link): portable, works everywhere.
std::unique_ptr<Transport> make_p2p_transport(const mpi::Comm& comm, const BufferLayout& layout);

// MPI_Put into the partner's MPI_Win_allocate window over the whole flat buffer, under one
// passive-target epoch (lock_all) for the window's life: each bucket is put as soon as it is
// ready, then an arrival flag in the partner's window; the partner frees the slot with a flag of
// its own. Partners may change every step. (An earlier version synchronised with PSCW epochs:
// with rotating partners it hung now and then in Debian's MPICH 4.0.2 at 4+ ranks.)
std::unique_ptr<Transport> make_rma_transport(const mpi::Comm& comm, const BufferLayout& layout);

// A store straight into the partner's segment of an MPI_Win_allocate_shared window on the node
// communicator, double-buffered by step parity, with ready/done sequence flags per bucket. Only
// for partners on this node; `node` must be comm split by MPI_COMM_TYPE_SHARED.
// With `home`, the window also holds this rank's flat buffer (shared_home()), and partners
// that pair up average it in place.
std::unique_ptr<Transport> make_shm_transport(const mpi::Comm& comm, const mpi::Comm& node,
                                              const BufferLayout& layout, bool home = false);

// shm for partners on this node, p2p for the others (decided per peer; both sides agree). On one
// node it is shm alone, with one rank per node p2p alone. p2p rather than rma across nodes: over
// UCX's tcp transport, Isend/Irecv moved buckets faster than MPI_Put under passive target.
std::unique_ptr<Transport> make_auto_transport(const mpi::Comm& comm, const BufferLayout& layout,
                                               bool home = false);

// The transport of `kind`. shm throws std::invalid_argument when the communicator spans several
// nodes (on every rank, with the same one-line message). `home`: place
// the flat buffer in shared memory where the transport has it (shm, auto), for zero-copy pairs.
std::unique_ptr<Transport> make_transport(TransportKind kind, const mpi::Comm& comm,
                                          const BufferLayout& layout, bool home = false);

}  // namespace gg::gossip
