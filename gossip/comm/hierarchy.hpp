// gossip.hierarchy = node: two-level gossip. Every bucket is first averaged exactly inside each
// node (MPI_Reduce_scatter over the node's K ranks: local rank l ends with slice l of the node's
// average), then slice l is exchanged with local rank l of the partner node (the schedule runs
// over nodes; one "rail" communicator per local rank, so every rank's link is busy with 1/K of
// the bucket) and mixed, (mine + partner's) / 2, and the node's mixed slices are gathered back
// into every local rank's bucket (MPI_Allgatherv). After a step every rank of a node holds the
// same values: the mix of its node's average with the partner node's. The buckets are pipelined:
// the communication thread starts each bucket's reduce-scatter as soon as backward hands it over
// and drives every bucket in flight through its three phases at once (nonblocking collectives;
// the reduce-scatters and the allgathers each on a communicator of their own, started in bucket
// order on every rank), so the link carries one bucket while the node averages the next.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "gossip/comm/exchange.hpp"
#include "gossip/comm/mpi.hpp"
#include "kernels/graph.hpp"
#include "partners/schedule.hpp"

namespace gg::gossip {

// Nodes of a job: this rank's node communicator and its place among the nodes.
struct NodeLayout {
  int nodes = 1;     // how many
  int node = 0;      // this rank's node, 0..nodes-1, in the order of the nodes' lowest ranks
  int local = 0;     // this rank within its node
  int per_node = 1;  // ranks on every node
};
// A collective over `world` (node = world.split_shared()). Throws std::invalid_argument naming
// the sizes when the nodes hold different numbers of ranks.
NodeLayout node_layout(const mpi::Comm& world, const mpi::Comm& node);

class HierarchicalExchange final : public BucketExchange {
 public:
  // `schedule`'s kind, rotation and seed make the schedule over the nodes (its p becomes the
  // number of nodes). `timeout_s` bounds a wait on the partner node (0: none).
  HierarchicalExchange(const mpi::Comm& world, float* buffer, std::vector<kernels::Bucket> buckets,
                       partners::Schedule schedule, double timeout_s);
  ~HierarchicalExchange() override;
  const char* name() const override { return "hierarchy"; }
  void begin_step(int64_t step) override;
  void on_bucket_ready(int bucket) override;
  double finish_step() override;
  int64_t bytes_sent() const override;
  const NodeLayout& layout() const { return layout_; }
  // The partner nodes of this rank's node at `step` (the schedule's own step count, which goes on
  // across a resume): {send_to, recv_from}.
  partners::Partners node_partners(int64_t step) const;

 private:
  struct Flight;  // a bucket between its reduce-scatter and its allgather
  void loop();
  void start(Flight& f);    // its reduce-scatter
  bool advance(Flight& f);  // its next phase, if the one under way is over; true: progress
  bool start_gathers(std::deque<Flight>& flights);  // of the mixed buckets, in bucket order
  bool retire(std::deque<Flight>& flights);         // the gathered buckets: done
  void fail(std::deque<Flight>& flights);           // the current exception ends the exchange
  void check_time(const Flight& f) const;           // throws when a phase outlasts timeout_s_
  std::vector<int> counts(int bucket) const;        // the node's slices of a bucket
  std::vector<int> displs(int bucket) const;

  mpi::Comm node_, gather_, rail_;
  NodeLayout layout_;
  partners::Schedule schedule_;
  float* buffer_;
  std::vector<kernels::Bucket> buckets_;
  double timeout_s_;
  std::vector<std::vector<float>> slice_,
      incoming_;  // per bucket: this rank's slice, the partner's
  int64_t step_ = 0;
  int64_t bytes_sent_ = 0;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<int, int64_t>> queue_;  // (bucket, step) handed over, not yet started
  size_t in_flight_ = 0;                       // started and not yet gathered
  size_t done_ = 0;
  uint64_t progress_ = 0;  // buckets finished, ever (bounds the compute thread's waits)
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread worker_;
};

}  // namespace gg::gossip
