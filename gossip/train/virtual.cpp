#include "gossip/train/virtual.hpp"

#include <malloc.h>
#include <omp.h>
#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gossip/comm/tree_sum.hpp"
#include "gossip/train/data.hpp"
#include "gossip/train/events.hpp"
#include "gossip/train/job.hpp"
#include "gossip/train/metrics.hpp"
#include "gossip/train/step_hooks.hpp"
#include "gossip/train/stop_signals.hpp"
#include "gossip/train/trainer.hpp"
#include "kernels/loss.hpp"
#include "shuffle/loader.hpp"

namespace gg::gossip {
namespace {

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

// One logical rank's data: its order of the samples and its loader (its batch is built when its
// turn comes, a loader without threads into the run's one batch), and its log.losses lines,
// waiting in `losses` until the run writes them out. Its model is the trainer's (add_rank).
struct Rank {
  std::unique_ptr<RankSlice> order;
  std::unique_ptr<shuffle::PrefetchLoader> loader;
  std::string losses;  // log.losses lines not yet written
};

struct RankTop1 {
  double min = 0, median = 0, max = 0;
  int64_t samples = 0;
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
  VirtualRun(const Config& c, const mpi::Comm& world);
  ~VirtualRun();
  RunSummary run();

 private:
  void add_rank();
  void make_ranks();
  void plan_memory();
  void warm_up();
  StepStats step(int64_t s);
  void announce();
  void record(int64_t s, const StepStats& st, double seconds);
  void evaluate_and_report(int64_t s);
  void finish();
  void stop_if_asked(int64_t done);
  void write_losses(bool all);
  RankTop1 rank_top1();

  const Config& c_;
  const Algorithm& algorithm_;
  const int ranks_;
  shuffle::DataSplits data_;
  shuffle::LoaderOptions lo_;
  int64_t per_epoch_ = 0, total_ = 0, epochs_ = 0;
  double planned_epochs_ = 0;               // as a real run's start event
  std::unique_ptr<Trainer> trainer_;        // the ranks' models, their step and exchanges
  kernels::Executor* rank_eval_ = nullptr;  // each rank's own top-1 (train.rank_eval_samples)
  std::vector<Rank> rank_;
  std::unique_ptr<SharedPermutation> permutation_;
  shuffle::Batch batch_;  // the batch of the rank whose turn it is
  MetricsWriter metrics_;
  std::string metrics_path_;
  Clock::time_point t_start_ = Clock::now();
  RunSummary summary_;
  double train_seconds_ = 0, last_print_ = -1e9, loss_avg_ = 0, data_wait_ = 0;
  int64_t sent_total_ = 0;
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

VirtualRun::VirtualRun(const Config& c, const mpi::Comm& world)
    : c_(c),
      algorithm_(mixing_of(c)),
      ranks_(c.train.virtual_ranks),
      data_(open_data(c)),
      lo_(rank_loader_options(c, *data_.train, 0, ranks_)) {
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
  // Thousands of per-rank buffers: from the heap, not one mapping each (vm.max_map_count).
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  trainer_ = std::make_unique<Trainer>(c, world, input_of(c, *data_.train), data_.train->classes(),
                                       total_, per_epoch_);
  for (const kernels::Node& node : trainer_->graph().nodes())
    if (node.op == kernels::Op::Dropout)
      throw UsageError("train.virtual_ranks: " + c.model.name +
                       " has dropout, whose masks are seeded per rank; virtual ranks share one "
                       "network and do not reproduce them: use a model without dropout");
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
// every rank's turn (Trainer::load), so nothing of this pass reaches training.
void VirtualRun::warm_up() {
  kernels::Net& net = trainer_->net();
  kernels::ParamStore& store = net.store();
  const std::vector<float> buffers(store.buffers.begin(), store.buffers.end());
  const auto input = static_cast<size_t>(kernels::numel(net.graph().input_dims()));
  kernels::Executor& train = net.at_batch(c_.train.batch);
  std::vector<float> x(static_cast<size_t>(train.batch()) * input, 0.f);
  train.forward(x.data(), true);
  const std::vector<float> dlogits(static_cast<size_t>(train.batch() * net.graph().classes()));
  train.backward(dlogits.data(), {});
  kernels::Executor* eval =
      data_.eval ? &trainer_->evaluation_executor(data_.eval->size()) : nullptr;
  for (kernels::Executor* e : {eval, rank_eval_}) {
    if (!e) continue;
    x.assign(static_cast<size_t>(e->batch()) * input, 0.f);
    e->forward(x.data(), false);
  }
  store.buffers = buffers;  // the training pass moved the running statistics
}

// Rank r (the next): its model (the trainer's), loader and log.losses file.
void VirtualRun::add_rank() {
  const int r = static_cast<int>(rank_.size());
  trainer_->add_rank();
  Rank& k = rank_.emplace_back();
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
}

// Every rank starts from the same initial weights (real ranks: rank 0's, broadcast), with its own
// momentum, log.losses file and exchanges' state. Rank 0 is made first and measured: the run is
// refused before the others are made if they would not fit (plan_memory).
void VirtualRun::make_ranks() {
  const Config& c = c_;
  if (data_.eval && c.train.rank_eval_samples > 0)
    rank_eval_ = &trainer_->net().at_batch(evaluation_batch(
        c.train.eval_batch, std::min(c.train.rank_eval_samples, data_.eval->size()), 1));
  warm_up();
  rank_.reserve(static_cast<size_t>(ranks_));
  const int64_t before = heap_bytes();
  add_rank();
  per_rank_bytes_ = heap_bytes() - before + static_cast<int64_t>(sizeof(Rank));
  plan_memory();
  while (static_cast<int>(rank_.size()) < ranks_) add_rank();
}

// The memory the run will hold at its peak: what the process holds now (the network, the data,
// the executors' scratch), each rank's state as rank 0's measured, what the ranks' public copies
// or factors grow to as they meet partners, and the shared temporaries (the epoch's permutation,
// the sums over ranks, the evaluation's averages, the loss lines held). Refused in one line when
// it exceeds what the machine, the cgroup or the ulimits leave.
void VirtualRun::plan_memory() {
  const kernels::Graph& g = trainer_->graph();
  const int64_t model = (g.param_count() + g.buffer_count()) * 4;
  const int64_t shared =
      // The epoch's permutation, and the ranks' slices of it their loaders take at their first
      // batch; the batch; the sums over ranks; the evaluation's average model.
      2 * permutation_->bytes() + c_.train.batch * kernels::numel(g.input_dims()) * 4 +
      TreeSum<float>::bytes(ranks_) + 3 * model +
      static_cast<int64_t>(ranks_) * 16 +  // per-rank distances, top-1 counts
      (algorithm_.grads && c_.gossip.hierarchy == Hierarchy::Node
           ? VirtualHierarchy::bytes(ranks_, std::max(1, c_.network.ranks_per_node))
           : 0) +
      (c_.log.losses.empty() ? 0 : 2 * kLossesHeld);
  per_rank_bytes_ += trainer_->growth_bytes(total_);
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

// The trainer's step over every rank, each rank's batch built when its turn comes.
StepStats VirtualRun::step(int64_t s) {
  return trainer_->step([&](int r) {
    // A stop is taken up between two ranks' turns: a step of thousands of ranks can take minutes.
    stop_if_asked(s);
    if (!rank_[static_cast<size_t>(r)].loader->next(batch_))
      throw std::logic_error("virtual ranks: a rank's data ended before step " + std::to_string(s));
    return StepInput{batch_.x.data(), batch_.y.data()};
  });
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
      trainer_->load(static_cast<int>(r));
      const float* logits = exec.forward(b.x.data(), false);
      correct[r] += kernels::softmax_cross_entropy(logits, b.y.data(), exec.batch(),
                                                   trainer_->graph().classes(), nullptr)
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
  const kernels::Graph& g = trainer_->graph();
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
      static_cast<long long>(epochs_),
      c_.train.lr * static_cast<double>(global_batch) / static_cast<double>(c_.train.base_batch),
      mixing.c_str());
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
void VirtualRun::record(int64_t s, const StepStats& st, double seconds) {
  train_seconds_ += seconds;
  if (st.sent_bytes > 0) sent_total_ += st.sent_bytes;
  summary_.steps = s + 1;
  // The step event's loss is rank 0's, as a real run's; the mean, min and max over the ranks
  // come beside it.
  double loss_mean = 0, loss_min = st.loss, loss_max = st.loss;
  for (int r = 0; r < ranks_; ++r) {
    const double loss = trainer_->loss_of(r);
    loss_mean += loss / ranks_;
    loss_min = std::min(loss_min, loss);
    loss_max = std::max(loss_max, loss);
  }
  if (!std::isfinite(loss_mean))
    throw std::runtime_error("virtual ranks: a loss is NaN or inf at step " + std::to_string(s) +
                             ": lower train.lr");
  if (!c_.log.losses.empty()) {
    for (int r = 0; r < ranks_; ++r) {
      const std::string line = loss_line(s, trainer_->loss_of(r));
      rank_[static_cast<size_t>(r)].losses += line;
      losses_held_ += line.size();
    }
    write_losses(false);
  }
  const int64_t global_batch = c_.train.batch * ranks_;
  const double waited = rank_[0].loader->wait_seconds();  // rank 0's, as a real run's
  const double data_wait = waited - data_wait_;
  data_wait_ = waited;
  // As a real rank 0's step (nothing moves between processes: no exposed communication).
  StepStats out = st;
  out.comm_seconds = 0;
  nlohmann::json event = step_event({.step = s,
                                     .epoch = s / per_epoch_,
                                     .seconds = seconds,
                                     .global_batch = global_batch,
                                     .data_wait_s = data_wait,
                                     .skipped = rank_[0].loader->skipped()},
                                    out);
  event["loss_mean"] = loss_mean;
  event["loss_min"] = loss_min;
  event["loss_max"] = loss_max;
  metrics_.write(event);
  if (st.consensus >= 0) metrics_.write(consensus_event(s, st.consensus));
  loss_avg_ = s == 0 ? st.loss : 0.95 * loss_avg_ + 0.05 * st.loss;
  const double now = seconds_since(t_start_);
  if (!c_.log.progress || (now - last_print_ < c_.log.interval && s + 1 < total_)) return;
  last_print_ = now;
  const double done = static_cast<double>(s + 1);
  std::printf("VIRTUAL step %6lld/%lld  epoch %lld/%lld  loss %.4f  lr %.4f  %.0f img/s  ETA %s\n",
              static_cast<long long>(s + 1), static_cast<long long>(total_),
              static_cast<long long>(s / per_epoch_ + 1), static_cast<long long>(epochs_),
              loss_avg_, st.lr, static_cast<double>(global_batch) * done / train_seconds_,
              format_duration(static_cast<double>(total_ - s - 1) * train_seconds_ / done).c_str());
  std::fflush(stdout);
}

void VirtualRun::evaluate_and_report(int64_t s) {
  // The average model, evaluated as real ranks do it: each rank its share of the test set, the
  // sums added in an allreduce's order.
  shuffle::LoaderOptions o = lo_;
  o.workers = 0;
  const EvalStats e = trainer_->evaluate(*data_.eval, o);
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
                  static_cast<long long>(trainer_->held_lateness().late),
                  static_cast<long long>(trainer_->held_lateness().unmixed));
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
                                        .params = trainer_->graph().param_count(),
                                        .skipped = skipped,
                                        .consensus_averages = trainer_->consensus_averages(),
                                        .ranks = ranks_});
  event["sent_bytes_per_step"] =
      algorithm_.allreduce ? nlohmann::json() : nlohmann::json(bytes_per_step);
  const BucketExchange::Lateness lateness_all = trainer_->held_lateness();
  event["late_buckets"] = stale ? nlohmann::json(lateness_all.late) : nlohmann::json();
  event["unmixed_buckets"] = stale ? nlohmann::json(lateness_all.unmixed) : nlohmann::json();
  event["memory_estimate_bytes"] = memory_estimate_;
  event["peak_memory_bytes"] = peak;
  metrics_.write(event);
}

RunSummary VirtualRun::run() {
  t_start_ = Clock::now();
  announce();
  for (int64_t s = 0; s < total_; ++s) {
    const auto t0 = Clock::now();
    const StepStats st = step(s);
    record(s, st, seconds_since(t0));
    stop_if_asked(s + 1);
    if (data_.eval && ((s + 1) % per_epoch_ == 0 || s + 1 == total_)) evaluate_and_report(s);
  }
  write_losses(true);
  finish();
  return summary_;
}

}  // namespace

RunSummary run_virtual(const Config& c, const mpi::Comm& world) {
  // SIGTERM, SIGINT: the run stops between two ranks' turns (VirtualRun::stop_if_asked).
  StopSignals stop_signals(600);  // a rank's turn (one forward and backward) is far shorter
  VirtualRun run(c, world);
  return run.run();
}

}  // namespace gg::gossip
