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
// previous | skip), or as a correction applied later (the overlapped weight exchange); and
// CHOCO-SGD's public copies (ChocoAverage, ChocoDelayed): the difference to a copy both partners
// hold travels instead of the values.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <utility>
#include <vector>

#include "gossip/comm/state_part.hpp"
#include "kernels/graph.hpp"
#include "partners/schedule.hpp"

namespace gg::gossip {

// One of CHOCO-SGD's public copies, as a rank's state holds it: with `mine`, this rank's values
// as `peer` knows them; otherwise peer's values as this rank knows them. Low-rank gossip keeps
// its factors per partner in the same form (low_rank.hpp).
struct PublicCopy {
  int peer = 0;
  bool mine = false;
  std::vector<float> values;
};

// Such copies as a state part of `kind` (state_part.hpp), values as they are given, and back
// (std::runtime_error for a malformed part).
StatePart copies_part(std::string kind, const std::vector<PublicCopy>& copies);
std::vector<PublicCopy> read_copies(const StatePart& p);
inline constexpr uint32_t kCopiesVersion = 1;

class MixingRule;
// The copies of `kind` among saved parts (none: empty), and those rule `r` saves, values in its
// buffer's layout: what a test compares between the two ends of a pair.
std::vector<PublicCopy> copies_in(std::span<const StatePart> parts, std::string_view kind);
std::vector<PublicCopy> saved_copies(const MixingRule& r, std::string_view kind);

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
  // The step's partners, before its first bucket is ready (the compute thread; the previous
  // step's buckets are all mixed).
  virtual void begin_step(int64_t step, const partners::Partners& peers) {
    (void)step;
    (void)peers;
  }
  // What goes out for bucket b: the buffer's values, the copy taken, or a difference (the thread
  // that sends b).
  virtual const float* outgoing(int b) = 0;
  // With echoes(): bucket b as the partner will decode it, right after it was encoded (the
  // thread that sends b, before it receives b).
  virtual bool echoes() const { return false; }
  virtual void sent(int b, const float* decoded) {
    (void)b;
    (void)decoded;
  }
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
  // Whether the rule mixes with the weights a schedule gives (Partners::weighted); the engine
  // refuses a weighted step to a rule that mixes uniformly (check_weights).
  virtual bool takes_weights() const { return false; }
  virtual Lateness lateness() const { return {}; }
  // What the rule keeps from step to step beside the buffer, as a rank's state holds it
  // (state_part.hpp; most rules keep nothing): save_state appends its part to `out`, its values
  // in the plain layout; load_state replaces it by the part of its kind among `parts` (none, or
  // no parts at all: start again from nothing) and throws std::invalid_argument for one that
  // does not fit the buffer. forget_peers drops what the rule shares with ranks whose state was
  // replaced by another rank's (a pair holds the same on both ends).
  virtual void save_state(std::vector<StatePart>& out, const StateLayout& layout) const {
    (void)out;
    (void)layout;
  }
  virtual void load_state(std::span<const StatePart> parts, const StateLayout& layout) {
    (void)parts;
    (void)layout;
  }
  virtual void forget_peers(const std::vector<int>& lost) { (void)lost; }
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

// Staleness 0: x = (x + partner) / 2 as each bucket arrives. With k links a step, the partners'
// buckets are added as they arrive (in link order) and the last one ends the uniform average,
// x = (x + p_1 + ... + p_k) / (k + 1); the engine finishes every send of a bucket before its
// first arrival changes it.
class PairAverage final : public MixingRule {
 public:
  PairAverage(float* buffer, std::vector<kernels::Bucket> buckets);
  void begin_step(int64_t step, const partners::Partners& peers) override;
  const float* outgoing(int b) override;
  void received(int b, int64_t step, const float* partner) override;
  bool pair_average_in_place() const override { return true; }
  bool takes_weights() const override { return true; }

 private:
  float* x_;
  std::vector<kernels::Bucket> buckets_;
  int links_ = 1;
  partners::Partners peers_;  // the step's, with their weights
  std::vector<int> arrived_;  // this step's arrivals of each bucket (k links)
};

// Staleness 1: a bucket is sent as it was when ready; at the step's end each bucket is averaged
// with the partner's latest one: this step's, else the previous step's (skip_late: left unmixed,
// as is a bucket of which nothing has arrived yet).
class StaleAverage final : public MixingRule {
 public:
  StaleAverage(float* buffer, std::vector<kernels::Bucket> buckets, bool skip_late);
  void capture(int b) override;
  const float* outgoing(int b) override;
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
class DelayedAverage : public MixingRule {
 public:
  DelayedAverage(float* buffer, std::vector<kernels::Bucket> buckets);
  void snapshot();
  const float* outgoing(int b) override;
  void received(int b, int64_t step, const float* partner) override;
  void apply();
  std::vector<float>& delta() { return delta_; }
  // An exchange was started and its correction not applied yet; ... and already computed.
  bool pending = false, settled = false;

 protected:
  float* x_;
  std::vector<kernels::Bucket> buckets_;
  std::vector<float> sent_, delta_;
};

// CHOCO-SGD's public copies (Koloskova, Stich, Jaggi 2019), kept per partner: mine(), this
// rank's values as this step's send_to knows them, and theirs(), recv_from's values as this rank
// knows them. A step sends the difference between the values and mine() on a (lossy) wire; both
// ends add the same decoded difference to their copy of it, so the two copies of a pair stay
// equal bit for bit, and what rounding took off is sent again next time (nothing is lost for
// good, without error feedback). Copies start at zero and are made at a partner's first step;
// a rotating or random schedule makes up to p - 1 of each.
class PublicCopies {
 public:
  explicit PublicCopies(const std::vector<kernels::Bucket>& buckets);
  void begin(const partners::Partners& peers);
  // Bucket k of this step's copies; add_*: the copy += a decoded difference.
  std::span<float> mine(const kernels::Bucket& k) const;
  std::span<float> theirs(const kernels::Bucket& k) const;
  void add_mine(const kernels::Bucket& k, const float* q);
  void add_theirs(const kernels::Bucket& k, const float* q);
  std::vector<PublicCopy> save() const;
  // Replaces every copy; throws std::invalid_argument for a copy of another size.
  void load(std::vector<PublicCopy> copies);
  void forget(const std::vector<int>& peers);

 private:
  std::vector<float>* copy_of(std::map<int, std::vector<float>>& copies, int peer);

  int64_t count_;
  std::map<int, std::vector<float>> mine_, theirs_;  // by peer
  std::vector<float>*mine_now_ = nullptr, *theirs_now_ = nullptr;
};

inline constexpr std::string_view kPublicCopiesKind = "public-copies";

// What a rule with public copies answers alike, over a Base rule: the step's pair of copies, the
// echo of each bucket it sent (added to mine), and the copies as a rank's state.
template <class Base>
class WithPublicCopies : public Base {
 public:
  template <class... BaseArgs>
  explicit WithPublicCopies(const std::vector<kernels::Bucket>& buckets, BaseArgs&&... base)
      : Base(std::forward<BaseArgs>(base)...), copy_buckets_(buckets), copies_(buckets) {}
  void begin_step(int64_t, const partners::Partners& peers) override { copies_.begin(peers); }
  bool echoes() const override { return true; }
  void sent(int b, const float* decoded) override { copies_.add_mine(copy_buckets_[b], decoded); }
  // The copies as they are (tests) and as a rank's state holds them (plain layout).
  std::vector<PublicCopy> public_copies() const { return copies_.save(); }
  void set_public_copies(std::vector<PublicCopy> c) { copies_.load(std::move(c)); }
  void save_state(std::vector<StatePart>& out, const StateLayout& layout) const override {
    std::vector<PublicCopy> v = copies_.save();
    for (PublicCopy& c : v) c.values = layout.plain(c.values);
    out.push_back(copies_part(std::string(kPublicCopiesKind), v));
  }
  void load_state(std::span<const StatePart> parts, const StateLayout& layout) override {
    const StatePart* p = find_part(parts, kPublicCopiesKind, kCopiesVersion);
    std::vector<PublicCopy> v = p ? read_copies(*p) : std::vector<PublicCopy>();
    for (PublicCopy& c : v) c.values = layout.own(c.values);
    copies_.load(std::move(v));
  }
  void forget_peers(const std::vector<int>& lost) override { copies_.forget(lost); }

 protected:
  std::vector<kernels::Bucket> copy_buckets_;
  PublicCopies copies_;
};

// Staleness 0 with public copies: bucket b sends d = x - mine, and when the partner's difference
// q arrives, theirs += q and x += (theirs - mine) / 2 (with an exact wire, the pair average).
// d lies in a room of the sending thread, valid until its next outgoing() (a lossy wire packs it
// at once); sent_as_is (the fp32 wire sends d itself, read until the send completes): in a
// buffer of the model's size.
class ChocoAverage final : public WithPublicCopies<MixingRule> {
 public:
  ChocoAverage(float* buffer, const std::vector<kernels::Bucket>& buckets, bool sent_as_is = true);
  const float* outgoing(int b) override;
  void received(int b, int64_t step, const float* partner) override;

 private:
  float* x_;
  std::vector<float> diff_;
};

// Overlapped with public copies: the snapshot's difference to mine goes out, and the correction
// (theirs - mine) / 2 is computed on arrival and applied later, as DelayedAverage's.
class ChocoDelayed final : public WithPublicCopies<DelayedAverage> {
 public:
  ChocoDelayed(float* buffer, const std::vector<kernels::Bucket>& buckets);
  const float* outgoing(int b) override;
  void received(int b, int64_t step, const float* partner) override;
};

}  // namespace gg::gossip
