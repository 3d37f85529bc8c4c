#include "gossip/train/virtual.hpp"

#include <malloc.h>
#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "gossip/comm/tree_sum.hpp"
#include "gossip/train/events.hpp"
#include "gossip/train/job.hpp"
#include "gossip/train/step_hooks.hpp"
#include "gossip/train/stop_signals.hpp"
#include "kernels/loss.hpp"
#include "shuffle/loader.hpp"

namespace gg::gossip {
namespace {

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

struct RankTop1 {
  double min = 0, median = 0, max = 0;
  int64_t samples = 0;
};

}  // namespace

VirtualRanks::VirtualRanks(const Config& c, Trainer& trainer, TrainingData& data, int64_t total,
                           int64_t epochs)
    : c_(c),
      trainer_(trainer),
      data_(data),
      ranks_(c.train.virtual_ranks),
      total_(total),
      epochs_(epochs),
      losses_(static_cast<size_t>(c.train.virtual_ranks)) {
  for (const kernels::Node& node : trainer.graph().nodes())
    if (node.op == kernels::Op::Dropout)
      throw UsageError("train.virtual_ranks: " + c.model.name +
                       " has dropout, whose masks are seeded per rank; virtual ranks share one "
                       "network and do not reproduce them: use a model without dropout");
  // Thousands of per-rank buffers: from the heap, not one mapping each (vm.max_map_count).
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  const shuffle::SampleSource* eval = data.eval_source();
  if (eval && c.train.rank_eval_samples > 0)
    rank_eval_ = &trainer.net().at_batch(
        evaluation_batch(c.train.eval_batch, std::min(c.train.rank_eval_samples, eval->size()), 1));
  warm_up();
  const int64_t before = heap_bytes();
  add_rank();
  per_rank_bytes_ = heap_bytes() - before;
  plan_memory();
  for (int r = 1; r < ranks_; ++r) add_rank();
}

VirtualRanks::~VirtualRanks() {
  try {
    write_losses(true);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gossipgrad: %s\n", e.what());
  }
}

// One forward, backward and evaluation pass before the memory is measured: oneDNN allocates its
// scratch memory when a primitive first runs. The network's own buffers are written again by
// every rank's turn (Trainer::load), so nothing of this pass reaches training.
void VirtualRanks::warm_up() {
  kernels::Net& net = trainer_.net();
  kernels::ParamStore& store = net.store();
  const std::vector<float> buffers(store.buffers.begin(), store.buffers.end());
  const auto input = static_cast<size_t>(kernels::numel(net.graph().input_dims()));
  kernels::Executor& train = net.at_batch(c_.train.batch);
  std::vector<float> x(static_cast<size_t>(train.batch()) * input, 0.f);
  train.forward(x.data(), true);
  const std::vector<float> dlogits(static_cast<size_t>(train.batch() * net.graph().classes()));
  train.backward(dlogits.data(), {});
  const shuffle::SampleSource* eval = data_.eval_source();
  kernels::Executor* evaluation = eval ? &trainer_.evaluation_executor(eval->size()) : nullptr;
  for (kernels::Executor* e : {evaluation, rank_eval_}) {
    if (!e) continue;
    x.assign(static_cast<size_t>(e->batch()) * input, 0.f);
    e->forward(x.data(), false);
  }
  store.buffers = buffers;  // the training pass moved the running statistics
}

// Rank r (the next): its model (the trainer's), its loader and its log.losses file.
void VirtualRanks::add_rank() {
  const int r = made_++;
  trainer_.add_rank();
  data_.add_rank(epochs_);
  if (!c_.log.losses.empty()) {
    const std::string path = rank_log_path(c_.log.losses, r);
    std::ofstream file(path, std::ios::trunc);  // written by write_losses, a file at a time
    if (!file) throw std::runtime_error("log.losses: cannot write " + path);
  }
}

// The memory the run will hold at its peak: what the process holds now (the network, the data,
// the executors' scratch), each rank's state as rank 0's measured, what the ranks' public copies
// or factors grow to as they meet partners, and the shared temporaries (the epoch's permutation,
// the sums over ranks, the evaluation's averages, the loss lines held). Refused in one line when
// it exceeds what the machine, the cgroup or the ulimits leave.
void VirtualRanks::plan_memory() {
  const kernels::Graph& g = trainer_.graph();
  const int64_t model = (g.param_count() + g.buffer_count()) * 4;
  const int64_t shared =
      // The epoch's permutation, and the ranks' slices of it their loaders take at their first
      // batch; the batch; the sums over ranks; the evaluation's average model.
      2 * data_.train_count() * static_cast<int64_t>(sizeof(int64_t)) +
      c_.train.batch * kernels::numel(g.input_dims()) * 4 + TreeSum<float>::bytes(ranks_) +
      3 * model + static_cast<int64_t>(ranks_) * 16 +  // per-rank distances, top-1 counts
      (mixing_of(c_).grads && c_.gossip.hierarchy == Hierarchy::Node
           ? VirtualHierarchy::bytes(ranks_, std::max(1, c_.network.ranks_per_node))
           : 0) +
      (c_.log.losses.empty() ? 0 : 2 * kLossesHeld);
  per_rank_bytes_ += trainer_.growth_bytes(total_);
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

void VirtualRanks::announce(int threads) const {
  const kernels::Graph& g = trainer_.graph();
  std::printf(
      "gossipgrad: %d VIRTUAL ranks in one process (%d threads; one after another on one "
      "network), %s (%lld params), %s backend; memory about %s (%.1f MB per rank, measured on "
      "rank 0)\n",
      ranks_, threads, c_.model.name.c_str(), static_cast<long long>(g.param_count()),
      text_of(c_.train.backend).c_str(), gigabytes(memory_estimate_).c_str(),
      static_cast<double>(per_rank_bytes_) / 1e6);
}

void VirtualRanks::add_to_start(nlohmann::json& start) const {
  start["memory_estimate_bytes"] = memory_estimate_;
}

void VirtualRanks::between_turns(int64_t s, MetricsWriter& metrics) const {
  const int signal = StopSignals::requested();
  if (signal == 0) return;
  metrics.write(stopped_event(signal_name(signal), s));
  throw StopRequested(signal, std::string("stopped by ") + signal_name(signal) + " after step " +
                                  std::to_string(s) + " of " + std::to_string(total_) +
                                  ": no checkpoint.dir, so nothing was saved");
}

// log.losses: every rank's lines held so far, appended to its file (all: whatever is held;
// otherwise only once kLossesHeld bytes are): a file at a time, thousands of ranks would
// otherwise each keep one open.
void VirtualRanks::write_losses(bool all) {
  if (c_.log.losses.empty() || losses_held_ == 0 || (!all && losses_held_ < kLossesHeld)) return;
  for (size_t r = 0; r < losses_.size(); ++r) {
    if (losses_[r].empty()) continue;
    const std::string path = rank_log_path(c_.log.losses, static_cast<int>(r));
    std::ofstream file(path, std::ios::app);
    file << losses_[r];
    file.close();
    if (!file) throw std::runtime_error("log.losses: cannot write " + path + " (disk full?)");
    losses_[r].clear();
  }
  losses_held_ = 0;
}

class VirtualRanks::Hook : public StepHook {
 public:
  explicit Hook(VirtualRanks& v) : v_(v) {}
  void after_step(StepRecord& r) override {
    double sum = 0;
    for (int i = 0; i < v_.ranks_; ++i) sum += v_.trainer_.loss_of(i);
    if (!std::isfinite(sum))
      throw std::runtime_error("virtual ranks: a loss is NaN or inf at step " +
                               std::to_string(r.step) + ": lower train.lr");
    if (!v_.c_.log.losses.empty()) {
      for (int i = 0; i < v_.ranks_; ++i) {
        const std::string line = loss_line(r.step, v_.trainer_.loss_of(i));
        v_.losses_[static_cast<size_t>(i)] += line;
        v_.losses_held_ += line.size();
      }
      v_.write_losses(false);
    }
    if (r.stats.sent_bytes > 0) v_.sent_total_ += r.stats.sent_bytes;
    v_.steps_ = r.step + 1;
  }
  void finish() override { v_.write_losses(true); }

 private:
  VirtualRanks& v_;
};

std::unique_ptr<StepHook> VirtualRanks::hook() { return std::make_unique<Hook>(*this); }

void VirtualRanks::add_to_step(nlohmann::json& step) const {
  // The step event's loss is rank 0's, as a real run's; the mean, min and max come beside it.
  double mean = 0, lo = trainer_.loss_of(0), hi = lo;
  for (int i = 0; i < ranks_; ++i) {
    const double loss = trainer_.loss_of(i);
    mean += loss / ranks_;
    lo = std::min(lo, loss);
    hi = std::max(hi, loss);
  }
  step["loss_mean"] = mean;
  step["loss_min"] = lo;
  step["loss_max"] = hi;
}

void VirtualRanks::add_to_eval(bool last, int64_t done, double consensus, std::string& line,
                               nlohmann::json& event, MetricsWriter& metrics) {
  char text[160];
  std::snprintf(text, sizeof text, "; average of %d VIRTUAL ranks, consensus distance %.3g", ranks_,
                consensus);
  line += text;
  // Each rank's own model costs ranks x the samples: at the end of training only.
  if (!last || !rank_eval_) return;
  RankTop1 t;
  kernels::Executor& exec = *rank_eval_;
  const shuffle::SampleSource& source = *data_.eval_source();
  shuffle::LoaderOptions o = evaluation_loader(data_.eval_options(), exec.batch(), 0, 1);
  o.workers = 0;
  shuffle::PrefetchLoader loader(source, o, 0, 1);
  shuffle::Batch b;
  std::vector<int64_t> correct(static_cast<size_t>(ranks_), 0);
  // Ranks x batches forward passes: at thousands of ranks, minutes; a progress line shows them.
  const int64_t wanted = std::min(c_.train.rank_eval_samples, source.size());
  const int64_t passes = (wanted + exec.batch() - 1) / exec.batch() * ranks_;
  const auto t0 = Clock::now();
  double printed = 0;
  int64_t k = 0;
  // Whole evaluation batches, until at least rank_eval_samples samples.
  while (t.samples < c_.train.rank_eval_samples && loader.next(b)) {
    for (int r = 0; r < ranks_; ++r, ++k) {
      between_turns(done, metrics);
      if (const double now = seconds_since(t0);
          c_.log.progress && now - printed >= c_.log.interval && k > 0) {
        printed = now;
        std::printf("VIRTUAL each rank's own top-1: %lld/%lld forward passes  ETA %s\n",
                    static_cast<long long>(k), static_cast<long long>(passes),
                    format_duration(now * static_cast<double>(passes - k) / static_cast<double>(k))
                        .c_str());
        std::fflush(stdout);
      }
      trainer_.load(r);
      const float* logits = exec.forward(b.x.data(), false);
      correct[static_cast<size_t>(r)] +=
          kernels::softmax_cross_entropy(logits, b.y.data(), exec.batch(),
                                         trainer_.graph().classes(), nullptr)
              .correct;
    }
    for (int32_t v : b.y) t.samples += v >= 0;
  }
  if (t.samples == 0) return;
  std::vector<double> top1;
  for (int64_t n : correct) top1.push_back(static_cast<double>(n) / static_cast<double>(t.samples));
  std::sort(top1.begin(), top1.end());
  const size_t m = top1.size();
  t.min = top1.front();
  t.max = top1.back();
  t.median = m % 2 ? top1[m / 2] : 0.5 * (top1[m / 2 - 1] + top1[m / 2]);
  std::snprintf(text, sizeof text,
                "; each rank's own top-1 on %lld samples: min %.2f%% median %.2f%% max %.2f%%",
                static_cast<long long>(t.samples), 100 * t.min, 100 * t.median, 100 * t.max);
  line += text;
  event["rank_top1"] = {
      {"min", t.min}, {"median", t.median}, {"max", t.max}, {"samples", t.samples}};
}

std::string VirtualRanks::summarise(const RunSummary& s, const std::string& top1,
                                    const std::string& metrics_path,
                                    nlohmann::json& summary) const {
  const bool stale = c_.gossip.staleness == 1;
  const BucketExchange::Lateness all = trainer_.held_lateness();
  const int64_t peak = status_bytes("VmHWM");
  summary["sent_bytes_per_step"] =
      mixing_of(c_).allreduce
          ? nlohmann::json()
          : nlohmann::json(
                steps_ > 0 ? static_cast<double>(sent_total_) / static_cast<double>(steps_) : 0.0);
  summary["late_buckets"] = stale ? nlohmann::json(all.late) : nlohmann::json();
  summary["unmixed_buckets"] = stale ? nlohmann::json(all.unmixed) : nlohmann::json();
  summary["memory_estimate_bytes"] = memory_estimate_;
  summary["peak_memory_bytes"] = peak;
  const std::string lateness = stale ? ", staleness 1: " + std::to_string(all.late) +
                                           " bucket mixes late and " + std::to_string(all.unmixed) +
                                           " unmixed over all ranks"
                                     : "";
  char text[512];
  std::snprintf(text, sizeof text,
                "done: %lld steps of %d VIRTUAL ranks in %s (%.0f img/s in this one process), "
                "%s%s; peak memory %s of about %s planned (metrics: %s)",
                static_cast<long long>(s.steps), ranks_, format_duration(s.wall_seconds).c_str(),
                s.images_per_second, top1.c_str(), lateness.c_str(), gigabytes(peak).c_str(),
                gigabytes(memory_estimate_).c_str(), metrics_path.c_str());
  return text;
}

}  // namespace gg::gossip
