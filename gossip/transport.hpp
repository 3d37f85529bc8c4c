// How one bucket of a flat buffer travels from a rank to its partner of the step. Each transport
// splits an exchange into a receive half and a send half, so the two halves of one step may go
// through different transports (auto: shared memory to a partner on this node, RMA otherwise).
//
// Protocol for bucket b at step t, on every rank (partners from the schedule):
//   0. begin_step(from, t)       once per step, before any bucket (rma: PSCW post on every
//                                bucket window, so no sender ever waits for a late post)
//   1. expect(from, t, b)        announce readiness to receive a bucket (Irecv, nothing)
//   2. send(to, t, b, data)      move this rank's bucket to `to` (store / put / Isend)
//   3. received(from, t, b)      block until the partner's bucket is here; returns a pointer to
//                                it, valid until release()
//   4. release(from, t, b)       the data has been mixed; the slot may be reused
// Windows and buffers are created once, in the constructor, over the whole flat buffer; they
// are freed in the destructor, which must run before MPI_Finalize.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gossip/mpi.hpp"
#include "kernels/graph.hpp"

namespace gg::gossip {

class Transport {
 public:
  virtual ~Transport() = default;
  virtual const char* name() const = 0;
  virtual void begin_step(int from, int64_t step) { (void)from, (void)step; }
  virtual void expect(int from, int64_t step, int bucket) = 0;
  virtual void send(int to, int64_t step, int bucket, const float* data) = 0;
  virtual const float* received(int from, int64_t step, int bucket) = 0;
  virtual void release(int from, int64_t step, int bucket) = 0;
  // Completes local send resources (p2p requests); called after received().
  virtual void finish_send(int to, int64_t step, int bucket) { (void)to, (void)step, (void)bucket; }
};

// The layout every transport shares: bucket b covers elements [begin, end) of a flat buffer of
// `count` floats.
struct BufferLayout {
  int64_t count = 0;
  std::vector<kernels::Bucket> buckets;
};

// Isend/Irecv into a private receive buffer: portable, works everywhere.
std::unique_ptr<Transport> make_p2p_transport(const mpi::Comm& comm, const BufferLayout& layout);

// MPI_Put into the partner's MPI_Win_allocate window (one per bucket), with generalized
// active-target synchronisation (post/start/complete/wait on one-member groups). Known issue:
// hangs seen at 3+ ranks with MPICH 4.0.2 when partners rotate; reliable at 2 ranks.
std::unique_ptr<Transport> make_rma_transport(const mpi::Comm& comm, const BufferLayout& layout);

// A store straight into the partner's segment of an MPI_Win_allocate_shared window on the node
// communicator, double-buffered by step parity, with ready/done sequence flags per bucket. Only
// for partners on this node; `node` must be comm split by MPI_COMM_TYPE_SHARED.
std::unique_ptr<Transport> make_shm_transport(const mpi::Comm& comm, const mpi::Comm& node,
                                              const BufferLayout& layout);

// shm for partners on this node, p2p for the others (decided per peer; both sides agree). Not
// rma: with Debian's MPICH 4.0.2, PSCW epochs whose groups rotate from step to step hung at 3+
// ranks in our tests (tests/gossip/mpi_gossip.cpp), while p2p was also faster.
std::unique_ptr<Transport> make_auto_transport(const mpi::Comm& comm, const BufferLayout& layout);

// "p2p" | "rma" | "shm" | "auto"; throws std::invalid_argument otherwise. shm throws when the
// communicator spans several nodes.
std::unique_ptr<Transport> make_transport(const std::string& name, const mpi::Comm& comm,
                                          const BufferLayout& layout);

}  // namespace gg::gossip
