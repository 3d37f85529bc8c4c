// Virtual ranks' exchanges (train.virtual_ranks, gossip/train/virtual.hpp): each exchanges one
// flat buffer (the gradients, the weights or the momentum) of every rank one process holds, as
// the engine exchanges it between real ranks, and plugs into the trainer where a real rank's
// exchange would. Ranks join one by one (add_rank), so that the first can be measured before
// the others are made.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "gossip/comm/exchange.hpp"
#include "gossip/comm/rules.hpp"
#include "gossip/comm/wire.hpp"
#include "kernels/tensor.hpp"
#include "partners/schedule.hpp"

namespace gg::gossip {

// The lateness model of staleness 1 (train.virtual_late): whether rank r's partner's buckets of
// `step` arrive after r's step has ended. Empty: never.
using LateModel = std::function<bool(int64_t step, int rank)>;
// Late when a hash of (seed, exchange, step, rank), uniform in [0, 1), falls below `share`: the
// same draws on every run and machine. `exchange` tells the gradients' (0) from the weights' (1).
LateModel late_model(double share, uint64_t seed, uint64_t exchange);

// What an exchange of the held ranks is told as they are made.
class HeldRanks {
 public:
  virtual ~HeldRanks() = default;
  // The next rank's buffer (its number is the count so far).
  virtual void add_rank(float* x) = 0;
  // What a rank's state grows by over `exchanges` exchanges as it meets partners.
  virtual int64_t growth_bytes(int64_t exchanges) const {
    (void)exchanges;
    return 0;
  }
};

// Gossip: each rank's mixing rule (make_rule: the pair average, or, overlapped, the correction
// (partner - sent) / 2 applied before the next update; either with CHOCO's public copies) and its
// wire codec (and its residue). Every rank's outgoing image is taken before any rank mixes, as on
// real ranks, where a bucket is sent before the partner's arrives. As gradients' exchange, a
// step's exchange happens in finish_step; as weights', in exchange_all or start_delayed (then
// finish_delayed applies the corrections). bytes_sent and lateness are rank 0's, as its metrics
// report them; held_lateness is every rank's.
class VirtualExchange final : public WeightExchange, public HeldRanks {
 public:
  // o: the wire, error feedback, delayed (overlapped), staleness, skip_late and measure_distance
  // of a real rank's exchange, and the schedule.
  VirtualExchange(const GossipOptions& o, const std::vector<kernels::Bucket>& buckets,
                  LateModel late = {});
  const char* name() const override { return "virtual gossip"; }
  void add_rank(float* x) override;
  int64_t growth_bytes(int64_t exchanges) const override;

  void begin_step(int64_t step) override { step_ = step; }
  void on_bucket_ready(int bucket) override { (void)bucket; }
  double finish_step() override;
  double exchange_all(int64_t step) override;
  void start_delayed(int64_t step) override { exchange(step); }
  double finish_delayed() override;
  std::vector<double> take_distances() override;
  int64_t bytes_sent() const override { return bytes_; }
  Lateness lateness() const override;
  Lateness held_lateness() const override;
  // Refused before a virtual run starts (check_virtual): pipelined weights, checkpoints.
  void start_all(int64_t step) override;
  double wait_bucket(int b) override;
  std::vector<float> delayed_delta() override;
  void set_delayed_delta(const std::vector<float>& delta) override;
  double distance() const override;
  void restore_distance(double d) override;

 private:
  // Every rank sends its buffer to each link's send_to and mixes what each recv_from sent, link
  // by link, in exchange `step`.
  void exchange(int64_t step);
  int64_t bytes_per_rank() const;

  GossipOptions options_;
  std::vector<kernels::Bucket> buckets_;
  std::vector<std::unique_ptr<WireCodec>> codecs_;
  std::vector<std::unique_ptr<MixingRule>> rules_;
  std::vector<std::vector<float>> images_;  // every rank's outgoing image, the codec's floats
  LateModel late_;
  int stream_ = 0;  // wire_key's stream: which buffer
  int64_t step_ = 0;
  int64_t bytes_ = 0;
  bool pending_ = false;  // overlapped: corrections not yet applied
};

// The allreduce baseline: every rank's buffer becomes the mean over the ranks, summed in MPICH's
// order (tree_sum.hpp).
class VirtualAllreduce final : public BucketExchange, public HeldRanks {
 public:
  explicit VirtualAllreduce(int64_t n) : n_(n) {}
  const char* name() const override { return "virtual allreduce"; }
  void add_rank(float* x) override { x_.push_back(x); }
  void begin_step(int64_t step) override { (void)step; }
  void on_bucket_ready(int bucket) override { (void)bucket; }
  double finish_step() override;

 private:
  int64_t n_;
  std::vector<float*> x_;
};

// gossip.hierarchy = node (mode grad) on logical nodes of K consecutive ranks, as
// HierarchicalExchange does it: each node's average (the sum in tree_sum's order, which is MPI's
// reduce-scatter's for K = 2: one addition; for larger K MPI may add in another order), the
// pair average with the partner node's (the schedule over the nodes), the result in every rank
// of the node. Real ranks mix it slice by slice over the rails; the values are the same. Done a
// chunk of values at a time: one chunk of every node is held, not a copy of every node's buffer.
class VirtualHierarchy final : public BucketExchange, public HeldRanks {
 public:
  static constexpr size_t kChunk = 1024;
  // `schedule` is over the ranks' count; the nodes' schedule is made from it.
  VirtualHierarchy(int64_t n, int per_node, const partners::Schedule& schedule,
                   const std::vector<kernels::Bucket>& buckets);
  const char* name() const override { return "virtual hierarchy"; }
  void add_rank(float* x) override { x_.push_back(x); }
  void begin_step(int64_t step) override { step_ = step; }
  void on_bucket_ready(int bucket) override { (void)bucket; }
  double finish_step() override;
  int64_t bytes_sent() const override { return bytes_; }
  // The scratch memory of `ranks` ranks on nodes of `per_node`.
  static int64_t bytes(int ranks, int per_node);

 private:
  std::vector<float*> x_;
  size_t n_;
  int k_;
  partners::Schedule schedule_;
  int64_t step_ = 0;
  int64_t per_step_ = 0;  // what local rank 0 sends a step: its slice of every bucket
  int64_t bytes_ = 0;
};

}  // namespace gg::gossip
