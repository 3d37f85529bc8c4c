#include "gossip/comm/exchange.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "gossip/comm/bounded_wait.hpp"
#include "gossip/comm/low_rank.hpp"
#include "gossip/comm/mixing.hpp"
#include "gossip/comm/push_sum.hpp"
#include "gossip/comm/wait_watch.hpp"

namespace gg::gossip {
namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

AllreduceExchange::AllreduceExchange(const mpi::Comm& world, float* grads,
                                     std::vector<kernels::Bucket> buckets)
    : comm_(world.dup()),
      grads_(grads),
      buckets_(std::move(buckets)),
      ranks_(world.size()),
      worker_([this] { loop(); }) {}

AllreduceExchange::~AllreduceExchange() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

void AllreduceExchange::begin_step(int64_t step) {
  std::lock_guard lock(mu_);
  step_ = step;
  done_ = 0;
  queue_.clear();
}

void AllreduceExchange::on_bucket_ready(int bucket) {
  {
    std::lock_guard lock(mu_);
    queue_.push_back(bucket);
  }
  cv_.notify_all();
}

double AllreduceExchange::finish_step() {
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return done_ == buckets_.size() || error_; });
  if (error_) std::rethrow_exception(error_);
  return seconds_since(t0);
}

void AllreduceExchange::loop() {
  bool named = false;
  for (;;) {
    int b = -1;
    int64_t step = 0;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      step = step_;
      b = queue_.front();
      queue_.pop_front();
    }
    if (timeline_ && !named) {
      timeline_->name_thread("allreduce comm");
      named = true;
    }
    try {
      const mpi::Activity doing("allreduce of gradient bucket " + std::to_string(b) + " in step " +
                                std::to_string(step));
      Timeline::Span span(timeline_, "allreduce bucket " + std::to_string(b), "comm");
      const kernels::Bucket& k = buckets_.at(b);
      float* g = grads_ + k.begin;
      comm_.allreduce_sum(g, k.size());
      mean_of_sum({g, static_cast<size_t>(k.size())}, ranks_);
    } catch (...) {
      std::lock_guard lock(mu_);
      error_ = std::current_exception();
    }
    {
      std::lock_guard lock(mu_);
      ++done_;
    }
    cv_.notify_all();
  }
}

}  // namespace gg::gossip

namespace gg::gossip {

namespace {
// The options an exchange is built with, checked against the communicator's size.
GossipOptions checked(GossipOptions o, int ranks) {
  if (o.schedule.p != ranks)
    throw std::invalid_argument("gossip schedule is for " + std::to_string(o.schedule.p) +
                                " ranks but the job has " + std::to_string(ranks));
  if (o.staleness != 0 && o.staleness != 1) throw std::invalid_argument("staleness must be 0 or 1");
  if (o.skip_late && o.staleness != 1)
    throw std::invalid_argument("skipping late buckets needs staleness 1");
  partners::validate(o.schedule);
  if (o.delayed && o.staleness != 0)
    throw std::invalid_argument("delayed mixing needs staleness 0");
  if (links_of(o) > 1 &&
      (o.staleness != 0 || o.delayed || o.public_copies || o.low_rank > 0 || o.measure_distance))
    throw std::invalid_argument(
        "a schedule with several peers a step mixes at staleness 0, without delayed mixing, "
        "public copies, low-rank messages or a distance measure");
  return o;
}

}  // namespace

int links_of(const GossipOptions& o) {
  return o.schedule.p > 1 ? partners::links(o.schedule.kind) : 1;
}

void fit_to_model(GossipOptions& o, const kernels::Graph& g, const kernels::ParamLayout& layout,
                  const std::string& model) {
  if (o.low_rank <= 0) return;
  check_gains(o.low_rank, g, model);
  o.matrices = matrix_views(g, layout, o.low_rank);
}

namespace {
// The average and its variants, as the options choose them.
std::unique_ptr<MixingRule> make_average(const GossipOptions& o, float* buffer,
                                         const std::vector<kernels::Bucket>& buckets, int rank) {
  if (o.public_copies && o.staleness != 0)
    throw std::invalid_argument("public copies (CHOCO) need staleness 0");
  if (o.low_rank > 0 && (o.staleness != 0 || o.public_copies || o.measure_distance))
    throw std::invalid_argument(
        "low-rank gossip needs staleness 0 and neither public copies nor a distance measure");
  const int period = partners::rounds_per_cycle(o.schedule.p);
  if (o.low_rank > 0 && o.delayed)
    return std::make_unique<LowRankDelayed>(buffer, buckets, o.matrices, o.low_rank, rank, period);
  if (o.low_rank > 0)
    return std::make_unique<LowRankAverage>(buffer, buckets, o.matrices, o.low_rank, rank, period);
  if (o.public_copies && o.delayed) return std::make_unique<ChocoDelayed>(buffer, buckets);
  if (o.public_copies) return std::make_unique<ChocoAverage>(buffer, buckets, !lossy(o.wire));
  if (o.delayed) return std::make_unique<DelayedAverage>(buffer, buckets);
  if (o.staleness == 1) return std::make_unique<StaleAverage>(buffer, buckets, o.skip_late);
  return std::make_unique<PairAverage>(buffer, buckets);
}

// The buckets themselves, or low-rank gossip's messages.
std::vector<kernels::Bucket> average_messages(const GossipOptions& o,
                                              const std::vector<kernels::Bucket>& buckets) {
  if (o.low_rank == 0) return buckets;
  return LowRankMix(o.matrices, buckets, o.low_rank, 0, 1).message_buckets();
}

// The rules (exchange_options.hpp names them): how each is made for a rank and what it sends for
// each bucket.
struct RuleMaker {
  RuleKind rule;
  std::unique_ptr<MixingRule> (*make)(const GossipOptions& o, float* buffer,
                                      const std::vector<kernels::Bucket>& buckets, int rank);
  std::vector<kernels::Bucket> (*messages)(const GossipOptions& o,
                                           const std::vector<kernels::Bucket>& buckets);
};
constexpr RuleMaker kRules[] = {
    {RuleKind::Average, make_average, average_messages},
    {RuleKind::PushSum, make_push_sum, push_sum_messages},
};

const RuleMaker& maker(RuleKind r) {
  for (const RuleMaker& m : kRules)
    if (m.rule == r) return m;
  throw std::logic_error("a mixing rule without a line in exchange.cpp's table");
}
}  // namespace

std::unique_ptr<MixingRule> make_rule(const GossipOptions& o, float* buffer,
                                      const std::vector<kernels::Bucket>& buckets, int rank) {
  std::unique_ptr<MixingRule> rule = maker(o.rule).make(o, buffer, buckets, rank);
  rule->measure_distance(o.measure_distance);
  return rule;
}

std::vector<kernels::Bucket> wire_buckets(const GossipOptions& o,
                                          const std::vector<kernels::Bucket>& buckets) {
  return maker(o.rule).messages(o, buckets);
}

const float* encode_outgoing(MixingRule& rule, WireCodec& codec, int b, uint64_t key) {
  const float* image = codec.encode(b, rule.outgoing(b), key);
  if (rule.echoes()) rule.sent(b, codec.decode(b, image));
  return image;
}

GossipExchange::GossipExchange(const mpi::Comm& world, float* buffer,
                               std::vector<kernels::Bucket> buckets, GossipOptions o)
    : comm_(world.dup()),
      o_(checked(std::move(o), comm_.size())),
      buckets_(std::move(buckets)),
      codec_(o_.wire, o_.error_feedback, wire_buckets(o_, buckets_), o_.stochastic),
      buffer_(buffer),
      queue_(buckets_.size(), o_.threading, engine_limit()) {
  const int64_t count = buckets_.empty() ? 0 : buckets_.front().end;
  // A lossy wire or low-rank messages never average in place: the window holds what travels.
  transport_ = make_transport(o_.transport, comm_, {codec_.floats(), codec_.layout(), links_of(o_)},
                              buffer_ == nullptr && !lossy(o_.wire) && o_.low_rank == 0);
  transport_->set_timeout(o_.timeout_s);
  if (o_.pipelined && o_.threading == Threading::Funneled)
    transport_->set_while_waiting([this] { start_queued(); });
  if (!buffer_) buffer_ = transport_->shared_home();
  if (!buffer_) {
    own_.assign(static_cast<size_t>(count), 0.f);
    buffer_ = own_.data();
  }
  rule_ = make_rule(o_, buffer_, buckets_, comm_.rank());
  const int threads = o_.threading == Threading::Concurrent ? std::max(1, o_.comm_threads) : 1;
  for (int i = 0; i < threads; ++i) workers_.emplace_back([this, i] { worker(i); });
}

GossipExchange::~GossipExchange() {
  queue_.drain_and_stop();
  for (std::thread& t : workers_) t.join();
}

partners::Partners GossipExchange::partners_at(int64_t step) const {
  return partners::partners(o_.schedule, comm_.rank(), step);
}

void check_weights(const MixingRule& rule, const partners::Partners& peers) {
  if (peers.weighted && !rule.takes_weights())
    throw std::logic_error(
        "the schedule gives this step's links weights, and this exchange's mixing rule mixes "
        "uniformly: use gossip.rule average without overlap, staleness, CHOCO or low rank");
}

void GossipExchange::begin_step(int64_t step) {
  const partners::Partners peers = partners_at(step);
  check_weights(*rule_, peers);
  rule_->begin_step(step, peers);
  queue_.begin(step, peers);
}

bool GossipExchange::in_place(const partners::Partners& peers) const {
  return buffer_ == transport_->shared_home() && rule_->pair_average_in_place() &&
         peers.links() == 1 && !peers.weighted && peers.send_to == peers.recv_from &&
         transport_->pairs_in_place(peers.send_to);
}

BucketExchange::Lateness GossipExchange::lateness() const { return rule_->lateness(); }

int64_t GossipExchange::bytes_sent() const {
  int64_t bytes = 0;
  for (const TransportTraffic& t : transport_->traffic())
    for (const PeerTraffic& p : t.peers) bytes += p.bytes_sent;
  return bytes;
}

void GossipExchange::on_bucket_ready(int b) {
  queue_.push(b, !rule_->waits(), [&] { rule_->capture(b); });
}

void GossipExchange::start(Job& j) {
  j.started = Timeline::Clock::now();
  const int64_t t = j.step - first_step_;
  if (in_place(j.peers)) return transport_->publish(j.peers.send_to, t, j.bucket);
  const int links = j.peers.links();
  for (int i = 0; i < links; ++i) transport_->expect(j.peers.link(i).recv_from, t, j.bucket);
  const uint64_t key = wire_key(o_.schedule.seed, comm_.rank(), j.step, o_.stream);
  // One image goes to every link's peer (the rule's share of it is the same for each).
  const float* image = encode_outgoing(*rule_, codec_, j.bucket, key);
  for (int i = 0; i < links; ++i) transport_->send(j.peers.link(i).send_to, t, j.bucket, image);
}

void GossipExchange::complete(const Job& j) {
  const int64_t t = j.step - first_step_;
  if (in_place(j.peers)) return transport_->average_in_place(j.peers.send_to, t, j.bucket);
  // The links' buckets are mixed in link order, as virtual ranks mix them.
  for (int i = 0; i < j.peers.links(); ++i) {
    const partners::Link l = j.peers.link(i);
    const float* wire = transport_->received(l.recv_from, t, j.bucket);
    // The outgoing bucket may still be read by MPI (p2p rendezvous) until every send completes:
    // only then may it be overwritten by the mix. Decoded after it: while it waits, this thread
    // may start other buckets, whose echo reuses the thread's decoding room.
    if (i == 0)
      for (int s = 0; s < j.peers.links(); ++s)
        transport_->finish_send(j.peers.link(s).send_to, t, j.bucket);
    rule_->received(j.bucket, j.step, codec_.decode(j.bucket, wire));
    transport_->release(l.recv_from, t, j.bucket);
  }
}

void GossipExchange::mark_done(const Job& j) {
  if (timeline_ && timeline_->enabled())
    timeline_->record(
        "bucket " + std::to_string(j.bucket), "comm", j.started, Timeline::Clock::now(),
        "{\"step\":" + std::to_string(j.step) + ",\"send_to\":" + std::to_string(j.peers.send_to) +
            ",\"recv_from\":" + std::to_string(j.peers.recv_from) +
            ",\"in_place\":" + (in_place(j.peers) ? "true" : "false") + "}");
  queue_.done(j);
}

void GossipExchange::run(std::vector<Job>& batch) {
  if (o_.pipelined) return run_pipelined(batch);
  // Funneled: every ready bucket is on the wire before the first one is waited for.
  for (Job& j : batch) start(j);
  for (const Job& j : batch) complete_and_mark(j);
}

// The next forward waits for the buckets in queue order: each is completed once the next one is
// on the wire (its transfer behind this one's mixing), not after every one is sent. While a
// completion waits for the partner's bucket, the buckets that backward hands over meanwhile go
// on the wire (the transport's while_waiting calls start_queued), so that one slow partner
// does not hold back this rank's later sends.
void GossipExchange::run_pipelined(std::vector<Job>& batch) {
  const auto complete_oldest = [&] {
    const Job j = started_.front();  // a copy: start_queued appends while it completes
    started_.pop_front();
    complete_and_mark(j);
  };
  for (Job& j : batch) {
    start(j);
    started_.push_back(j);
    if (started_.size() > 1) complete_oldest();
  }
  start_queued();
  while (!started_.empty()) complete_oldest();
}

void GossipExchange::start_queued() {
  for (Job& j : queue_.take_ready()) {
    start(j);
    started_.push_back(j);
  }
}

void GossipExchange::complete_and_mark(const Job& j) {
  complete(j);
  mark_done(j);
}

void GossipExchange::worker(int id) {
  bool named = false;  // the timeline is set after the threads start
  for (;;) {
    std::vector<Job> batch = queue_.take();
    if (batch.empty()) return;
    if (timeline_ && !named) {
      timeline_->name_thread("gossip comm " + std::to_string(id));
      named = true;
    }
    try {
      run(batch);
    } catch (const PartnerTimeout& e) {
      comm_.mark_peer_lost();
      char what[384];
      std::snprintf(what, sizeof what,
                    "gossip: rank %d waited more than %g s for rank %d at step %lld, bucket %d "
                    "(%s); that rank died or hangs",
                    comm_.rank(), o_.timeout_s, e.peer, static_cast<long long>(queue_.step()),
                    e.bucket, e.what());
      return queue_.fail(std::make_exception_ptr(std::runtime_error(what)));
    } catch (...) {
      return queue_.fail(std::current_exception());
    }
  }
}

double GossipExchange::finish_step() {
  const auto t0 = std::chrono::steady_clock::now();
  if (rule_->waits())
    queue_.wait_step();
  else
    queue_.check();
  rule_->finish(queue_.step());
  return seconds_since(t0);
}

void GossipExchange::queue_all(int64_t step) {
  begin_step(step);
  for (int b = 0; b < static_cast<int>(buckets_.size()); ++b) on_bucket_ready(b);
}

void GossipExchange::start_all(int64_t step) {
  begin_step(step);
  for (int b = static_cast<int>(buckets_.size()) - 1; b >= 0; --b) on_bucket_ready(b);
}

double GossipExchange::wait_bucket(int b) {
  const auto t0 = std::chrono::steady_clock::now();
  queue_.wait_bucket(b);
  return seconds_since(t0);
}

double GossipExchange::exchange_all(int64_t step) {
  const auto t0 = std::chrono::steady_clock::now();
  queue_all(step);
  finish_step();
  return seconds_since(t0);
}

DelayedAverage& GossipExchange::delayed() {
  auto* d = dynamic_cast<DelayedAverage*>(rule_.get());
  if (!d) throw std::logic_error("a delayed exchange's call on an exchange built without delayed");
  return *d;
}

void GossipExchange::start_delayed(int64_t step) {
  finish_delayed();
  delayed().snapshot();
  queue_all(step);
  delayed().pending = true;
}

void GossipExchange::settle_delayed() {
  DelayedAverage& d = delayed();
  if (!d.pending || d.settled) return;
  finish_step();
  d.settled = true;
}

std::vector<float> GossipExchange::delayed_delta() {
  if (!delayed().pending) return {};
  settle_delayed();
  return delayed().delta();
}

void GossipExchange::set_delayed_delta(const std::vector<float>& delta) {
  DelayedAverage& d = delayed();
  if (d.pending) finish_delayed();
  if (delta.empty()) return;
  if (delta.size() != d.delta().size())
    throw std::invalid_argument("delayed correction of " + std::to_string(delta.size()) +
                                " values for a buffer of " + std::to_string(d.delta().size()));
  d.delta() = delta;
  d.pending = d.settled = true;
}

double GossipExchange::finish_delayed() {
  DelayedAverage& d = delayed();
  if (!d.pending) return 0;
  const double waited = d.settled ? 0.0 : finish_step();
  d.pending = d.settled = false;
  d.apply();
  return waited;
}

}  // namespace gg::gossip
