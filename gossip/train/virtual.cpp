#include "gossip/train/virtual.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "gossip/comm/low_rank.hpp"
#include "gossip/comm/mixing.hpp"
#include "gossip/comm/wire.hpp"
#include "gossip/train/data.hpp"
#include "gossip/train/job.hpp"
#include "gossip/train/metrics.hpp"
#include "gossip/train/step_hooks.hpp"
#include "gossip/train/trainer.hpp"
#include "kernels/loss.hpp"
#include "kernels/net.hpp"
#include "kernels/optimizer.hpp"
#include "kernels/weights.hpp"
#include "shuffle/loader.hpp"

namespace gg::gossip {
namespace {

// A number in [0, 1) from four integers (splitmix64's finaliser over their mix): the draws of
// the lateness model, the same on every run and machine.
double unit_hash(uint64_t a, uint64_t b, uint64_t c, uint64_t d) {
  uint64_t x = a * 0x9E3779B97F4A7C15ull ^ (b + 0x632BE59BD9B4E019ull) * 0xBF58476D1CE4E5B9ull ^
               (c + 0x8CB92BA72F3D8DD7ull) * 0x94D049BB133111EBull ^
               (d + 1) * 0xD6E8FEB86659FD93ull;
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 31;
  return static_cast<double>(x >> 11) * 0x1.0p-53;
}

// One flat buffer (gradients, weights or momentum) of every virtual rank, exchanged as the
// engine (GossipExchange) exchanges it on real ranks, with the same parts: each rank's mixing
// rule (make_rule: the pair average, or, overlapped, the correction (partner - sent) / 2 applied
// before the next update; either with CHOCO's public copies) and its wire codec (and its residue).
// Every rank's outgoing image is taken before any rank mixes, as on real ranks, where a bucket is
// sent before the partner's arrives.
class VirtualExchange {
 public:
  // o: the wire, error feedback, delayed (overlapped), staleness, skip_late and measure_distance
  // of a real rank's exchange. late(step, rank): whether that rank's partner's buckets arrive
  // after the rank's step has ended (staleness 1 only).
  VirtualExchange(const std::vector<float*>& x, const GossipOptions& o,
                  const std::vector<kernels::Bucket>& buckets,
                  std::function<bool(int64_t, int)> late = {})
      : buckets_(buckets), late_(std::move(late)), stream_(o.stream) {
    for (float* v : x) {
      codecs_.push_back(std::make_unique<WireCodec>(o.wire, o.error_feedback,
                                                    wire_buckets(o, buckets), o.stochastic));
      rules_.push_back(make_rule(o, v, buckets, static_cast<int>(rules_.size())));
    }
    wire_.assign(x.size() * static_cast<size_t>(codecs_[0]->floats()), 0.f);
  }
  // Bytes one rank sends in one exchange (the transports' payload).
  int64_t bytes_per_rank() const {
    return codecs_[0]->floats() * static_cast<int64_t>(sizeof(float));
  }

  // Every rank sends its buffer to send_to and mixes what recv_from sent, in exchange `step`.
  void exchange(const partners::Schedule& s, int64_t step) {
    const size_t floats = static_cast<size_t>(codecs_[0]->floats());
    const auto& layout = codecs_[0]->layout();
    const int buckets = static_cast<int>(buckets_.size());
    for (size_t r = 0; r < rules_.size(); ++r) {
      if (auto* d = dynamic_cast<DelayedAverage*>(rules_[r].get())) d->snapshot();
      rules_[r]->begin_step(step, partners::partners(s, static_cast<int>(r), step));
      for (int b = 0; b < buckets; ++b) {
        rules_[r]->capture(b);
        const float* image = encode_outgoing(*rules_[r], *codecs_[r], b,
                                             wire_key(s.seed, static_cast<int>(r), step, stream_));
        std::copy(image, image + layout[b].size(), wire_.data() + r * floats + layout[b].begin);
      }
    }
    for (size_t r = 0; r < rules_.size(); ++r) {
      const size_t from =
          static_cast<size_t>(partners::partners(s, static_cast<int>(r), step).recv_from);
      // Late (staleness 1): the step ends first and mixes what came before; this step's buckets
      // are there for the next.
      const bool late = late_ && late_(step, static_cast<int>(r));
      if (late) rules_[r]->finish(step);
      for (int b = 0; b < buckets; ++b)
        rules_[r]->received(b, step,
                            codecs_[r]->decode(b, wire_.data() + from * floats + layout[b].begin));
      if (!late) rules_[r]->finish(step);
    }
    pending_ = true;
  }
  // Consensus control: every rank's ||x - partner||^2 since the last call, summed in rank order.
  double take_distance() {
    double d = 0;
    for (auto& rule : rules_) d += rule->take_distance();
    return d;
  }
  // Staleness 1: rank r's buckets mixed late (the partner's previous ones) and left unmixed.
  Lateness lateness(size_t r) const { return rules_[r]->lateness(); }
  // Overlapped: the corrections of the last exchange added to the buffers.
  void apply() {
    if (!pending_) return;
    for (auto& rule : rules_)
      if (auto* d = dynamic_cast<DelayedAverage*>(rule.get())) d->apply();
    pending_ = false;
  }

 private:
  std::vector<kernels::Bucket> buckets_;
  std::vector<std::unique_ptr<WireCodec>> codecs_;
  std::vector<std::unique_ptr<MixingRule>> rules_;
  std::vector<float> wire_;  // every rank's outgoing image, ranks x the codec's floats
  std::function<bool(int64_t, int)> late_;
  int stream_ = 0;  // wire_key's stream: which buffer
  bool pending_ = false;
};

// One logical rank's own state.
struct Rank {
  Rank(int64_t params, int64_t buffers, const kernels::SgdOptions& o)
      : params(static_cast<size_t>(params)),
        grads(static_cast<size_t>(params)),
        buffers(static_cast<size_t>(buffers)),
        sgd(params, o) {}
  std::vector<float> params, grads, buffers;
  kernels::Sgd sgd;
  std::unique_ptr<shuffle::PrefetchLoader> loader;
  shuffle::Batch batch;
  std::ofstream losses;  // log.losses
  double loss = 0;
};

struct RankTop1 {
  double min = 0, median = 0, max = 0;
  int64_t samples = 0;
};

// The sum over ranks in the order of MPICH's allreduce for a commutative operation (recursive
// doubling, and its reduce-scatter + allgather for long vectors, add in the same tree): ranks
// beyond the largest power of two below p are first folded into their even neighbours, then
// partners 1, 2, 4, ... apart are added pairwise. The total goes into `sum`.
void tree_sum(const std::vector<float*>& x, size_t n, std::vector<float>& sum) {
  const int p = static_cast<int>(x.size());
  int pof2 = 1;
  while (pof2 * 2 <= p) pof2 *= 2;
  const int rem = p - pof2;
  std::vector<std::vector<float>> part(static_cast<size_t>(pof2));
  for (int r = 0, k = 0; r < p; ++r) {
    if (r < 2 * rem && r % 2 == 0) continue;  // folded into r + 1
    std::vector<float>& v = part[static_cast<size_t>(k++)];
    v.assign(x[r], x[r] + n);
    if (r < 2 * rem)
      for (size_t i = 0; i < n; ++i) v[i] = x[r - 1][i] + v[i];
  }
  for (int mask = 1; mask < pof2; mask *= 2)
    for (int k = 0; k < pof2; k += 2 * mask)
      for (size_t i = 0; i < n; ++i) part[k][i] = part[k][i] + part[k + mask][i];
  sum = std::move(part[0]);
}

// gossip.hierarchy = node (mode grad) on logical nodes of K consecutive ranks, as
// HierarchicalExchange does it: each node's average (the sum in tree_sum's order, which is MPI's
// reduce-scatter's for K = 2: one addition; for larger K MPI may add in another order), the
// pair average with the partner node's (the schedule over the nodes), the result in every rank
// of the node. Real ranks mix it slice by slice over the rails; the values are the same.
class VirtualHierarchy {
 public:
  VirtualHierarchy(std::vector<float*> x, size_t n, int per_node, partners::Schedule schedule,
                   const std::vector<kernels::Bucket>& buckets)
      : x_(std::move(x)), n_(n), k_(per_node), schedule_(schedule) {
    schedule_.p = static_cast<int>(x_.size()) / k_;
    // What local rank 0 sends a step: its slice of every bucket over the rail (none alone).
    if (schedule_.p > 1)
      for (const kernels::Bucket& b : buckets)
        bytes_ +=
            (b.size() / k_ + (b.size() % k_ > 0 ? 1 : 0)) * static_cast<int64_t>(sizeof(float));
  }
  int64_t bytes_per_rank() const { return bytes_; }
  void exchange(int64_t step) {
    const int nodes = schedule_.p;
    std::vector<std::vector<float>> avg(static_cast<size_t>(nodes));
    for (int node = 0; node < nodes; ++node) {
      const auto first = x_.begin() + node * k_;
      tree_sum({first, first + k_}, n_, avg[static_cast<size_t>(node)]);
      mean_of_sum(avg[static_cast<size_t>(node)], k_);
    }
    for (int node = 0; node < nodes; ++node) {
      std::vector<float> mixed = avg[static_cast<size_t>(node)];
      if (nodes > 1)
        mix_pair(mixed,
                 avg[static_cast<size_t>(partners::partners(schedule_, node, step).recv_from)]);
      for (int l = 0; l < k_; ++l)
        std::copy(mixed.begin(), mixed.end(), x_[static_cast<size_t>(node * k_ + l)]);
    }
  }

 private:
  std::vector<float*> x_;
  size_t n_;
  int k_;
  partners::Schedule schedule_;
  int64_t bytes_ = 0;
};

class VirtualRun {
 public:
  explicit VirtualRun(const Config& c);
  RunSummary run();

 private:
  struct StepOut {
    double loss_mean = 0, loss_min = 0, loss_max = 0, lr = 0, consensus = -1;
    double consensus_estimate = -1;  // gossip.consensus_bound (as StepStats)
    bool consensus_average = false;
    int64_t sent_bytes = 0;
    int64_t late_buckets = -1, unmixed_buckets = -1;  // rank 0's this step (staleness 1), as real
  };
  void make_ranks();
  void make_exchanges();  // make_ranks' last part
  StepOut step(int64_t s);
  void announce();
  void record(int64_t s, const StepOut& out, double seconds);
  void evaluate_and_report(int64_t s);
  void finish();
  std::vector<float*> params() { return pointers(&Rank::params); }
  std::vector<float*> grads() { return pointers(&Rank::grads); }
  std::vector<float*> velocities();
  std::vector<float*> pointers(std::vector<float> Rank::*member);
  void start_model_exchange(StepOut& out);  // the overlapped exchange due, if any
  void flush_model(StepOut& out);           // ... started and its correction applied
  void control_consensus(int64_t s, StepOut& out);
  void count_lateness(StepOut& out);
  void exchange_after_update(int64_t round, StepOut& out);
  // Every rank's x becomes the mean over the ranks (tree_sum: an allreduce's result).
  void average(std::vector<float*> x, size_t n);
  std::vector<float> mean_of(std::vector<float> Rank::*member);  // over the ranks, tree_sum
  double consensus(const std::vector<float>& avg);  // mean over ranks of ||w_r - avg||^2
  EvalStats evaluate();
  RankTop1 rank_top1();
  void load(const Rank& r);  // its weights and statistics into the network
  int64_t model_round(int64_t step) const { return step / c_.gossip.model_every; }

  const Config& c_;
  const Algorithm& algorithm_;
  const int ranks_;
  shuffle::DataSplits data_;
  shuffle::LoaderOptions lo_;
  kernels::Net net_;
  kernels::Executor* train_ = nullptr;
  partners::Schedule schedule_;
  std::vector<Rank> rank_;
  std::unique_ptr<VirtualExchange> grad_x_, weight_x_, momentum_x_;
  std::unique_ptr<VirtualHierarchy> hierarchy_;  // gossip.hierarchy = node, in grad_x_'s place
  int64_t per_epoch_ = 0, total_ = 0, epochs_ = 0;
  int64_t model_due_ = -1;
  std::unique_ptr<kernels::LrSchedule> lr_;
  std::vector<float> dlogits_;
  MetricsWriter metrics_;
  std::string metrics_path_;
  Clock::time_point t_start_ = Clock::now();
  RunSummary summary_;
  double train_seconds_ = 0, last_print_ = -1e9, loss_avg_ = 0;
  int64_t sent_total_ = 0, consensus_averages_ = 0;
  int64_t unreported_bytes_ = 0;       // sent by an evaluation's flush: counted in the next step
  Lateness lateness0_, lateness_all_;  // staleness 1: rank 0's and every rank's, so far
};

// The compute threads, set before anything is compiled (oneDNN's primitives are made for them):
// train.threads, or every core of this machine.
shuffle::DataSplits open_data(const Config& c) {
  omp_set_num_threads(c.train.threads > 0
                          ? c.train.threads
                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  try {
    return shuffle::open_splits(shuffle::parse_source(c.data.source, c.data.dir),
                                val_labels_file(c));
  } catch (const std::exception& e) {
    throw UsageError("data.source = " + c.data.source + ": " + e.what());
  }
}

kernels::Dims input_of(const Config& c, const shuffle::SampleSource& s) {
  if (s.encoding() == shuffle::Encoding::Jpeg) return {3, c.data.crop, c.data.crop};
  const auto [ch, h, w] = s.shape();
  return {ch, h, w};
}

VirtualRun::VirtualRun(const Config& c)
    : c_(c),
      algorithm_(mixing_of(c)),
      ranks_(c.train.virtual_ranks),
      data_(open_data(c)),
      lo_(rank_loader_options(c, *data_.train, 0, ranks_)),
      net_(
          kernels::build_model(model_spec(c, 0, input_of(c, *data_.train), data_.train->classes())),
          kernels::parse_backend(c.train.backend), std::max<int64_t>(1, c.gossip.bucket_kb * 256),
          kernels::parse_precision(c.train.precision)),
      schedule_(gossip_schedule(c, ranks_)),
      dlogits_(static_cast<size_t>(c.train.batch * data_.train->classes())) {
  const kernels::Graph& g = net_.graph();
  for (const kernels::Node& node : g.nodes())
    if (node.op == kernels::Op::Dropout)
      throw UsageError("train.virtual_ranks: " + c.model.name +
                       " has dropout, whose masks are seeded per rank; virtual ranks share one "
                       "network and do not reproduce them: use a model without dropout");
  // The ranks' shards: rank r's loader takes slice r of P of each epoch's permutation.
  per_epoch_ = shuffle::batches_per_epoch(data_.train->size(), lo_);
  if (per_epoch_ < 1)
    throw UsageError("train.batch = " + std::to_string(c.train.batch) +
                     " is too large: " + std::to_string(data_.train->size()) + " samples over " +
                     std::to_string(ranks_) + " virtual ranks give no full batch");
  total_ = per_epoch_ * c.train.epochs;
  if (c.train.max_steps > 0) total_ = std::min(total_, c.train.max_steps);
  epochs_ = (total_ + per_epoch_ - 1) / per_epoch_;
  lr_ = std::make_unique<kernels::LrSchedule>(kernels::LrScheduleOptions{
      c.train.lr, c.train.base_batch, c.train.batch * ranks_,
      static_cast<int64_t>(std::llround(c.train.warmup_epochs * static_cast<double>(per_epoch_))),
      total_, 0.0});
  make_ranks();
  train_ = &net_.at_batch(c.train.batch);
}

// Every rank starts from the same initial weights (real ranks: rank 0's, broadcast), with its own
// momentum, log.losses file and exchanges' codecs.
void VirtualRun::make_ranks() {
  const Config& c = c_;
  const kernels::Graph& g = net_.graph();
  kernels::ParamStore& store = net_.store();
  kernels::init_params(g, store, c.train.seed);
  if (!c.train.init_from.empty()) {
    try {
      kernels::load_weights(c.train.init_from, g, store);
    } catch (const std::exception& e) {
      throw UsageError(std::string("train.init_from: ") + e.what());
    }
  }
  if (!plain_weights(c)) net_.use_native_layout();
  const kernels::SgdOptions so{static_cast<float>(c.train.momentum),
                               static_cast<float>(c.train.weight_decay), c.train.nesterov};
  rank_.reserve(static_cast<size_t>(ranks_));
  for (int r = 0; r < ranks_; ++r) {
    Rank& k = rank_.emplace_back(g.param_count(), g.buffer_count(), so);
    std::copy(store.params.data(), store.params.data() + store.params.size(), k.params.begin());
    k.buffers = store.buffers;
    if (!c.log.losses.empty()) {
      const std::string path = rank_log_path(c.log.losses, r);
      k.losses.open(path, std::ios::trunc);
      if (!k.losses) throw std::runtime_error("log.losses: cannot write " + path);
    }
  }
  make_exchanges();
}

// Every rank's exchanges, with the options of a real rank's (exchange_options, config.hpp).
void VirtualRun::make_exchanges() {
  const Config& c = c_;
  const GossipPlan plan = gossip_plan(c);
  const auto& buckets = net_.buckets();
  // The lateness model of staleness 1 (train.virtual_late): rank r's partner is late in `step`
  // when a hash of (seed, exchange, step, r), uniform in [0, 1), falls below the share.
  const double share = c.train.virtual_late;
  const uint64_t seed = static_cast<uint64_t>(c.train.seed);
  const auto late = [share, seed](uint64_t exchange) -> std::function<bool(int64_t, int)> {
    if (share <= 0) return {};
    return [=](int64_t step, int r) {
      return unit_hash(seed, exchange, static_cast<uint64_t>(step), static_cast<uint64_t>(r)) <
             share;
    };
  };
  // A real rank's options, with the run's schedule and the matrices low-rank gossip reads.
  const auto options = [&](Mixed what) {
    GossipOptions o = exchange_options(c, plan, what);
    o.schedule = schedule_;
    if (o.low_rank > 0) {
      check_low_rank_gains(c, net_.graph());
      o.matrices = matrix_views(net_.graph(), net_.layout(), o.low_rank);
    }
    return o;
  };
  if (algorithm_.grads && plan.node_hierarchy)
    hierarchy_ = std::make_unique<VirtualHierarchy>(grads(), rank_[0].grads.size(),
                                                    c.network.ranks_per_node, schedule_, buckets);
  else if (algorithm_.grads)
    grad_x_ = std::make_unique<VirtualExchange>(grads(), options(Mixed::Grads), buckets, late(0));
  if (algorithm_.weights)
    weight_x_ =
        std::make_unique<VirtualExchange>(params(), options(Mixed::Weights), buckets, late(1));
  if (algorithm_.momentum)
    momentum_x_ =
        std::make_unique<VirtualExchange>(velocities(), options(Mixed::Momentum), buckets, late(1));
}

std::vector<float*> VirtualRun::pointers(std::vector<float> Rank::*member) {
  std::vector<float*> x;
  for (Rank& r : rank_) x.push_back((r.*member).data());
  return x;
}

std::vector<float*> VirtualRun::velocities() {
  std::vector<float*> x;
  for (Rank& r : rank_) x.push_back(r.sgd.velocity().data());
  return x;
}

void VirtualRun::load(const Rank& r) {
  kernels::ParamStore& store = net_.store();
  std::copy(r.params.begin(), r.params.end(), store.params.data());
  store.buffers = r.buffers;
}

void VirtualRun::start_model_exchange(StepOut& out) {
  if (model_due_ < 0) return;
  if (weight_x_) weight_x_->exchange(schedule_, model_due_);
  if (momentum_x_) momentum_x_->exchange(schedule_, model_due_);
  for (VirtualExchange* e : {weight_x_.get(), momentum_x_.get()})
    if (e) out.sent_bytes += e->bytes_per_rank();
  model_due_ = -1;
}

// As Trainer::control_consensus: after the step's weight exchange, the estimate from what the
// ranks received; over the bound, an exact global average.
void VirtualRun::control_consensus(int64_t s, StepOut& out) {
  const double bound = c_.gossip.consensus_bound;
  if (bound <= 0 || !weight_x_ || (s + 1) % c_.gossip.model_every != 0) return;
  double norm = 0;  // as Trainer::control_consensus: relative to the ranks' mean ||w||^2
  for (const Rank& r : rank_) norm += squared_norm(r.params);
  const double d = weight_x_->take_distance();
  out.consensus_estimate = norm > 0 ? d / (2 * norm) : 0;
  if (out.consensus_estimate <= bound) return;
  flush_model(out);
  average(params(), rank_[0].params.size());
  average(pointers(&Rank::buffers), rank_[0].buffers.size());
  weight_x_->take_distance();  // as Trainer::forget_distance
  out.consensus_average = true;
  ++consensus_averages_;
}

// As Trainer::account: rank 0's late and unmixed buckets of this step, over its exchanges; and
// every rank's, for the summary.
void VirtualRun::count_lateness(StepOut& out) {
  Lateness rank0, all;
  for (const VirtualExchange* e : {grad_x_.get(), weight_x_.get(), momentum_x_.get()}) {
    if (!e) continue;
    rank0.late += e->lateness(0).late;
    rank0.unmixed += e->lateness(0).unmixed;
    for (int r = 0; r < ranks_; ++r) {
      all.late += e->lateness(static_cast<size_t>(r)).late;
      all.unmixed += e->lateness(static_cast<size_t>(r)).unmixed;
    }
  }
  out.late_buckets = rank0.late - lateness0_.late;
  out.unmixed_buckets = rank0.unmixed - lateness0_.unmixed;
  lateness0_ = rank0;
  lateness_all_ = all;
}

void VirtualRun::flush_model(StepOut& out) {
  start_model_exchange(out);
  if (weight_x_) weight_x_->apply();
  if (momentum_x_) momentum_x_->apply();
}

void VirtualRun::exchange_after_update(int64_t round, StepOut& out) {
  model_due_ = round;  // overlapped: behind the next step's compute, which starts it
  if (!c_.gossip.overlap_model) flush_model(out);
}

void VirtualRun::average(std::vector<float*> x, size_t n) {
  std::vector<float> sum;
  tree_sum(x, n, sum);
  mean_of_sum(sum, ranks_);
  for (float* v : x) std::copy(sum.begin(), sum.end(), v);
}

std::vector<float> VirtualRun::mean_of(std::vector<float> Rank::*member) {
  std::vector<float> avg;
  tree_sum(pointers(member), (rank_[0].*member).size(), avg);
  mean_of_sum(avg, ranks_);
  return avg;
}

double VirtualRun::consensus(const std::vector<float>& avg) {
  double d = 0;
  for (const Rank& r : rank_) d += squared_distance(r.params, avg);
  return d / ranks_;
}

VirtualRun::StepOut VirtualRun::step(int64_t s) {
  StepOut out;
  out.sent_bytes = std::exchange(unreported_bytes_, 0);
  start_model_exchange(out);  // the last update's weights (overlap_model), as on real ranks
  // Every rank's forward and backward on its own batch, its weights and statistics swapped in.
  kernels::ParamStore& store = net_.store();
  const int64_t classes = net_.graph().classes();
  for (Rank& r : rank_) {
    if (!r.loader->next(r.batch))
      throw std::logic_error("virtual ranks: a rank's data ended before step " + std::to_string(s));
    load(r);
    train_->set_dropout_step(static_cast<uint64_t>(s));
    const float* logits = train_->forward(r.batch.x.data(), true);
    r.loss = kernels::softmax_cross_entropy(logits, r.batch.y.data(), c_.train.batch, classes,
                                            dlogits_.data())
                 .loss;
    train_->backward(dlogits_.data(), {});
    std::copy(store.grads.data(), store.grads.data() + store.grads.size(), r.grads.begin());
    std::copy(store.buffers.begin(), store.buffers.end(), r.buffers.begin());
  }
  if (algorithm_.allreduce) {
    average(grads(), rank_[0].grads.size());
  } else if (grad_x_) {
    grad_x_->exchange(schedule_, s);
    out.sent_bytes += grad_x_->bytes_per_rank();
  } else if (hierarchy_) {
    hierarchy_->exchange(s);
    out.sent_bytes += hierarchy_->bytes_per_rank();
  }
  out.lr = lr_->at(s);
  flush_model(out);
  for (Rank& r : rank_) r.sgd.step(r.params.data(), r.grads.data(), static_cast<float>(out.lr));
  if (weight_x_ && (s + 1) % c_.gossip.model_every == 0) exchange_after_update(model_round(s), out);
  const int64_t h = c_.gossip.global_every;
  if (!algorithm_.allreduce && h > 0 && (s + 1) % h == 0) {
    flush_model(out);
    average(params(), rank_[0].params.size());
    average(pointers(&Rank::buffers), rank_[0].buffers.size());
    if (weight_x_) weight_x_->take_distance();  // as Trainer::forget_distance
  }
  control_consensus(s, out);
  if (c_.gossip.staleness == 1) count_lateness(out);
  const int64_t n = c_.gossip.consensus_every;
  if (n > 0 && (s + 1) % n == 0) out.consensus = consensus(mean_of(&Rank::params));
  out.loss_min = out.loss_max = rank_[0].loss;
  for (const Rank& r : rank_) {
    out.loss_mean += r.loss / ranks_;
    out.loss_min = std::min(out.loss_min, r.loss);
    out.loss_max = std::max(out.loss_max, r.loss);
  }
  return out;
}

EvalStats VirtualRun::evaluate() {
  StepOut flushed;
  flush_model(flushed);  // as Trainer::evaluate: a pending weight exchange completes first
  // Real ranks' transports count what they sent between two steps' ends: the next step's.
  unreported_bytes_ += flushed.sent_bytes;
  // The average model, evaluated over the whole test set (real ranks split it and add up).
  const std::vector<float> avg_params = mean_of(&Rank::params);
  kernels::ParamStore& store = net_.store();
  std::copy(avg_params.begin(), avg_params.end(), store.params.data());
  store.buffers = mean_of(&Rank::buffers);
  EvalStats e = eval_stats(evaluation_sums(net_.at_batch(c_.train.eval_batch),
                                           net_.graph().classes(), *data_.eval, lo_, 0, 1));
  e.consensus = consensus(avg_params);
  return e;
}

RankTop1 VirtualRun::rank_top1() {
  RankTop1 t;
  if (c_.train.rank_eval_samples <= 0) return t;
  kernels::Executor& exec = net_.at_batch(c_.train.eval_batch);
  shuffle::PrefetchLoader loader(*data_.eval, evaluation_loader(lo_, exec.batch(), 0, 1), 0, 1);
  shuffle::Batch b;
  std::vector<int64_t> correct(rank_.size(), 0);
  // Whole evaluation batches, until at least rank_eval_samples samples.
  while (t.samples < c_.train.rank_eval_samples && loader.next(b)) {
    for (size_t r = 0; r < rank_.size(); ++r) {
      load(rank_[r]);
      const float* logits = exec.forward(b.x.data(), false);
      correct[r] += kernels::softmax_cross_entropy(logits, b.y.data(), c_.train.eval_batch,
                                                   net_.graph().classes(), nullptr)
                        .correct;
    }
    for (int32_t v : b.y) t.samples += v >= 0;
  }
  if (t.samples == 0) return t;
  std::vector<double> top1;
  for (int64_t k : correct) top1.push_back(static_cast<double>(k) / static_cast<double>(t.samples));
  std::sort(top1.begin(), top1.end());
  const size_t m = top1.size();
  t.min = top1.front();
  t.max = top1.back();
  t.median = m % 2 ? top1[m / 2] : 0.5 * (top1[m / 2 - 1] + top1[m / 2]);
  return t;
}

void VirtualRun::announce() {
  const int threads = omp_get_max_threads();  // set before the network was compiled
  metrics_path_ = c_.log.metrics;
  if (names_run_folder(metrics_path_)) metrics_path_ = start_run_folder(metrics_path_);
  if (!metrics_path_.empty()) metrics_ = MetricsWriter(metrics_path_, c_.log.overwrite);
  metrics_.tag("virtual", true);
  const kernels::Graph& g = net_.graph();
  const int64_t global_batch = c_.train.batch * ranks_;
  const std::string mixing = algorithm_.allreduce
                                 ? std::string("allreduce (summed in MPICH's order)")
                                 : "gossip " + c_.gossip.mode + " (" + c_.gossip.schedule +
                                       (c_.gossip.rotate ? "+rotate" : "") + ")";
  const double state_mb =
      static_cast<double>(ranks_) *
      (3.0 * static_cast<double>(g.param_count()) + static_cast<double>(g.buffer_count())) *
      sizeof(float) / 1e6;
  std::printf(
      "gossipgrad: %d VIRTUAL ranks in one process (%d threads; one after another on one "
      "network), %s (%lld params), %s backend; their state %.0f MB\n",
      ranks_, threads, c_.model.name.c_str(), static_cast<long long>(g.param_count()),
      c_.train.backend.c_str(), state_mb);
  std::printf(
      "gossipgrad: %lld train / %lld test samples, global batch %lld, %lld steps/epoch, %lld "
      "epochs, peak lr %.4g, mixing: %s\n",
      static_cast<long long>(data_.train->size()),
      static_cast<long long>(data_.eval ? data_.eval->size() : 0),
      static_cast<long long>(global_batch), static_cast<long long>(per_epoch_),
      static_cast<long long>(epochs_), lr_->peak(), mixing.c_str());
  std::fflush(stdout);
  metrics_.write({{"event", "start"},
                  {"ranks", ranks_},
                  {"threads", threads},
                  {"model", c_.model.name},
                  {"params", g.param_count()},
                  {"global_batch", global_batch},
                  {"steps", total_},
                  {"epochs_planned", epochs_},
                  {"first_step", 0},
                  {"mode", c_.gossip.mode},
                  {"backend", c_.train.backend}});
}

// The step's losses (log.losses), metrics event and progress line.
void VirtualRun::record(int64_t s, const StepOut& out, double seconds) {
  train_seconds_ += seconds;
  sent_total_ += out.sent_bytes;
  summary_.steps = s + 1;
  if (!std::isfinite(out.loss_mean))
    throw std::runtime_error("virtual ranks: a loss is NaN or inf at step " + std::to_string(s) +
                             ": lower train.lr");
  for (Rank& r : rank_) {
    if (!r.losses.is_open()) continue;
    r.losses << loss_line(s, r.loss);
    if (!r.losses) throw std::runtime_error("log.losses: cannot write (disk full?)");
  }
  const int64_t global_batch = c_.train.batch * ranks_;
  const auto count_or_null = [](int64_t n) {
    return n >= 0 ? nlohmann::json(n) : nlohmann::json();
  };
  metrics_.write(
      {{"event", "step"},
       {"step", s},
       {"epoch", s / per_epoch_},
       {"loss", out.loss_mean},
       {"loss_min", out.loss_min},
       {"loss_max", out.loss_max},
       {"lr", out.lr},
       {"images_per_s", static_cast<double>(global_batch) / seconds},
       {"step_s", seconds},
       {"sent_bytes", algorithm_.allreduce ? nlohmann::json() : nlohmann::json(out.sent_bytes)},
       {"late_buckets", count_or_null(out.late_buckets)},
       {"unmixed_buckets", count_or_null(out.unmixed_buckets)},
       {"consensus_estimate",
        out.consensus_estimate >= 0 ? nlohmann::json(out.consensus_estimate) : nlohmann::json()},
       {"consensus_average", out.consensus_average}});
  if (out.consensus >= 0)
    metrics_.write({{"event", "consensus"}, {"step", s + 1}, {"consensus", out.consensus}});
  loss_avg_ = s == 0 ? out.loss_mean : 0.95 * loss_avg_ + 0.05 * out.loss_mean;
  const double now = seconds_since(t_start_);
  if (!c_.log.progress || (now - last_print_ < c_.log.interval && s + 1 < total_)) return;
  last_print_ = now;
  const double done = static_cast<double>(s + 1);
  std::printf("VIRTUAL step %6lld/%lld  epoch %lld/%lld  loss %.4f  lr %.4f  %.0f img/s  ETA %s\n",
              static_cast<long long>(s + 1), static_cast<long long>(total_),
              static_cast<long long>(s / per_epoch_ + 1), static_cast<long long>(epochs_),
              loss_avg_, out.lr, static_cast<double>(global_batch) * done / train_seconds_,
              format_duration(static_cast<double>(total_ - s - 1) * train_seconds_ / done).c_str());
  std::fflush(stdout);
}

void VirtualRun::evaluate_and_report(int64_t s) {
  const EvalStats e = evaluate();
  // Each rank's own model costs ranks x the samples: at the end of training only.
  const RankTop1 rt = s + 1 == total_ ? rank_top1() : RankTop1{};
  const int64_t epoch = s / per_epoch_;
  summary_.final_top1 = e.top1;
  summary_.final_top5 = e.top5;
  summary_.eval_step = s + 1;
  std::printf(
      "epoch %lld: test top-1 %.2f%%  top-5 %.2f%%  loss %.4f  (%lld samples; average of %d "
      "VIRTUAL ranks, consensus distance %.3g)",
      static_cast<long long>(epoch + 1), 100 * e.top1, 100 * e.top5, e.loss,
      static_cast<long long>(e.samples), ranks_, e.consensus);
  if (rt.samples > 0)
    std::printf("; each rank's own top-1 on %lld samples: min %.2f%% median %.2f%% max %.2f%%",
                static_cast<long long>(rt.samples), 100 * rt.min, 100 * rt.median, 100 * rt.max);
  std::printf("\n");
  std::fflush(stdout);
  nlohmann::json event = {
      {"event", "eval"},          {"epoch", epoch + 1}, {"step", s + 1},
      {"top1", e.top1},           {"top5", e.top5},     {"loss", e.loss},
      {"consensus", e.consensus}, {"ranks", ranks_},    {"wall_s", seconds_since(t_start_)}};
  if (rt.samples > 0)
    event["rank_top1"] = {
        {"min", rt.min}, {"median", rt.median}, {"max", rt.max}, {"samples", rt.samples}};
  metrics_.write(event);
}

void VirtualRun::finish() {
  RunSummary& summary = summary_;
  summary.wall_seconds = seconds_since(t_start_);
  const double steps = static_cast<double>(summary.steps);
  summary.images_per_second =
      train_seconds_ > 0 ? static_cast<double>(c_.train.batch * ranks_) * steps / train_seconds_
                         : 0;
  const double bytes_per_step = steps > 0 ? static_cast<double>(sent_total_) / steps : 0;
  const bool evaluated = summary.eval_step >= 0;
  char top1[64] = "not evaluated (no evaluation data)";
  if (evaluated)
    std::snprintf(top1, sizeof top1, "final test top-1 %.2f%%", 100 * summary.final_top1);
  const bool stale = c_.gossip.staleness == 1;
  char lateness[128] = "";
  if (stale)
    std::snprintf(lateness, sizeof lateness,
                  ", staleness 1: %lld bucket mixes late and %lld unmixed over all ranks",
                  static_cast<long long>(lateness_all_.late),
                  static_cast<long long>(lateness_all_.unmixed));
  std::printf(
      "done: %lld steps of %d VIRTUAL ranks in %s (%.0f img/s in this one process), %s%s "
      "(metrics: %s)\n",
      static_cast<long long>(summary.steps), ranks_, format_duration(summary.wall_seconds).c_str(),
      summary.images_per_second, top1, lateness, metrics_path_.c_str());
  const auto number_or_null = [](bool known, double v) {
    return known ? nlohmann::json(v) : nlohmann::json();
  };
  metrics_.write(
      {{"event", "summary"},
       {"steps", summary.steps},
       {"epochs", steps / static_cast<double>(per_epoch_)},
       {"top1", number_or_null(evaluated, summary.final_top1)},
       {"top5", number_or_null(evaluated, summary.final_top5)},
       {"eval_step", number_or_null(evaluated, static_cast<double>(summary.eval_step))},
       {"wall_s", summary.wall_seconds},
       {"images_per_s", summary.images_per_second},
       {"sent_bytes_per_step", number_or_null(!algorithm_.allreduce, bytes_per_step)},
       {"params", net_.graph().param_count()},
       {"consensus_averages", consensus_averages_},
       {"late_buckets", number_or_null(stale, static_cast<double>(lateness_all_.late))},
       {"unmixed_buckets", number_or_null(stale, static_cast<double>(lateness_all_.unmixed))},
       {"ranks", ranks_}});
}

RunSummary VirtualRun::run() {
  t_start_ = Clock::now();
  for (int r = 0; r < ranks_; ++r) {
    shuffle::LoaderOptions o = lo_;
    o.rank = r;
    o.prefetch = std::min(o.prefetch, 2);  // P loaders: keep the queued batches few
    rank_[static_cast<size_t>(r)].loader =
        std::make_unique<shuffle::PrefetchLoader>(*data_.train, o, 0, epochs_);
  }
  announce();
  for (int64_t s = 0; s < total_; ++s) {
    const auto t0 = Clock::now();
    const StepOut out = step(s);
    record(s, out, seconds_since(t0));
    if (data_.eval && ((s + 1) % per_epoch_ == 0 || s + 1 == total_)) evaluate_and_report(s);
  }
  finish();
  return summary_;
}

}  // namespace

RunSummary run_virtual(const Config& c) {
  VirtualRun run(c);
  return run.run();
}

}  // namespace gg::gossip
