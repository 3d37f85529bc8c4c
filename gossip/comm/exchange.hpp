// The exchange engine seam: the trainer announces each bucket as backward completes it and
// waits for the mixed gradients before the optimizer step. Exchanges implement this interface
// (gossip over the transports of transport.hpp, the allreduce baseline, the node hierarchy).
// GossipExchange is the engine alone: it queues buckets, drives the transport from its
// communication threads and records the timeline; what it mixes is a rule's (rules.hpp), how the
// values travel a codec's (wire.hpp).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gossip/comm/bucket_queue.hpp"
#include "gossip/comm/exchange_options.hpp"
#include "gossip/comm/mpi.hpp"
#include "gossip/comm/rules.hpp"
#include "gossip/comm/timeline.hpp"
#include "gossip/comm/transport.hpp"
#include "gossip/comm/wire.hpp"
#include "kernels/graph.hpp"
#include "kernels/param_layout.hpp"
#include "partners/schedule.hpp"

namespace gg::gossip {

// Exchanges the buckets of one flat buffer (gradients, or weights after the update) every step.
class BucketExchange {
 public:
  virtual ~BucketExchange() = default;
  virtual const char* name() const = 0;
  // Whether it mixes host memory (a device state's host copies, staged by the trainer around
  // it), or the device memory it was given (cuda_ipc_exchange.hpp).
  virtual bool host_memory() const { return true; }
  // Called before the step's first bucket is ready (before backward of step `step`).
  virtual void begin_step(int64_t step) = 0;
  // Called from backward (the compute thread) when bucket b's gradients are final.
  virtual void on_bucket_ready(int bucket) = 0;
  // Blocks until every bucket of this step is mixed; returns the seconds it blocked (the exposed
  // communication time).
  virtual double finish_step() = 0;
  // Step numbering across a resume or a rollback. set_first_step: the first step this process
  // exchanges (a resumed run, or exchanges rebuilt mid-run); repeat_steps: the next `n` steps
  // repeat steps already exchanged (a rollback). Both at a step boundary; exchanges that keep no
  // per-step state (allreduce) ignore them.
  virtual void set_first_step(int64_t step) { (void)step; }
  virtual void repeat_steps(int64_t n) { (void)n; }
  // Each bucket's exchange becomes an event on its communication thread (nullptr: none).
  void set_timeline(Timeline* t) { timeline_ = t; }
  // Bytes this rank has sent so far, every peer together (0 where MPI moves them: allreduce).
  virtual int64_t bytes_sent() const { return 0; }
  // Staleness 1: what the steps could not mix fresh (rules.hpp).
  using Lateness = gossip::Lateness;
  virtual Lateness lateness() const { return {}; }
  // The same over every rank this process holds (virtual ranks: all of them; else this rank's).
  virtual Lateness held_lateness() const { return lateness(); }
  // What the exchange keeps from step to step (its rule's and its codec's parts, state_part.hpp),
  // saved into a rank's state and loaded back (no parts: start again from nothing), and what it
  // shares with peers whose state was replaced by another rank's dropped. Exchanges that keep
  // nothing (allreduce) have nothing to save.
  virtual void save_state(std::vector<StatePart>& out, const StateLayout& layout) const {
    (void)out;
    (void)layout;
  }
  virtual void load_state(std::span<const StatePart> parts, const StateLayout& layout) {
    (void)parts;
    (void)layout;
  }
  virtual void forget_peers(const std::vector<int>& lost) { (void)lost; }

 protected:
  Timeline* timeline_ = nullptr;
};

// An exchange of what the update wrote (the weights, the momentum with them), as the trainer
// drives it between steps: all at once, overlapped behind the next step's compute, or pipelined
// into the next forward. GossipExchange below over the transports, and virtual ranks' exchange
// over every rank one process holds (gossip/train/virtual_exchange.hpp).
class WeightExchange : public BucketExchange {
 public:
  // Every bucket at once (model averaging after the update); returns the seconds it took.
  virtual double exchange_all(int64_t step) = 0;
  // The same exchange behind the next forward (gossip.pipeline_weights): start_all queues every
  // bucket, the highest index first (the first layers': forward reads them first), wait_bucket
  // blocks until bucket b is mixed (forward's bucket gate), finish_step ends the round. Both
  // return the seconds they waited.
  virtual void start_all(int64_t step) = 0;
  virtual double wait_bucket(int b) = 0;
  // Overlapped averaging (options.delayed): start_delayed snapshots the buffer and exchanges the
  // snapshot in the background; finish_delayed waits for it and adds the correction
  // (x_partner - x_snapshot) / 2 to the buffer, which may have changed meanwhile. Returns the
  // seconds it waited; does nothing when no exchange is pending.
  virtual void start_delayed(int64_t step) = 0;
  virtual double finish_delayed() = 0;
  // Checkpoints and snapshots of the delayed exchange: delayed_delta() is the correction a
  // pending exchange will apply, computed without applying it (empty when none is pending), and
  // set_delayed_delta() makes a saved one pending again, applied by the next finish_delayed().
  virtual std::vector<float> delayed_delta() = 0;
  virtual void set_delayed_delta(const std::vector<float>& delta) = 0;
  // With options.measure_distance: for each rank this process holds, the sum of
  // ||x - partner||^2 over the buckets mixed since the last call (rules.hpp, take_distance).
  virtual std::vector<double> take_distances() = 0;
  // The sum not taken yet (one rank per process), and its replacement by a restored state's
  // (resume, rollback).
  virtual double distance() const = 0;
  virtual void restore_distance(double d) = 0;
};

// The allreduce baseline: every bucket is averaged over all ranks with MPI_Allreduce on a
// communication thread that owns its own communicator, so it overlaps the rest of backward.
class AllreduceExchange final : public BucketExchange {
 public:
  AllreduceExchange(const mpi::Comm& world, float* grads, std::vector<kernels::Bucket> buckets);
  ~AllreduceExchange() override;
  const char* name() const override { return "allreduce"; }
  void begin_step(int64_t step) override;
  void on_bucket_ready(int bucket) override;
  double finish_step() override;

 private:
  void loop();

  mpi::Comm comm_;
  float* grads_;
  std::vector<kernels::Bucket> buckets_;
  int ranks_;
  int64_t step_ = 0;  // of the buckets queued
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<int> queue_;
  size_t done_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread worker_;
};

// The mixing rule an exchange with options `o` runs over `buffer`: o.rule's, from exchange.cpp's
// table; for the average, the pair average (uniform over k links), the partner's latest bucket
// (staleness 1), the overlapped correction (delayed), or a compressing rule (its own header
// beside rules.hpp), as the options ask. The engine below and virtual ranks
// (gossip/train/virtual.hpp) both take their rules from here.
// `rank`: the rank the rule runs for (a rule may orient a pair by it).
std::unique_ptr<MixingRule> make_rule(const GossipOptions& o, float* buffer,
                                      const std::vector<kernels::Bucket>& buckets, int rank);
// What the rules of `o` read of the model whose flat buffer it exchanges (the tensors of a rule
// that compresses them), filled in from the graph and the buffer's layout. Options that would
// gain nothing on `model`: std::invalid_argument, naming the option and what would.
void fit_to_model(GossipOptions& o, const kernels::Graph& g, const kernels::ParamLayout& layout,
                  const std::string& model);
// A step whose links carry the schedule's weights, for a rule that mixes uniformly:
// std::logic_error (the engine and virtual ranks call it before the step's first bucket).
void check_weights(const MixingRule& rule, const partners::Partners& peers);
// How many peers a step of `o`'s schedule gives each rank (1 at p = 1).
int links_of(const GossipOptions& o);
// What goes on the wire for each bucket: the buckets themselves, or the messages of a rule that
// sends its own instead (o.rule's table line says which).
std::vector<kernels::Bucket> wire_buckets(const GossipOptions& o,
                                          const std::vector<kernels::Bucket>& buckets);
// Bucket b as it goes on the wire: the rule's outgoing values encoded by the codec, shown back to
// a rule that echoes() as the partner will decode them (the engine and virtual ranks alike).
// key: the stochastic rounding key of this rank's exchange (wire_key), if the codec rounds so.
const float* encode_outgoing(MixingRule& rule, WireCodec& codec, int b, uint64_t key = 0);

// Gossip: bucket b is averaged with the same bucket of this step's partner, x = (x + x_from) / 2,
// where the schedule says who sends to whom. Transports move the bytes; threading decides who
// drives them:
//   funneled    one communication thread starts every ready bucket, then completes them
//   concurrent  several threads, each exchanging a whole bucket (MPI_THREAD_MULTIPLE)
//   chained     one thread, one bucket at a time, strictly in bucket order
// With staleness 1 a bucket is copied aside when it is ready, and finish_step mixes whatever the
// partner's latest completed bucket is (this step's or the previous one's; with skip_late only
// this step's, otherwise the bucket stays unmixed) without waiting; a bucket is queued again only
// once its previous exchange is complete (staleness bounded by 1).
//
// buffer == nullptr asks the exchange to provide the flat buffer (buffer()): in the shm
// transport's window where it has one, so that partners that pair up in a step (send_to ==
// recv_from: every step at p = 2, hypercube, every other step of dissemination at p = 4) average
// it in place with no copy (see transport.hpp); in private memory otherwise.
class GossipExchange final : public WeightExchange {
 public:
  GossipExchange(const mpi::Comm& world, float* buffer, std::vector<kernels::Bucket> buckets,
                 GossipOptions o);
  ~GossipExchange() override;
  const char* name() const override { return "gossip"; }
  void begin_step(int64_t step) override;
  void on_bucket_ready(int bucket) override;
  double finish_step() override;
  double exchange_all(int64_t step) override;
  void start_all(int64_t step) override;
  double wait_bucket(int b) override;
  void start_delayed(int64_t step) override;
  double finish_delayed() override;
  // settle_delayed() waits for a pending exchange and computes its correction without applying
  // it (the numbers stay those of an uninterrupted run): what delayed_delta() returns.
  void settle_delayed();
  std::vector<float> delayed_delta() override;
  void set_delayed_delta(const std::vector<float>& delta) override;
  // Transports count their steps from the first one this process exchanges, as in a fresh run,
  // while partners follow the global step; after a rollback the transports keep counting up, as
  // their sequence flags require, while the partners repeat.
  void set_first_step(int64_t step) override { first_step_ = step; }
  void repeat_steps(int64_t n) override { first_step_ -= n; }
  partners::Partners partners_at(int64_t step) const;
  float* buffer() const { return buffer_; }
  // Whether a bucket exchanged in `step` is averaged in place (no copy).
  bool in_place(const partners::Partners& peers) const;
  // What the transport moved to and from each rank since the exchange was made, one entry per
  // transport (auto: one for each of its halves), so that a test can tell which carried what.
  std::vector<TransportTraffic> transport_counters() const { return transport_->traffic(); }
  int64_t bytes_sent() const override;
  Lateness lateness() const override;
  void save_state(std::vector<StatePart>& out, const StateLayout& layout) const override {
    rule_->save_state(out, layout);
    codec_.save_state(out, layout);
  }
  void load_state(std::span<const StatePart> parts, const StateLayout& layout) override {
    rule_->load_state(parts, layout);
    codec_.load_state(parts, layout);
  }
  void forget_peers(const std::vector<int>& lost) override { rule_->forget_peers(lost); }
  // With options.measure_distance: sum of ||x - partner||^2 over the buckets mixed since the last
  // call (rules.hpp, take_distance).
  double take_distance() { return rule_->take_distance(); }
  std::vector<double> take_distances() override { return {take_distance()}; }
  double distance() const override { return rule_->distance(); }
  void restore_distance(double d) override { rule_->reset_distance(d); }

 private:
  using Job = BucketQueue::Job;
  void queue_all(int64_t step);  // begin_step, then every bucket ready
  void worker(int id);
  void run(std::vector<Job>& batch);
  void start(Job& j);
  void complete(const Job& j);
  void mark_done(const Job& j);
  void complete_and_mark(const Job& j);
  void run_pipelined(std::vector<Job>& batch);
  void start_queued();  // pipelined: starts the buckets queued meanwhile (transport waits)
  // The bound of the compute thread's waits for the communication threads: longer than the
  // transports' own (timeout_s per wait on a partner), so that their more precise line wins.
  double engine_limit() const { return 2 * o_.timeout_s; }
  DelayedAverage& delayed();  // the rule of an exchange built with options.delayed

  mpi::Comm comm_;
  GossipOptions o_;
  std::vector<kernels::Bucket> buckets_;
  WireCodec codec_;
  std::unique_ptr<Transport> transport_;
  float* buffer_;
  std::vector<float> own_;  // buffer() when asked for and not in shared memory
  std::unique_ptr<MixingRule> rule_;
  int64_t first_step_ = 0;  // transports see step - first_step_
  BucketQueue queue_;
  // Pipelined (funneled: one communication thread, the only one to touch it): the buckets on
  // the wire and not yet mixed, oldest first.
  std::deque<Job> started_;
  std::vector<std::thread> workers_;
};

}  // namespace gg::gossip
