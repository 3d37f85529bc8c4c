// Mixing rules: what a gossip exchange does with this rank's buckets and its partner's, apart from
// how the bytes move (the engine, exchange.hpp) and how they are coded on the wire (wire.hpp).
// A rule sees one flat buffer cut into buckets; the engine tells it when a bucket is ready, when
// the partner's copy of it arrived, and when the step ends. No MPI: every rule is tested alone on
// hand-computed values (tests/gossip/comm/test_rules.cpp). A rule may lock its own state (the
// partner's bucket arrives on a communication thread while the compute thread ends the step).
//
// The rules here are the policies the gossip algorithms compose (see docs/gossip.md, "Adding a
// gossip algorithm"): the pair average x = (x + x_partner) / 2 when the partner's bucket arrives
// (staleness 0), with the partner's latest bucket at the step's end (staleness 1, late =
// previous | skip), or as a correction applied later (the overlapped weight exchange).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "kernels/graph.hpp"

namespace gg::gossip {

// Staleness 1, since the start: buckets a step mixed from the partner's previous step (late:
// this step's had not arrived) and buckets it could not mix at all (nothing arrived yet).
struct Lateness {
  int64_t late = 0, unmixed = 0;
};

class MixingRule {
 public:
  virtual ~MixingRule() = default;
  // Bucket b is final on this rank (the compute thread). A rule that sends a copy takes it now;
  // with waits() false the engine calls it only once b's previous exchange is over.
  virtual void capture(int b) { (void)b; }
  // What goes out for bucket b: the buffer's values or the copy taken.
  virtual const float* outgoing(int b) const = 0;
  // The partner's bucket b, exchanged in `step`, as fp32 values (a communication thread).
  virtual void received(int b, int64_t step, const float* partner) = 0;
  // True: a step waits until every one of its buckets is received; false: finish() mixes what
  // has arrived and never waits.
  virtual bool waits() const { return true; }
  // The end of `step` (the compute thread, after the waits).
  virtual void finish(int64_t step) { (void)step; }
  // Whether the bucket may be averaged in place by the transport (zero-copy shm pairs): the
  // rule sends the buffer itself and writes the pair average into it on arrival.
  virtual bool pair_average_in_place() const { return false; }
  virtual Lateness lateness() const { return {}; }
  // Consensus control (gossip.consensus_bound): with measure_distance(true) a rule adds up
  // ||x - partner||^2 over the buckets it mixes, before mixing them; take_distance() returns the
  // sum since its last call and starts a new one. Off by default (a pass over every bucket).
  // distance() reads the sum without taking it (a rank's state carries it across a checkpoint);
  // reset_distance(d) replaces it (a restored state) and returns what it was.
  void measure_distance(bool on) { measure_ = on; }
  bool measuring() const { return measure_; }
  double take_distance() { return reset_distance(0); }
  double distance() const {
    std::lock_guard lock(distance_mu_);
    return distance_;
  }
  double reset_distance(double d) {
    std::lock_guard lock(distance_mu_);
    const double was = distance_;
    distance_ = d;
    return was;
  }

 protected:
  // A rule adds what it measured (a communication thread).
  void add_distance(double d) {
    std::lock_guard lock(distance_mu_);
    distance_ += d;
  }

 private:
  bool measure_ = false;
  double distance_ = 0;
  mutable std::mutex distance_mu_;
};

// Staleness 0: x = (x + partner) / 2 as each bucket arrives.
class PairAverage final : public MixingRule {
 public:
  PairAverage(float* buffer, std::vector<kernels::Bucket> buckets);
  const float* outgoing(int b) const override;
  void received(int b, int64_t step, const float* partner) override;
  bool pair_average_in_place() const override { return true; }

 private:
  float* x_;
  std::vector<kernels::Bucket> buckets_;
};

// Staleness 1: a bucket is sent as it was when ready; at the step's end each bucket is averaged
// with the partner's latest one: this step's, else the previous step's (skip_late: left unmixed,
// as is a bucket of which nothing has arrived yet).
class StaleAverage final : public MixingRule {
 public:
  StaleAverage(float* buffer, std::vector<kernels::Bucket> buckets, bool skip_late);
  void capture(int b) override;
  const float* outgoing(int b) const override;
  void received(int b, int64_t step, const float* partner) override;
  bool waits() const override { return false; }
  void finish(int64_t step) override;
  Lateness lateness() const override;

 private:
  float* x_;
  std::vector<kernels::Bucket> buckets_;
  bool skip_late_;
  std::vector<float> sent_, latest_;  // as sent; the partner's latest
  std::vector<int64_t> latest_step_;  // step of latest_'s bucket b, -1 = none yet
  Lateness lateness_;
  mutable std::mutex mu_;  // latest_, latest_step_, lateness_
};

// Overlapped averaging: snapshot() keeps the buffer as it is sent; as the partner's buckets
// arrive, the correction (partner - sent) / 2 is computed, and apply() adds it to the buffer,
// which may have moved meanwhile (it equals the pair average when the buffer did not move).
class DelayedAverage final : public MixingRule {
 public:
  DelayedAverage(float* buffer, std::vector<kernels::Bucket> buckets);
  void snapshot();
  const float* outgoing(int b) const override;
  void received(int b, int64_t step, const float* partner) override;
  void apply();
  std::vector<float>& delta() { return delta_; }
  // An exchange was started and its correction not applied yet; ... and already computed.
  bool pending = false, settled = false;

 private:
  float* x_;
  std::vector<kernels::Bucket> buckets_;
  std::vector<float> sent_, delta_;
};

}  // namespace gg::gossip
