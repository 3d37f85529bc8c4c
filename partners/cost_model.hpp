// The scaling simulator's cost model: the time of one training step at p ranks, for gossip over
// the exact partner schedule and for ring and Rabenseifner allreduce, with the overlap rules the
// trainer uses (a bucket starts exchanging when backward completes it; the link serves buckets in
// order; the model exchange of `both` runs behind the next step's forward). Links follow the
// alpha-beta(-gamma) model: a message of n bytes costs alpha + n / bandwidth, and mixing n bytes
// locally costs n / mix_bandwidth. Pure functions, no MPI.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "partners/schedule.hpp"

namespace gg::partners {

struct Network {
  double inter_latency_s = 2e-6;        // alpha between nodes
  double inter_bandwidth_Bps = 12.5e9;  // per node (its NIC), shared by its ranks
  double intra_latency_s = 1e-6;        // alpha within a node
  double intra_bandwidth_Bps = 20e9;    // per rank, within a node
  double mix_bandwidth_Bps = 50e9;      // local averaging/reduction: bytes of one operand per s
  int ranks_per_node = 1;
};

struct Workload {
  double forward_s = 0;   // one step's forward pass on one rank
  double backward_s = 0;  // its backward pass (buckets complete during it)
  double update_s = 0;    // the optimizer step
  // Gradient bytes per bucket in fp32, in the order backward completes them (allreduce sends
  // them so; gossip's lossy wires fewer: GossipMode). Bucket i is ready at
  // forward_s + backward_s * (bytes of buckets 0..i) / (all bytes).
  std::vector<int64_t> bucket_bytes;
  int64_t batch_per_rank = 1;
  int64_t total_bytes() const;
};

enum class Method { Gossip, RingAllreduce, RabenseifnerAllreduce };
const char* method_name(Method m);

struct StepPrediction {
  double compute_s = 0;  // forward + backward + update
  double comm_s = 0;     // time the busiest rank's link spends on this step's exchanges
  double exposed_s = 0;  // communication not hidden behind compute
  double step_s = 0;
  double efficiency = 0;    // compute_s / step_s: per-rank throughput against no communication
  double images_per_s = 0;  // all ranks together
};

struct GossipMode {
  bool grad = true;           // average gradients (during backward)
  bool model = true;          // average weights after the update
  bool momentum = false;      // the SGD momentum travels with the weights (as many bytes again)
  bool overlap_model = true;  // the weights' exchange behind the next step's forward and backward;
                              // false: right after the update, before the next forward (exposed)
  // The bytes an fp32 bucket of this many bytes takes on the gradients' and the weights' (and
  // momentum's) wire (gossip/comm/wire.hpp's wire_floats; empty: fp32, as they are).
  std::function<int64_t(int64_t)> grad_wire = {}, model_wire = {};
  int64_t global_every = 0;  // an exact global average of the weights every H steps (0: none),
  int64_t global_bytes = 0;  // of this many bytes, by a Rabenseifner allreduce, not overlapped
};

// Gossip at p = schedule.p: the mean over steps [0, steps) of the slowest rank's step time. A
// partner on the same node (rank / ranks_per_node) is reached over the intra-node link; the ranks
// of a node sending off-node in the same step share its NIC.
StepPrediction predict_gossip(const Schedule& schedule, GossipMode mode, const Network& net,
                              const Workload& w, int steps);

// Allreduce of every bucket as it is ready (the trainer's allreduce mode) at p ranks laid out
// node by node. Ring: 2(p-1) messages of n/p; Rabenseifner: recursive halving + doubling,
// 2 log2(p) messages (p rounded down to a power of two, as MPICH does, plus two extra messages).
StepPrediction predict_allreduce(Method m, int p, const Network& net, const Workload& w);

// Time of one allreduce of `bytes` at p ranks (no overlap), for tests and tables.
double allreduce_seconds(Method m, int p, int64_t bytes, const Network& net);

}  // namespace gg::partners
