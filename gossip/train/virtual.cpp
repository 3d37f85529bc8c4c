#include "gossip/train/virtual.hpp"

#include <malloc.h>
#include <omp.h>
#include <sys/resource.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gossip/comm/low_rank.hpp"
#include "gossip/comm/mixing.hpp"
#include "gossip/comm/wire.hpp"
#include "gossip/train/data.hpp"
#include "gossip/train/events.hpp"
#include "gossip/train/job.hpp"
#include "gossip/train/metrics.hpp"
#include "gossip/train/step_hooks.hpp"
#include "gossip/train/stop_signals.hpp"
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
  // after the rank's step has ended (staleness 1 only). Ranks join one by one (add_rank).
  VirtualExchange(const GossipOptions& o, const std::vector<kernels::Bucket>& buckets,
                  std::function<bool(int64_t, int)> late = {})
      : options_(o), buckets_(buckets), late_(std::move(late)), stream_(o.stream) {}
  // The next rank's buffer x: its rule, codec and outgoing image.
  void add_rank(float* x) {
    codecs_.push_back(std::make_unique<WireCodec>(options_.wire, options_.error_feedback,
                                                  wire_buckets(options_, buckets_),
                                                  options_.stochastic));
    rules_.push_back(make_rule(options_, x, buckets_, static_cast<int>(rules_.size())));
    images_.emplace_back(static_cast<size_t>(codecs_.back()->floats()), 0.f);
  }
  // Bytes one rank sends in one exchange (the transports' payload, to each of its links).
  int64_t bytes_per_rank() const {
    return codecs_[0]->floats() * static_cast<int64_t>(sizeof(float)) * links_of(options_);
  }
  // What a rank's state grows by over `steps` exchanges as it meets partners (made at the first
  // meeting): CHOCO's public copies (one per peer it sends to, one per peer it hears from),
  // low-rank gossip's factors (pairs; at most a message's floats per partner).
  int64_t growth_bytes(const partners::Schedule& s, int64_t steps) const {
    if (!options_.public_copies && options_.low_rank == 0) return 0;
    std::set<int> to, from;
    const auto all = static_cast<size_t>(s.p - 1);
    for (int64_t t = 0; t < steps && (to.size() < all || from.size() < all); ++t) {
      const partners::Partners q = partners::partners(s, 0, t);  // schedules treat ranks alike
      for (int i = 0; i < q.links(); ++i) {
        to.insert(q.link(i).send_to);
        from.insert(q.link(i).recv_from);
      }
    }
    if (options_.public_copies)
      return static_cast<int64_t>(to.size() + from.size()) *
             (buckets_.empty() ? 0 : buckets_.front().end) * 4;
    return static_cast<int64_t>(to.size()) * codecs_[0]->floats() * 4;
  }

  // Every rank sends its buffer to each link's send_to and mixes what each recv_from sent, link
  // by link, in exchange `step`.
  void exchange(const partners::Schedule& s, int64_t step) {
    const auto& layout = codecs_[0]->layout();
    const int buckets = static_cast<int>(buckets_.size());
    for (size_t r = 0; r < rules_.size(); ++r) {
      if (auto* d = dynamic_cast<DelayedAverage*>(rules_[r].get())) d->snapshot();
      rules_[r]->begin_step(step, partners::partners(s, static_cast<int>(r), step));
      for (int b = 0; b < buckets; ++b) {
        rules_[r]->capture(b);
        const float* image = encode_outgoing(*rules_[r], *codecs_[r], b,
                                             wire_key(s.seed, static_cast<int>(r), step, stream_));
        std::copy(image, image + layout[b].size(), images_[r].data() + layout[b].begin);
      }
    }
    for (size_t r = 0; r < rules_.size(); ++r) {
      const partners::Partners peers = partners::partners(s, static_cast<int>(r), step);
      // Late (staleness 1): the step ends first and mixes what came before; this step's buckets
      // are there for the next.
      const bool late = late_ && late_(step, static_cast<int>(r));
      if (late) rules_[r]->finish(step);
      for (int b = 0; b < buckets; ++b)
        for (int i = 0; i < peers.links(); ++i) {
          const auto from = static_cast<size_t>(peers.link(i).recv_from);
          rules_[r]->received(b, step,
                              codecs_[r]->decode(b, images_[from].data() + layout[b].begin));
        }
      if (!late) rules_[r]->finish(step);
    }
    pending_ = true;
  }
  // Consensus control: each rank's ||x - partner||^2 since the last call.
  std::vector<double> take_distances() {
    std::vector<double> d;
    for (auto& rule : rules_) d.push_back(rule->take_distance());
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
  GossipOptions options_;
  std::vector<kernels::Bucket> buckets_;
  std::vector<std::unique_ptr<WireCodec>> codecs_;
  std::vector<std::unique_ptr<MixingRule>> rules_;
  std::vector<std::vector<float>> images_;  // every rank's outgoing image, the codec's floats
  std::function<bool(int64_t, int)> late_;
  int stream_ = 0;  // wire_key's stream: which buffer
  bool pending_ = false;
};

// The epoch's permutation of the training samples, drawn once for every rank (real ranks each
// draw the same one): rank r's loader asks for its slice, as partition() would cut it.
class SharedPermutation {
 public:
  SharedPermutation(int64_t n, uint64_t seed) : n_(n), seed_(seed) {}
  std::vector<int64_t> slice(int64_t epoch, int rank, int ranks) {
    std::lock_guard<std::mutex> lk(mu_);
    if (epoch != epoch_) {
      perm_ = shuffle::permutation(n_, seed_, epoch);
      epoch_ = epoch;
    }
    const int64_t per = n_ / ranks;
    return {perm_.begin() + rank * per, perm_.begin() + (rank + 1) * per};
  }
  int64_t bytes() const { return n_ * static_cast<int64_t>(sizeof(int64_t)); }

 private:
  const int64_t n_;
  const uint64_t seed_;
  std::mutex mu_;
  int64_t epoch_ = -1;
  std::vector<int64_t> perm_;
};

// A virtual rank's order of the samples: its slice of the shared permutation.
class RankSlice : public shuffle::EpochOrder {
 public:
  RankSlice(SharedPermutation& perm, int rank, int ranks, int64_t batches)
      : perm_(perm), rank_(rank), ranks_(ranks), batches_(batches) {}
  int64_t batches_per_epoch() const override { return batches_; }
  std::vector<int64_t> order(int64_t epoch) override { return perm_.slice(epoch, rank_, ranks_); }

 private:
  SharedPermutation& perm_;
  const int rank_, ranks_;
  const int64_t batches_;
};

// One logical rank's own state. Its batch is built when its turn comes (a loader without threads
// into the run's one batch), its log.losses lines wait in `losses` until the run writes them out.
struct Rank {
  Rank(int64_t params, int64_t buffers, const kernels::SgdOptions& o)
      : params(static_cast<size_t>(params)),
        grads(static_cast<size_t>(params)),
        buffers(static_cast<size_t>(buffers)),
        sgd(params, o) {}
  std::vector<float> params, grads, buffers;
  kernels::Sgd sgd;
  std::unique_ptr<RankSlice> order;
  std::unique_ptr<shuffle::PrefetchLoader> loader;
  std::string losses;  // log.losses lines not yet written
  double loss = 0;
};

struct RankTop1 {
  double min = 0, median = 0, max = 0;
  int64_t samples = 0;
};

// The sum over ranks in the order of MPICH's allreduce for a commutative operation (recursive
// doubling, and its reduce-scatter + allgather for long vectors, add in the same tree): ranks
// beyond the largest power of two below p are first folded into their even neighbours, then
// partners 1, 2, 4, ... apart are added pairwise. x[r] holds rank r's n values; the total goes
// into `sum` (n values; it may be one of the x[r]: each chunk is read whole before it is
// written). The tree is walked depth first, a chunk of values at a time, so that only one partial
// sum per level of one chunk is held: memory of log2(p) chunks, not of p copies.
template <typename T>
class TreeSum {
 public:
  static constexpr size_t kChunk = 4096;
  explicit TreeSum(int p) : p_(p) {
    while (pof2_ * 2 <= p_) {
      pof2_ *= 2;
      ++levels_;
    }
    rem_ = p_ - pof2_;
    scratch_.assign(static_cast<size_t>(levels_ + 1) * kChunk, T{});
  }
  void sum(const std::vector<const T*>& x, size_t n, T* out) {
    for (size_t off = 0; off < n; off += kChunk) {
      const size_t len = std::min(kChunk, n - off);
      node(x, off, len, 0, pof2_, 0);
      std::copy(scratch_.begin(), scratch_.begin() + static_cast<std::ptrdiff_t>(len), out + off);
    }
  }
  static int64_t bytes(int p) {
    int levels = 0;
    for (int q = 1; q * 2 <= p; q *= 2) ++levels;
    return static_cast<int64_t>(levels + 1) * kChunk * static_cast<int64_t>(sizeof(T));
  }

 private:
  // Parts [k, k + width) summed into level `depth`'s chunk of scratch.
  void node(const std::vector<const T*>& x, size_t off, size_t len, int k, int width, int depth) {
    T* out = scratch_.data() + static_cast<size_t>(depth) * kChunk;
    if (width == 1) {
      // Part k: rank 2k + 1 with its even neighbour folded in (the first rem), else rank k + rem.
      if (k < rem_) {
        const T* a = x[static_cast<size_t>(2 * k)] + off;
        const T* b = x[static_cast<size_t>(2 * k + 1)] + off;
        for (size_t i = 0; i < len; ++i) out[i] = a[i] + b[i];
      } else {
        const T* a = x[static_cast<size_t>(k + rem_)] + off;
        std::copy(a, a + len, out);
      }
      return;
    }
    node(x, off, len, k, width / 2, depth);
    node(x, off, len, k + width / 2, width / 2, depth + 1);
    const T* right = scratch_.data() + static_cast<size_t>(depth + 1) * kChunk;
    for (size_t i = 0; i < len; ++i) out[i] = out[i] + right[i];
  }
  int p_, pof2_ = 1, levels_ = 0, rem_ = 0;
  std::vector<T> scratch_;
};

template <typename T>
void tree_sum(const std::vector<const T*>& x, size_t n, T* out) {
  TreeSum<T>(static_cast<int>(x.size())).sum(x, n, out);
}

// The sum over ranks of one number each, in MPICH's order (an allreduce of doubles).
double tree_sum(const std::vector<double>& v) {
  std::vector<const double*> x;
  for (const double& d : v) x.push_back(&d);
  double out = 0;
  tree_sum(x, 1, &out);
  return out;
}

std::vector<const float*> const_pointers(const std::vector<float*>& x) {
  return {x.begin(), x.end()};
}

// gossip.hierarchy = node (mode grad) on logical nodes of K consecutive ranks, as
// HierarchicalExchange does it: each node's average (the sum in tree_sum's order, which is MPI's
// reduce-scatter's for K = 2: one addition; for larger K MPI may add in another order), the
// pair average with the partner node's (the schedule over the nodes), the result in every rank
// of the node. Real ranks mix it slice by slice over the rails; the values are the same. Done a
// chunk of values at a time: one chunk of every node is held, not a copy of every node's buffer.
class VirtualHierarchy {
 public:
  static constexpr size_t kChunk = 1024;
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
  static int64_t bytes(int ranks, int per_node) {
    return static_cast<int64_t>(ranks / per_node) * kChunk * 2 * 4 +
           TreeSum<float>::bytes(per_node);
  }
  void exchange(int64_t step) {
    const int nodes = schedule_.p;
    std::vector<float> avg(static_cast<size_t>(nodes) * kChunk), mixed(kChunk);
    TreeSum<float> sum(k_);
    for (size_t off = 0; off < n_; off += kChunk) {
      const size_t len = std::min(kChunk, n_ - off);
      for (int node = 0; node < nodes; ++node) {
        std::vector<const float*> members;
        for (int l = 0; l < k_; ++l)
          members.push_back(x_[static_cast<size_t>(node * k_ + l)] + off);
        float* a = avg.data() + static_cast<size_t>(node) * kChunk;
        sum.sum(members, len, a);
        mean_of_sum({a, len}, k_);
      }
      for (int node = 0; node < nodes; ++node) {
        const float* own = avg.data() + static_cast<size_t>(node) * kChunk;
        std::copy(own, own + len, mixed.begin());
        if (nodes > 1) {
          const int from = partners::partners(schedule_, node, step).recv_from;
          mix_pair({mixed.data(), len}, {avg.data() + static_cast<size_t>(from) * kChunk, len});
        }
        for (int l = 0; l < k_; ++l)
          std::copy(mixed.begin(), mixed.begin() + static_cast<std::ptrdiff_t>(len),
                    x_[static_cast<size_t>(node * k_ + l)] + off);
      }
    }
  }

 private:
  std::vector<float*> x_;
  size_t n_;
  int k_;
  partners::Schedule schedule_;
  int64_t bytes_ = 0;
};

// Bytes the heap holds (glibc: every arena, and the blocks it mapped on its own).
int64_t heap_bytes() {
  const struct mallinfo2 m = mallinfo2();
  return static_cast<int64_t>(m.uordblks + m.hblkhd);
}

// A field of /proc/self/status in bytes (VmRSS, VmHWM, VmSize), 0 where unknown.
int64_t status_bytes(const std::string& field) {
  std::ifstream in("/proc/self/status");
  std::string key;
  int64_t kb = 0;
  while (in >> key) {
    if (key == field + ":" && in >> kb) return kb * 1024;
    std::getline(in, key);
  }
  return 0;
}

// What this process may still allocate, and what bounds it: the machine's available memory, the
// cgroup's limit, the address-space and data limits (ulimit -v, -d).
std::pair<int64_t, std::string> memory_left() {
  int64_t left = INT64_MAX;
  std::string why = "no limit found";
  const auto bound = [&](int64_t v, const std::string& what) {
    if (v < left) {
      left = std::max<int64_t>(0, v);
      why = what;
    }
  };
  {
    std::ifstream in("/proc/meminfo");
    std::string key;
    int64_t kb = 0;
    while (in >> key >> kb) {
      if (key == "MemAvailable:") bound(kb * 1024, "MemAvailable in /proc/meminfo");
      std::getline(in, key);
    }
  }
  {
    std::ifstream max("/sys/fs/cgroup/memory.max"), cur("/sys/fs/cgroup/memory.current");
    std::string m;
    int64_t c = 0;
    if (max >> m && m != "max" && cur >> c) bound(std::stoll(m) - c, "the cgroup's memory.max");
  }
  struct rlimit r = {};
  if (getrlimit(RLIMIT_AS, &r) == 0 && r.rlim_cur != RLIM_INFINITY)
    bound(static_cast<int64_t>(r.rlim_cur) - status_bytes("VmSize"), "ulimit -v");
  if (getrlimit(RLIMIT_DATA, &r) == 0 && r.rlim_cur != RLIM_INFINITY)
    bound(static_cast<int64_t>(r.rlim_cur) - status_bytes("VmData"), "ulimit -d");
  return {left, why};
}

std::string gigabytes(int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f GB", static_cast<double>(bytes) / 1e9);
  return text;
}

// log.losses lines held before they are written out (a file at a time: thousands of ranks would
// otherwise each keep a file open).
constexpr size_t kLossesHeld = 4 << 20;

class VirtualRun {
 public:
  explicit VirtualRun(const Config& c);
  ~VirtualRun();
  RunSummary run();

 private:
  struct StepOut {
    double loss = 0, loss_mean = 0, loss_min = 0, loss_max = 0, lr = 0, consensus = -1;
    double consensus_estimate = -1;  // gossip.consensus_bound (as StepStats)
    bool consensus_average = false;
    int64_t sent_bytes = 0;
    int64_t late_buckets = -1, unmixed_buckets = -1;  // rank 0's this step (staleness 1), as real
    double data_wait = 0;                             // rank 0's
  };
  void add_rank(const kernels::SgdOptions& so);
  void make_ranks();
  void make_exchanges();
  void plan_memory();
  void warm_up();
  StepOut step(int64_t s);
  void announce();
  void record(int64_t s, const StepOut& out, double seconds);
  void evaluate_and_report(int64_t s);
  void finish();
  void stop_if_asked(int64_t done);
  void write_losses(bool all);
  std::vector<float*> params() { return pointers(&Rank::params); }
  std::vector<float*> grads() { return pointers(&Rank::grads); }
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
  std::vector<VirtualExchange*> exchanges() {
    return {grad_x_.get(), weight_x_.get(), momentum_x_.get()};
  }

  const Config& c_;
  const Algorithm& algorithm_;
  const Cadence cadence_;  // when the weights travel, when the ranks are averaged
  const int ranks_;
  shuffle::DataSplits data_;
  shuffle::LoaderOptions lo_;
  kernels::Net net_;
  kernels::Executor* train_ = nullptr;
  kernels::Executor* eval_ = nullptr;       // evaluation_batch's executor (with evaluation data)
  kernels::Executor* rank_eval_ = nullptr;  // each rank's own top-1 (train.rank_eval_samples)
  partners::Schedule schedule_;
  std::vector<Rank> rank_;
  std::unique_ptr<SharedPermutation> permutation_;
  shuffle::Batch batch_;  // the batch of the rank whose turn it is
  std::unique_ptr<VirtualExchange> grad_x_, weight_x_, momentum_x_;
  std::unique_ptr<VirtualHierarchy> hierarchy_;  // gossip.hierarchy = node, in grad_x_'s place
  int64_t per_epoch_ = 0, total_ = 0, epochs_ = 0;
  double planned_epochs_ = 0;  // as a real run's start event
  int64_t model_due_ = -1;
  std::unique_ptr<kernels::LrSchedule> lr_;
  std::vector<float> dlogits_;
  MetricsWriter metrics_;
  std::string metrics_path_;
  Clock::time_point t_start_ = Clock::now();
  RunSummary summary_;
  double train_seconds_ = 0, last_print_ = -1e9, loss_avg_ = 0, data_wait_ = 0;
  int64_t sent_total_ = 0, consensus_averages_ = 0;
  int64_t unreported_bytes_ = 0;       // sent by an evaluation's flush: counted in the next step
  Lateness lateness0_, lateness_all_;  // staleness 1: rank 0's and every rank's, so far
  int64_t memory_estimate_ = 0, per_rank_bytes_ = 0;  // plan_memory's
  size_t losses_held_ = 0;                            // bytes of log.losses lines not yet written
};

// The compute threads, set before anything is compiled (oneDNN's primitives are made for them):
// train.threads, or every core of this machine.
shuffle::DataSplits open_data(const Config& c) {
  omp_set_num_threads(c.train.threads > 0
                          ? c.train.threads
                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  try {
    return shuffle::open_splits(data_source(c), val_labels_file(c));
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
      cadence_(cadence_of(c)),
      ranks_(c.train.virtual_ranks),
      data_(open_data(c)),
      lo_(rank_loader_options(c, *data_.train, 0, ranks_)),
      net_(
          kernels::build_model(model_spec(c, 0, input_of(c, *data_.train), data_.train->classes())),
          c.train.backend, std::max<int64_t>(1, c.gossip.bucket_kb * 256), c.train.precision),
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
  if (per_epoch_ < 1) throw UsageError(no_full_batch(c, data_.train->size(), ranks_, true));
  total_ = per_epoch_ * c.train.epochs;
  planned_epochs_ = static_cast<double>(c.train.epochs);
  if (c.train.max_steps > 0 && c.train.max_steps / per_epoch_ < c.train.epochs) {
    total_ = std::min(total_, c.train.max_steps);
    planned_epochs_ = static_cast<double>(c.train.max_steps) / static_cast<double>(per_epoch_);
  }
  epochs_ = (total_ + per_epoch_ - 1) / per_epoch_;
  lr_ = std::make_unique<kernels::LrSchedule>(kernels::LrScheduleOptions{
      c.train.lr, c.train.base_batch, c.train.batch * ranks_,
      static_cast<int64_t>(std::llround(c.train.warmup_epochs * static_cast<double>(per_epoch_))),
      total_, 0.0});
  // Thousands of per-rank buffers: from the heap, not one mapping each (vm.max_map_count).
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  permutation_ = std::make_unique<SharedPermutation>(data_.train->size(), lo_.seed);
  make_ranks();
}

VirtualRun::~VirtualRun() {
  try {
    write_losses(true);  // a run that stops or fails keeps the lines of the steps it took
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gossipgrad: %s\n", e.what());
  }
}

// One forward, backward and evaluation pass before the memory is measured: oneDNN allocates its
// scratch memory when a primitive first runs. The network's own buffers are written again by
// every rank's turn (load), so nothing of this pass reaches training.
void VirtualRun::warm_up() {
  kernels::ParamStore& store = net_.store();
  const std::vector<float> buffers(store.buffers.begin(), store.buffers.end());
  const auto input = static_cast<size_t>(kernels::numel(net_.graph().input_dims()));
  std::vector<float> x(static_cast<size_t>(train_->batch()) * input, 0.f);
  train_->forward(x.data(), true);
  std::fill(dlogits_.begin(), dlogits_.end(), 0.f);
  train_->backward(dlogits_.data(), {});
  for (kernels::Executor* e : {eval_, rank_eval_}) {
    if (!e) continue;
    x.assign(static_cast<size_t>(e->batch()) * input, 0.f);
    e->forward(x.data(), false);
  }
  store.buffers = buffers;  // the training pass moved the running statistics
}

// Rank r (the next): its state, loader, log.losses file and its part of every exchange.
void VirtualRun::add_rank(const kernels::SgdOptions& so) {
  const kernels::Graph& g = net_.graph();
  const kernels::ParamStore& store = net_.store();
  const int r = static_cast<int>(rank_.size());
  Rank& k = rank_.emplace_back(g.param_count(), g.buffer_count(), so);
  std::copy(store.params.data(), store.params.data() + store.params.size(), k.params.begin());
  std::copy(store.buffers.begin(), store.buffers.end(), k.buffers.begin());
  shuffle::LoaderOptions o = lo_;
  o.rank = r;
  o.workers = 0;  // built when the rank's turn comes: no thread per rank
  k.order = std::make_unique<RankSlice>(*permutation_, r, ranks_, per_epoch_);
  k.loader = std::make_unique<shuffle::PrefetchLoader>(*data_.train, o, 0, epochs_, k.order.get());
  if (!c_.log.losses.empty()) {
    const std::string path = rank_log_path(c_.log.losses, r);
    std::ofstream file(path, std::ios::trunc);  // written by write_losses, a file at a time
    if (!file) throw std::runtime_error("log.losses: cannot write " + path);
  }
  if (grad_x_) grad_x_->add_rank(k.grads.data());
  if (weight_x_) weight_x_->add_rank(k.params.data());
  if (momentum_x_) momentum_x_->add_rank(k.sgd.velocity().data());
}

// Every rank starts from the same initial weights (real ranks: rank 0's, broadcast), with its own
// momentum, log.losses file and exchanges' codecs. Rank 0 is built first and measured: the run is
// refused before the others are made if they would not fit (plan_memory).
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
  train_ = &net_.at_batch(c.train.batch);
  if (data_.eval)
    eval_ = &net_.at_batch(evaluation_batch(c.train.eval_batch, data_.eval->size(), ranks_));
  if (data_.eval && c.train.rank_eval_samples > 0)
    rank_eval_ = &net_.at_batch(evaluation_batch(
        c.train.eval_batch, std::min(c.train.rank_eval_samples, data_.eval->size()), 1));
  const kernels::SgdOptions so{static_cast<float>(c.train.momentum),
                               static_cast<float>(c.train.weight_decay), c.train.nesterov};
  warm_up();
  make_exchanges();
  rank_.reserve(static_cast<size_t>(ranks_));
  const int64_t before = heap_bytes();
  add_rank(so);
  per_rank_bytes_ = heap_bytes() - before + static_cast<int64_t>(sizeof(Rank));
  plan_memory();
  while (static_cast<int>(rank_.size()) < ranks_) add_rank(so);
  if (algorithm_.grads && c.gossip.hierarchy == Hierarchy::Node)
    hierarchy_ = std::make_unique<VirtualHierarchy>(
        grads(), rank_[0].grads.size(), c.network.ranks_per_node, schedule_, net_.buckets());
}

// The memory the run will hold at its peak: what the process holds now (the network, the data,
// the executors' scratch), each rank's state as rank 0's measured, what the ranks' public copies
// or factors grow to as they meet partners, and the shared temporaries (the epoch's permutation,
// the sums over ranks, the evaluation's averages, the loss lines held). Refused in one line when
// it exceeds what the machine, the cgroup or the ulimits leave.
void VirtualRun::plan_memory() {
  const kernels::Graph& g = net_.graph();
  int64_t grow = 0;
  const int64_t rounds = cadence_.rounds(total_);
  if (grad_x_) grow += grad_x_->growth_bytes(schedule_, total_);
  if (weight_x_) grow += weight_x_->growth_bytes(schedule_, rounds);
  if (momentum_x_) grow += momentum_x_->growth_bytes(schedule_, rounds);
  const int64_t model = (g.param_count() + g.buffer_count()) * 4;
  const int64_t shared =
      // The epoch's permutation, and the ranks' slices of it their loaders take at their first
      // batch; the batch; the sums over ranks; the evaluation's average model.
      2 * permutation_->bytes() +
      static_cast<int64_t>(dlogits_.size() / net_.graph().classes()) *
          kernels::numel(net_.graph().input_dims()) * 4 +
      TreeSum<float>::bytes(ranks_) + 3 * model +
      static_cast<int64_t>(ranks_) * 16 +  // per-rank distances, top-1 counts
      (algorithm_.grads && c_.gossip.hierarchy == Hierarchy::Node
           ? VirtualHierarchy::bytes(ranks_, std::max(1, c_.network.ranks_per_node))
           : 0) +
      (c_.log.losses.empty() ? 0 : 2 * kLossesHeld);
  per_rank_bytes_ += grow;
  const int64_t now = status_bytes("VmRSS");
  const int64_t more = static_cast<int64_t>(ranks_ - 1) * per_rank_bytes_ + shared;
  memory_estimate_ = now + more;
  const auto [left, bound] = memory_left();
  if (more <= left) return;
  const int64_t fit =
      std::max<int64_t>(0, (left - shared) / std::max<int64_t>(1, per_rank_bytes_) + 1);
  char per_rank[32];
  std::snprintf(per_rank, sizeof per_rank, "%.2f MB", static_cast<double>(per_rank_bytes_) / 1e6);
  throw UsageError(
      "train.virtual_ranks = " + std::to_string(ranks_) + " needs about " +
      gigabytes(memory_estimate_) + " (" + gigabytes(now) + " for the network and data, " +
      per_rank + " per virtual rank as measured on rank 0, " + gigabytes(shared) +
      " shared) but only " + gigabytes(left) + " more can be had (" + bound + "): use at most " +
      std::to_string(fit) + " virtual ranks, or a smaller model or batch");
}

// Every rank's exchanges, with the options of a real rank's (exchange_options, config.hpp); the
// ranks join them as they are made.
void VirtualRun::make_exchanges() {
  const Config& c = c_;
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
  // A real rank's options, with the run's schedule and what its rules read of the model.
  const auto options = [&](Mixed what) {
    GossipOptions o = exchange_options(c, what);
    o.schedule = schedule_;
    try {
      fit_to_model(o, net_.graph(), net_.layout(), c.model.name);
    } catch (const std::invalid_argument& e) {
      throw UsageError(e.what());
    }
    return o;
  };
  if (algorithm_.grads && c.gossip.hierarchy != Hierarchy::Node)
    grad_x_ = std::make_unique<VirtualExchange>(options(Mixed::Grads), buckets, late(0));
  if (algorithm_.weights)
    weight_x_ = std::make_unique<VirtualExchange>(options(Mixed::Weights), buckets, late(1));
  if (algorithm_.momentum)
    momentum_x_ = std::make_unique<VirtualExchange>(options(Mixed::Momentum), buckets, late(1));
}

std::vector<float*> VirtualRun::pointers(std::vector<float> Rank::*member) {
  std::vector<float*> x;
  for (Rank& r : rank_) x.push_back((r.*member).data());
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
  if (bound <= 0 || !weight_x_ || !cadence_.weights_after(s)) return;
  // As Trainer::control_consensus: relative to the ranks' mean ||w||^2, both summed over the ranks
  // in an allreduce's order.
  std::vector<double> norms;
  for (const Rank& r : rank_) norms.push_back(squared_norm(r.params));
  const double norm = tree_sum(norms);
  const double d = tree_sum(weight_x_->take_distances());
  out.consensus_estimate = norm > 0 ? d / (2 * norm) : 0;
  if (out.consensus_estimate <= bound) return;
  flush_model(out);
  average(params(), rank_[0].params.size());
  average(pointers(&Rank::buffers), rank_[0].buffers.size());
  weight_x_->take_distances();  // as Trainer::forget_distance
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
  std::vector<float> sum(n);
  tree_sum(const_pointers(x), n, sum.data());
  mean_of_sum(sum, ranks_);
  for (float* v : x) std::copy(sum.begin(), sum.end(), v);
}

std::vector<float> VirtualRun::mean_of(std::vector<float> Rank::*member) {
  std::vector<float> avg((rank_[0].*member).size());
  tree_sum(const_pointers(pointers(member)), avg.size(), avg.data());
  mean_of_sum(avg, ranks_);
  return avg;
}

// As Trainer::distance_to_average: each rank's distance, summed in an allreduce's order.
double VirtualRun::consensus(const std::vector<float>& avg) {
  std::vector<double> d;
  for (const Rank& r : rank_) d.push_back(squared_distance(r.params, avg));
  return tree_sum(d) / ranks_;
}

VirtualRun::StepOut VirtualRun::step(int64_t s) {
  StepOut out;
  out.sent_bytes = std::exchange(unreported_bytes_, 0);
  start_model_exchange(out);  // the last update's weights (overlap_model), as on real ranks
  // Every rank's forward and backward on its own batch, its weights and statistics swapped in.
  kernels::ParamStore& store = net_.store();
  const int64_t classes = net_.graph().classes();
  for (Rank& r : rank_) {
    // A stop is taken up between two ranks' turns: a step of thousands of ranks can take minutes.
    stop_if_asked(s);
    if (!r.loader->next(batch_))
      throw std::logic_error("virtual ranks: a rank's data ended before step " + std::to_string(s));
    load(r);
    train_->set_dropout_step(static_cast<uint64_t>(s));
    const float* logits = train_->forward(batch_.x.data(), true);
    r.loss = kernels::softmax_cross_entropy(logits, batch_.y.data(), c_.train.batch, classes,
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
  if (weight_x_ && cadence_.weights_after(s)) exchange_after_update(cadence_.round(s), out);
  if (cadence_.global_after(s)) {
    flush_model(out);
    average(params(), rank_[0].params.size());
    average(pointers(&Rank::buffers), rank_[0].buffers.size());
    if (weight_x_) weight_x_->take_distances();  // as Trainer::forget_distance
  }
  control_consensus(s, out);
  if (c_.gossip.staleness == 1) count_lateness(out);
  const int64_t n = c_.gossip.consensus_every;
  if (n > 0 && (s + 1) % n == 0) out.consensus = consensus(mean_of(&Rank::params));
  // The step event's loss is rank 0's, as a real run's; the mean, min and max over the ranks
  // come beside it.
  out.loss = out.loss_min = out.loss_max = rank_[0].loss;
  out.data_wait = rank_[0].loader->wait_seconds();
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
  // The average model, evaluated as real ranks do it: each rank its share of the test set, the
  // sums added in an allreduce's order.
  const std::vector<float> avg_params = mean_of(&Rank::params);
  kernels::ParamStore& store = net_.store();
  std::copy(avg_params.begin(), avg_params.end(), store.params.data());
  store.buffers = mean_of(&Rank::buffers);
  shuffle::LoaderOptions o = lo_;
  o.workers = 0;
  std::array<std::vector<double>, 4> parts;
  for (int r = 0; r < ranks_; ++r) {
    stop_if_asked(summary_.steps);
    const EvalSums sums =
        evaluation_sums(*eval_, net_.graph().classes(), *data_.eval, o, r, ranks_);
    for (size_t k = 0; k < parts.size(); ++k) parts[k].push_back(sums[k]);
  }
  EvalSums total;
  for (size_t k = 0; k < parts.size(); ++k) total[k] = tree_sum(parts[k]);
  EvalStats e = eval_stats(total);
  e.consensus = consensus(avg_params);
  return e;
}

RankTop1 VirtualRun::rank_top1() {
  RankTop1 t;
  if (!rank_eval_) return t;
  kernels::Executor& exec = *rank_eval_;
  shuffle::LoaderOptions o = evaluation_loader(lo_, exec.batch(), 0, 1);
  o.workers = 0;
  shuffle::PrefetchLoader loader(*data_.eval, o, 0, 1);
  shuffle::Batch b;
  std::vector<int64_t> correct(rank_.size(), 0);
  // Ranks x batches forward passes: at thousands of ranks, minutes; a progress line shows them.
  const int64_t wanted = std::min(c_.train.rank_eval_samples, data_.eval->size());
  const int64_t passes = (wanted + exec.batch() - 1) / exec.batch() * ranks_;
  const auto t0 = Clock::now();
  double printed = 0;
  int64_t done = 0;
  // Whole evaluation batches, until at least rank_eval_samples samples.
  while (t.samples < c_.train.rank_eval_samples && loader.next(b)) {
    for (size_t r = 0; r < rank_.size(); ++r, ++done) {
      stop_if_asked(summary_.steps);
      if (const double now = seconds_since(t0);
          c_.log.progress && now - printed >= c_.log.interval && done > 0) {
        printed = now;
        std::printf(
            "VIRTUAL each rank's own top-1: %lld/%lld forward passes  ETA %s\n",
            static_cast<long long>(done), static_cast<long long>(passes),
            format_duration(now * static_cast<double>(passes - done) / static_cast<double>(done))
                .c_str());
        std::fflush(stdout);
      }
      load(rank_[r]);
      const float* logits = exec.forward(b.x.data(), false);
      correct[r] += kernels::softmax_cross_entropy(logits, b.y.data(), exec.batch(),
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
                                 : "gossip " + c_.gossip.mode + " (" + text_of(c_.gossip.schedule) +
                                       (c_.gossip.rotate ? "+rotate" : "") + ")";
  std::printf(
      "gossipgrad: %d VIRTUAL ranks in one process (%d threads; one after another on one "
      "network), %s (%lld params), %s backend; memory about %s (%.1f MB per rank, measured on "
      "rank 0)\n",
      ranks_, threads, c_.model.name.c_str(), static_cast<long long>(g.param_count()),
      text_of(c_.train.backend).c_str(), gigabytes(memory_estimate_).c_str(),
      static_cast<double>(per_rank_bytes_) / 1e6);
  std::printf(
      "gossipgrad: %lld train / %lld test samples, global batch %lld, %lld steps/epoch, %lld "
      "epochs, peak lr %.4g, mixing: %s\n",
      static_cast<long long>(data_.train->size()),
      static_cast<long long>(data_.eval ? data_.eval->size() : 0),
      static_cast<long long>(global_batch), static_cast<long long>(per_epoch_),
      static_cast<long long>(epochs_), lr_->peak(), mixing.c_str());
  std::fflush(stdout);
  nlohmann::json start = start_event(c_, {.ranks = ranks_,
                                          .threads = threads,
                                          .params = g.param_count(),
                                          .global_batch = global_batch,
                                          .steps = total_,
                                          .epochs_planned = planned_epochs_,
                                          .fault_strategy = c_.fault.strategy});
  start["memory_estimate_bytes"] = memory_estimate_;
  metrics_.write(start);
}

// log.losses: every rank's lines held so far, appended to its file (all: whatever is held;
// otherwise only once kLossesHeld bytes are).
void VirtualRun::write_losses(bool all) {
  if (c_.log.losses.empty() || losses_held_ == 0 || (!all && losses_held_ < kLossesHeld)) return;
  for (size_t r = 0; r < rank_.size(); ++r) {
    if (rank_[r].losses.empty()) continue;
    const std::string path = rank_log_path(c_.log.losses, static_cast<int>(r));
    std::ofstream file(path, std::ios::app);
    file << rank_[r].losses;
    file.close();
    if (!file) throw std::runtime_error("log.losses: cannot write " + path + " (disk full?)");
    rank_[r].losses.clear();
  }
  losses_held_ = 0;
}

// The step's losses (log.losses), metrics event and progress line, with the fields of a real
// run's (step_hooks.cpp, Progress); comm_s and shuffle_s are 0: nothing moves between processes.
void VirtualRun::record(int64_t s, const StepOut& out, double seconds) {
  train_seconds_ += seconds;
  sent_total_ += out.sent_bytes;
  summary_.steps = s + 1;
  if (!std::isfinite(out.loss_mean))
    throw std::runtime_error("virtual ranks: a loss is NaN or inf at step " + std::to_string(s) +
                             ": lower train.lr");
  if (!c_.log.losses.empty()) {
    for (Rank& r : rank_) {
      const std::string line = loss_line(s, r.loss);
      r.losses += line;
      losses_held_ += line.size();
    }
    write_losses(false);
  }
  const int64_t global_batch = c_.train.batch * ranks_;
  const double data_wait = out.data_wait - data_wait_;
  data_wait_ = out.data_wait;
  // As a real rank 0's step (nothing moves between processes: no exposed communication).
  StepStats st;
  st.loss = out.loss;
  st.lr = out.lr;
  st.sent_bytes = algorithm_.allreduce ? -1 : out.sent_bytes;
  st.late_buckets = out.late_buckets;
  st.unmixed_buckets = out.unmixed_buckets;
  st.consensus_estimate = out.consensus_estimate;
  st.consensus_average = out.consensus_average;
  nlohmann::json event = step_event({.step = s,
                                     .epoch = s / per_epoch_,
                                     .seconds = seconds,
                                     .global_batch = global_batch,
                                     .data_wait_s = data_wait,
                                     .skipped = rank_[0].loader->skipped()},
                                    st);
  event["loss_mean"] = out.loss_mean;
  event["loss_min"] = out.loss_min;
  event["loss_max"] = out.loss_max;
  metrics_.write(event);
  if (out.consensus >= 0) metrics_.write(consensus_event(s, out.consensus));
  loss_avg_ = s == 0 ? out.loss : 0.95 * loss_avg_ + 0.05 * out.loss;
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
  nlohmann::json event = eval_event(epoch + 1, s + 1, e, ranks_, seconds_since(t_start_));
  if (rt.samples > 0)
    event["rank_top1"] = {
        {"min", rt.min}, {"median", rt.median}, {"max", rt.max}, {"samples", rt.samples}};
  metrics_.write(event);
}

// SIGTERM or Ctrl-C: as on real ranks, the run ends after the last whole step with a `stopped`
// event and one line (there is no checkpoint to write: virtual ranks refuse checkpoint.dir).
void VirtualRun::stop_if_asked(int64_t done) {
  const int signal = StopSignals::requested();
  if (signal == 0) return;
  metrics_.write(stopped_event(signal_name(signal), done));
  throw StopRequested(signal, std::string("stopped by ") + signal_name(signal) + " after step " +
                                  std::to_string(done) + " of " + std::to_string(total_) +
                                  ": no checkpoint.dir, so nothing was saved");
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
  int64_t skipped = 0;
  for (const Rank& r : rank_) skipped += r.loader->skipped();
  summary.skipped_samples = skipped;
  const int64_t peak = status_bytes("VmHWM");
  std::printf(
      "done: %lld steps of %d VIRTUAL ranks in %s (%.0f img/s in this one process), %s%s; peak "
      "memory %s of about %s planned (metrics: %s)\n",
      static_cast<long long>(summary.steps), ranks_, format_duration(summary.wall_seconds).c_str(),
      summary.images_per_second, top1, lateness, gigabytes(peak).c_str(),
      gigabytes(memory_estimate_).c_str(), metrics_path_.c_str());
  nlohmann::json event = summary_event({.steps = summary.steps,
                                        .per_epoch = per_epoch_,
                                        .eval_step = evaluated ? summary.eval_step : -1,
                                        .epochs_planned = planned_epochs_,
                                        .top1 = summary.final_top1,
                                        .top5 = summary.final_top5,
                                        .wall_s = summary.wall_seconds,
                                        .images_per_s = summary.images_per_second,
                                        .train_s = train_seconds_,
                                        .data_wait_s = data_wait_,
                                        .params = net_.graph().param_count(),
                                        .skipped = skipped,
                                        .consensus_averages = consensus_averages_,
                                        .ranks = ranks_});
  event["sent_bytes_per_step"] =
      algorithm_.allreduce ? nlohmann::json() : nlohmann::json(bytes_per_step);
  event["late_buckets"] = stale ? nlohmann::json(lateness_all_.late) : nlohmann::json();
  event["unmixed_buckets"] = stale ? nlohmann::json(lateness_all_.unmixed) : nlohmann::json();
  event["memory_estimate_bytes"] = memory_estimate_;
  event["peak_memory_bytes"] = peak;
  metrics_.write(event);
}

RunSummary VirtualRun::run() {
  t_start_ = Clock::now();
  announce();
  for (int64_t s = 0; s < total_; ++s) {
    const auto t0 = Clock::now();
    const StepOut out = step(s);
    record(s, out, seconds_since(t0));
    stop_if_asked(s + 1);
    if (data_.eval && ((s + 1) % per_epoch_ == 0 || s + 1 == total_)) evaluate_and_report(s);
  }
  write_losses(true);
  finish();
  return summary_;
}

}  // namespace

RunSummary run_virtual(const Config& c) {
  // SIGTERM, SIGINT: the run stops between two ranks' turns (VirtualRun::stop_if_asked).
  StopSignals stop_signals(600);  // a rank's turn (one forward and backward) is far shorter
  VirtualRun run(c);
  return run.run();
}

}  // namespace gg::gossip
