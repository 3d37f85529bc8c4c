#include "gossip/train/trainer.hpp"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <deque>
#include <fstream>
#include <optional>
#include <thread>

#include "gossip/resilience/checkpoint.hpp"
#include "gossip/resilience/faults.hpp"
#include "gossip/train/data.hpp"
#include "gossip/train/recovery.hpp"
#include "kernels/loss.hpp"
#include "kernels/weights.hpp"
#include "shuffle/loader.hpp"

namespace gg::gossip {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const int64_t t = static_cast<int64_t>(s + 0.5);
  char buf[32];
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%ldh%02ldm", static_cast<long>(t / 3600),
                  static_cast<long>(t % 3600 / 60));
  else
    std::snprintf(buf, sizeof buf, "%ldm%02lds", static_cast<long>(t / 60),
                  static_cast<long>(t % 60));
  return buf;
}

}  // namespace

kernels::ModelSpec model_spec(const Config& c, int rank, kernels::Dims input, int64_t classes) {
  kernels::ModelSpec m;
  // Dropout masks (googlenet) differ between ranks, as the data they see does.
  m.seed = c.train.seed + 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(rank + 1);
  m.name = c.model.name;
  m.input = std::move(input);
  m.classes = classes;
  m.width = c.model.width;
  m.batch_norm = c.model.batch_norm;
  return m;
}

int compute_threads(const Config& c, const mpi::Comm& world) {
  if (c.train.threads > 0) return c.train.threads;
  mpi::Comm node = world.split_shared();
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, cores / node.size());
}

Trainer::Trainer(const Config& c, const mpi::Comm& world, kernels::Dims input, int64_t classes,
                 int64_t total_steps, int64_t steps_per_epoch)
    : c_(c),
      world_(world),
      net_(kernels::build_model(model_spec(c, world.rank(), std::move(input), classes)),
           kernels::parse_backend(c.train.backend), std::max<int64_t>(1, c.gossip.bucket_kb * 256),
           kernels::parse_precision(c.train.precision)),
      sgd_(net_.graph().param_count(),
           {static_cast<float>(c.train.momentum), static_cast<float>(c.train.weight_decay),
            c.train.nesterov}),
      schedule_({c.train.lr, c.train.base_batch, c.train.batch * world.size(),
                 static_cast<int64_t>(std::llround(c.train.warmup_epochs * steps_per_epoch)),
                 total_steps, 0.0}),
      dlogits_(c.train.batch * classes) {
  kernels::ParamStore& store = net_.store();
  const kernels::Graph& g = net_.graph();
  kernels::init_params(g, store, c.train.seed);
  if (!c.train.init_from.empty()) load_initial_weights();
  // Every rank starts from rank 0's weights, whatever its RNG did.
  world_.broadcast(store.params.data(), g.param_count(), 0);
  world_.broadcast(store.buffers.data(), g.buffer_count(), 0);
  make_exchanges();
  // One rank per GPU (CUDA backend): the rank on this node picks the device.
  if (net_.backend() == kernels::Backend::Cuda)
    kernels::bind_device(net_.backend(), world_.split_shared().rank());
  // Compiled only now: the gradient buffer may have moved into the exchange's shared memory.
  train_exec_ = &net_.at_batch(c.train.batch);
  eval_exec_ = &net_.at_batch(c.train.eval_batch);
}

void Trainer::make_exchanges() {
  const Config& c = c_;
  kernels::ParamStore& store = net_.store();
  if (c.gossip.mode == "allreduce") {
    exchange_ = std::make_unique<AllreduceExchange>(world_, store.grads.data(), net_.buckets());
    return;
  }
  GossipOptions o;
  try {
    o.schedule = {partners::parse_kind(c.gossip.schedule), world_.size(), c.gossip.rotate,
                  c.train.seed};
    partners::validate(o.schedule);
  } catch (const std::invalid_argument& e) {
    throw UsageError(std::string("gossip.schedule: ") + e.what());
  }
  o.transport = c.gossip.transport;
  o.threading = c.gossip.threading;
  o.comm_threads = c.gossip.comm_threads;
  o.staleness = c.gossip.staleness;
  o.timeout_s = c.gossip.timeout_s;
  try {
    if (c.gossip.mode == "grad" || c.gossip.mode == "both") {
      // The exchange provides the gradient buffer: in shared memory, partners on this node that
      // pair up in a step average it in place, with no copy.
      auto grads = std::make_unique<GossipExchange>(world_, nullptr, net_.buckets(), o);
      net_.share_grads(grads->buffer());
      exchange_ = std::move(grads);
    }
    if (c.gossip.mode == "model" || c.gossip.mode == "both") {
      GossipOptions m = o;
      m.delayed = c.gossip.overlap_model;
      model_exchange_ =
          std::make_unique<GossipExchange>(world_, store.params.data(), net_.buckets(), m);
    }
  } catch (const std::invalid_argument& e) {
    throw UsageError(std::string("gossip: ") + e.what());
  }
  // Exchanges made mid-run (after apoptosis shrank the buffers): the transports count their steps
  // from here, the schedule goes on.
  if (auto* g = dynamic_cast<GossipExchange*>(exchange_.get())) g->set_first_step(step_);
  if (model_exchange_) model_exchange_->set_first_step(step_);
}

void Trainer::set_timeline(Timeline* t) {
  timeline_ = t && t->enabled() ? t : nullptr;
  if (exchange_) exchange_->set_timeline(timeline_);
  if (model_exchange_) model_exchange_->set_timeline(timeline_);
  if (!timeline_) return train_exec_->set_layer_trace({});
  timeline_->name_thread("compute");
  train_exec_->set_layer_trace([this](int node, bool backward, Timeline::Clock::time_point a,
                                      Timeline::Clock::time_point b) {
    timeline_->record((backward ? "bwd " : "fwd ") + graph().node(node).name, "compute", a, b);
  });
}

StepStats Trainer::step(const float* x, const int32_t* y) {
  StepStats s;
  Timeline::Span whole(timeline_, "step " + std::to_string(step_), "step");
  const float* logits = nullptr;
  {
    Timeline::Span span(timeline_, "forward", "compute");
    logits = train_exec_->forward(x, true);
  }
  const auto loss =
      kernels::softmax_cross_entropy(logits, y, c_.train.batch, graph().classes(), dlogits_.data());
  s.loss = loss.loss;
  s.correct = loss.correct;
  if (exchange_) {
    exchange_->begin_step(step_);
    {
      Timeline::Span span(timeline_, "backward", "compute");
      train_exec_->backward(dlogits_.data(), [this](int b) { exchange_->on_bucket_ready(b); });
    }
    Timeline::Span span(timeline_, "wait gradients", "wait");
    s.comm_seconds = exchange_->finish_step();
  } else {
    Timeline::Span span(timeline_, "backward", "compute");
    train_exec_->backward(dlogits_.data(), {});
  }
  s.lr = schedule_.at(step_) * lr_scale_;
  {
    Timeline::Span span(timeline_, "wait weights", "wait");
    s.comm_seconds += flush_model();
  }
  {
    Timeline::Span span(timeline_, "optimizer", "optimizer");
    sgd_.step(store().params.data(), store().grads.data(), static_cast<float>(s.lr));
  }
  if (model_exchange_) {
    Timeline::Span span(timeline_, "start weight exchange", "comm");
    if (c_.gossip.overlap_model)
      model_exchange_->start_delayed(step_);
    else
      s.comm_seconds += model_exchange_->exchange_all(step_);
  }
  const int64_t h = c_.gossip.global_every;
  if (c_.gossip.mode != "allreduce" && h > 0 && (step_ + 1) % h == 0) {
    const auto t0 = std::chrono::steady_clock::now();
    flush_model();
    average_over_ranks(store().params);
    average_over_ranks(store().buffers);
    s.comm_seconds += seconds_since(t0);
  }
  const int64_t n = c_.gossip.consensus_every;
  if (n > 0 && (step_ + 1) % n == 0) s.consensus = consensus_distance();
  ++step_;
  return s;
}

EvalStats Trainer::evaluate(const shuffle::SampleSource& data, shuffle::LoaderOptions o) {
  // Evaluate the average model, then give every rank its own weights back.
  flush_model();
  const std::vector<float> own_params = store().params, own_buffers = store().buffers;
  if (world_.size() > 1) {
    average_over_ranks(store().params);
    average_over_ranks(store().buffers);
  }
  const double consensus = distance_to_average(own_params, store().params);
  o.batch = c_.train.eval_batch;
  o.rank = world_.rank();
  o.ranks = world_.size();
  o.augment.enabled = false;
  o.shuffle = false;
  o.drop_last = false;
  o.prefetch = 2;
  shuffle::PrefetchLoader loader(data, o, 0, 1);
  shuffle::Batch b;
  double sums[4] = {0, 0, 0, 0};  // loss * n, correct, top5, n
  while (loader.next(b)) {
    const float* logits = eval_exec_->forward(b.x.data(), false);
    const auto r =
        kernels::softmax_cross_entropy(logits, b.y.data(), o.batch, graph().classes(), nullptr);
    int64_t n = 0;
    for (int32_t v : b.y) n += v >= 0;
    sums[0] += r.loss * n;
    sums[1] += r.correct;
    sums[2] += r.top5;
    sums[3] += n;
  }
  world_.allreduce_sum(sums, 4);
  EvalStats e;
  e.samples = static_cast<int64_t>(sums[3]);
  if (e.samples > 0) {
    e.loss = sums[0] / sums[3];
    e.top1 = sums[1] / sums[3];
    e.top5 = sums[2] / sums[3];
  }
  store().params = own_params;
  store().buffers = own_buffers;
  e.consensus = consensus;
  return e;
}

void Trainer::capture_state(RankState& s) {
  s.step = step_;
  s.lr_scale = lr_scale_;
  s.dropout_step = train_exec_->dropout_step();
  s.sgd_started = sgd_.started();
  s.params = store().params;
  s.buffers = store().buffers;
  s.velocity = sgd_.velocity();
  s.delayed_delta.clear();
  if (model_exchange_ && c_.gossip.overlap_model)
    s.delayed_delta = model_exchange_->delayed_delta();
}

void Trainer::restore_model(const RankState& s) {
  if (s.params.size() != store().params.size() || s.buffers.size() != store().buffers.size() ||
      s.velocity.size() != sgd_.velocity().size())
    throw std::invalid_argument("the saved state does not fit this model");
  // A weight exchange still in flight completes (its partner waits for it) and is then replaced.
  if (model_exchange_ && c_.gossip.overlap_model)
    model_exchange_->set_delayed_delta(s.delayed_delta);
  std::copy(s.params.begin(), s.params.end(), store().params.begin());
  std::copy(s.buffers.begin(), s.buffers.end(), store().buffers.begin());
  std::copy(s.velocity.begin(), s.velocity.end(), sgd_.velocity().begin());
  sgd_.set_started(s.sgd_started);
}

void Trainer::resume_at(int64_t step, uint64_t dropout_step) {
  step_ = step;
  train_exec_->set_dropout_step(dropout_step);
  if (auto* g = dynamic_cast<GossipExchange*>(exchange_.get())) g->set_first_step(step);
  if (model_exchange_) model_exchange_->set_first_step(step);
}

void Trainer::rewind(const RankState& s) {
  restore_model(s);
  const int64_t back = step_ - s.step;
  if (auto* g = dynamic_cast<GossipExchange*>(exchange_.get())) g->repeat_steps(back);
  if (model_exchange_) model_exchange_->repeat_steps(back);
  step_ = s.step;
  train_exec_->set_dropout_step(s.dropout_step);
}

void Trainer::load_initial_weights() {
  // Rank 0 reads the file; its verdict is shared so that every rank fails the same way.
  std::string error;  // "U<message>": weights that do not fit the model; "R<message>": unreadable
  if (world_.rank() == 0) {
    try {
      kernels::load_weights(c_.train.init_from, net_.graph(), net_.store());
    } catch (const std::invalid_argument& e) {
      error = std::string("U") + "train.init_from: " + e.what();
    } catch (const std::exception& e) {
      error = std::string("R") + "train.init_from: " + e.what();
    }
  }
  world_.broadcast(error, 0);
  if (error.empty()) return;
  if (error[0] == 'U') throw UsageError(error.substr(1));
  if (world_.rank() == 0) throw std::runtime_error(error.substr(1));
  throw std::runtime_error("rank 0 could not read train.init_from");
}

void Trainer::average_model(std::vector<float>& params, std::vector<float>& buffers) {
  flush_model();
  params = store().params;
  buffers = store().buffers;
  if (world_.size() > 1) {
    average_over_ranks(params);
    average_over_ranks(buffers);
  }
}

EvalStats Trainer::evaluate(const shuffle::Dataset& data, float mean, float stddev) {
  const shuffle::DatasetSource view(
      std::shared_ptr<const shuffle::Dataset>(&data, [](const shuffle::Dataset*) {}), "dataset");
  shuffle::LoaderOptions o;
  o.norm = {mean, stddev};
  return evaluate(view, o);
}

double Trainer::flush_model() {
  return model_exchange_ && c_.gossip.overlap_model ? model_exchange_->finish_delayed() : 0.0;
}

void Trainer::average_over_ranks(std::vector<float>& v) {
  world_.allreduce_sum(v.data(), static_cast<int64_t>(v.size()));
  const float inv = 1.f / static_cast<float>(world_.size());
  for (float& x : v) x *= inv;
}

double Trainer::consensus_distance() {
  std::vector<float> avg(store().params);
  average_over_ranks(avg);
  return distance_to_average(store().params, avg);
}

double Trainer::distance_to_average(const std::vector<float>& w, const std::vector<float>& avg) {
  double d = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    const double diff = static_cast<double>(w[i]) - avg[i];
    d += diff * diff;
  }
  world_.allreduce_sum(&d, 1);
  return d / world_.size();
}

namespace {

// How the job's time over one group of ranks (one communicator) ended.
enum class Ending {
  Done,     // training finished
  Left,     // this rank failed (simulated) and left the group
  Shrink,   // a member failed: the survivors go on over a new communicator (forward)
  Restart,  // a rank failed: every rank rebuilds and reloads the last checkpoint (restart)
};

// What a training run builds over one group of ranks. After a forward recovery it is parked, not
// destroyed: freeing its RMA/shared-memory windows is a collective over the old communicator,
// which needs the failed rank, and UCX aborts MPI_Finalize while windows are still allocated.
struct GroupObjects {
  std::unique_ptr<TrainingData> data;
  std::unique_ptr<Trainer> trainer;
  std::unique_ptr<Recovery> resilience;
  ~GroupObjects() {
    resilience.reset();
    trainer.reset();
    data.reset();
  }
};

// A failure being recovered: written as fault events once the new group has its first step.
struct PendingFault {
  int64_t step = 0;
  std::vector<int> ranks;  // the job's original ranks
  Clock::time_point t0;
};

constexpr int kStateTag = 0x5254;  // rollback: a donor's state to a failed rank's replacement
constexpr int kWakeTag = 0x5755;   // the end of training, to the failed ranks

// State carried from one group of ranks to the next, and the run's totals.
struct Run {
  explicit Run(const mpi::Comm& w) : world(w) {}
  const mpi::Comm& world;
  std::deque<Config> configs;  // one per group (the objects keep a reference)
  std::vector<FaultEvent> plan;
  bool planned = false;
  size_t next_fault = 0;
  FaultStrategy strategy = FaultStrategy::Forward;
  std::vector<int> members;  // the live group: the job's original ranks, in order
  MetricsWriter metrics;
  std::unique_ptr<std::ofstream> samples;
  RunSummary summary;
  Clock::time_point t_start;
  double train_seconds = 0, comm_seconds = 0, images = 0, last_print = 0;
  int64_t first_step = 0;  // of the first group (a resumed run starts later)
  bool started = false;
  bool wrote_checkpoint = false;  // a full checkpoint of this run exists (restart reloads it)
  // Forward: this rank's own state before `carry_step`, in a run of `carry_per_epoch`.
  std::optional<RankState> carry;
  int64_t carry_step = 0, carry_per_epoch = 0;
  std::optional<PendingFault> pending;
  std::vector<std::unique_ptr<GroupObjects>> parked;
  std::vector<std::unique_ptr<mpi::Comm>> comms;  // the survivors' communicators
};

// The plan's failures due at step s (one step may see several); consumed once, so redone steps
// never fail again.
std::vector<int> failures_due(Run& run, int64_t s) {
  std::vector<int> ranks;
  while (run.next_fault < run.plan.size() && run.plan[run.next_fault].step <= s)
    ranks.push_back(run.plan[run.next_fault++].rank);
  return ranks;
}

int group_rank_of(const Run& run, int original) {
  const auto it = std::find(run.members.begin(), run.members.end(), original);
  return it == run.members.end() ? -1 : static_cast<int>(it - run.members.begin());
}

void write_fault_events(Run& run, const mpi::Comm& comm, int64_t steps_redone) {
  if (!run.pending || comm.rank() != 0) return;
  const double seconds = seconds_since(run.pending->t0);
  for (int r : run.pending->ranks)
    run.metrics.write({{"event", "fault"},
                       {"step", run.pending->step},
                       {"rank", r},
                       {"strategy", to_string(run.strategy)},
                       {"recovery_s", seconds},
                       {"steps_redone", steps_redone},
                       {"ranks_after", comm.size()}});
}

// Rollback: each failed rank's replacement receives the state of the next live rank after it
// (one point-to-point message); every other rank keeps its own. Returns the state to rewind to.
RankState replace_failed(const mpi::Comm& comm, const std::vector<int>& failed, RankState own) {
  const int p = comm.size(), me = comm.rank();
  auto is_failed = [&](int r) {
    return std::find(failed.begin(), failed.end(), r) != failed.end();
  };
  auto donor_of = [&](int v) {
    int d = (v + 1) % p;
    while (is_failed(d)) d = (d + 1) % p;
    return d;
  };
  if (is_failed(me)) {
    // This rank's state is lost: nothing of it survives into what it trains next.
    own = RankState{};
    MPI_Status st;
    GG_MPI_CHECK(MPI_Probe(donor_of(me), kStateTag, comm.get(), &st));
    int bytes = 0;
    GG_MPI_CHECK(MPI_Get_count(&st, MPI_BYTE, &bytes));
    std::vector<uint8_t> wire(static_cast<size_t>(bytes));
    GG_MPI_CHECK(MPI_Recv(wire.data(), bytes, MPI_BYTE, donor_of(me), kStateTag, comm.get(),
                          MPI_STATUS_IGNORE));
    return decode_state(wire.data(), wire.size(), "the donor's state");
  }
  std::vector<uint8_t> wire;
  for (int v : failed) {
    if (donor_of(v) != me) continue;
    if (wire.empty()) wire = encode_state(own);
    if (static_cast<int64_t>(wire.size()) > mpi::kMaxCount)
      throw std::runtime_error("rollback: a state of " + std::to_string(wire.size()) +
                               " bytes is too large for one message");
    GG_MPI_CHECK(
        MPI_Send(wire.data(), static_cast<int>(wire.size()), MPI_BYTE, v, kStateTag, comm.get()));
  }
  return own;
}

// Training over the group of ranks in `comm`, until the end or a failure the group cannot absorb.
Ending train_group(const Config& c, const mpi::Comm& comm, Run& run, GroupObjects& g) {
  const int ranks = comm.size();
  const bool lead = comm.rank() == 0;
  const int threads = compute_threads(c, comm);
  omp_set_num_threads(threads);

  g.data = std::make_unique<TrainingData>(c, comm);
  TrainingData& data = *g.data;
  const int64_t per_epoch = data.steps_per_epoch();
  int64_t total = per_epoch * c.train.epochs;
  if (c.train.max_steps > 0) total = std::min(total, c.train.max_steps);
  const int64_t epochs = (total + per_epoch - 1) / per_epoch;

  g.trainer = std::make_unique<Trainer>(c, comm, data.input(), data.classes(), total, per_epoch);
  Trainer& trainer = *g.trainer;
  CheckpointMeta checkpoint;
  checkpoint.model = model_spec(c, comm.rank(), data.input(), data.classes());
  g.resilience = std::make_unique<Recovery>(c, comm, trainer, data,
                                            model_spec(c, 0, data.input(), data.classes()));
  Recovery& resilience = *g.resilience;
  if (!run.planned) {
    run.strategy = parse_fault_strategy(c.fault.strategy);
    run.plan = make_fault_plan(c, ranks, total);
    run.planned = true;
    if (!run.plan.empty() && c.apoptosis.enable)
      throw UsageError("fault.inject / fault.mtbf_steps cannot be combined with apoptosis.enable");
  }
  int64_t first = 0;
  if (run.carry) {
    first = resilience.continue_from(*run.carry, run.carry_step, run.carry_per_epoch);
    // Later failures happen at the same point of training, in the survivors' steps.
    for (size_t i = run.next_fault; i < run.plan.size(); ++i)
      run.plan[i].step = resilience.same_point(run.plan[i].step, run.carry_per_epoch);
    run.carry.reset();
  } else {
    first = resilience.resume();
  }
  if (!run.started) {
    run.first_step = first;
    if (lead)
      run.metrics = MetricsWriter(c.log.metrics, c.log.overwrite, !c.checkpoint.resume.empty());
  } else if (lead && !run.metrics.enabled()) {
    // The job's first rank failed: the survivors' first rank appends to the same file.
    run.metrics = MetricsWriter(c.log.metrics, false, true);
  }
  if (run.pending) {
    const int64_t redone = run.strategy == FaultStrategy::Restart ? run.pending->step - first : 0;
    write_fault_events(run, comm, redone);
    if (lead) {
      std::string who;
      for (int r : run.pending->ranks) who += (who.empty() ? "" : ", ") + std::to_string(r);
      if (run.strategy == FaultStrategy::Forward)
        std::printf(
            "gossipgrad: rank %s failed before step %lld: %d survivors carry on at step %lld of "
            "%lld (samples reassigned, recovery %.2f s)\n",
            who.c_str(), static_cast<long long>(run.pending->step), ranks,
            static_cast<long long>(first), static_cast<long long>(total),
            seconds_since(run.pending->t0));
      else
        std::printf(
            "gossipgrad: rank %s failed before step %lld: every rank restarted from step %lld "
            "(%lld steps redone, recovery %.2f s)\n",
            who.c_str(), static_cast<long long>(run.pending->step), static_cast<long long>(first),
            static_cast<long long>(redone), seconds_since(run.pending->t0));
      std::fflush(stdout);
    }
    run.pending.reset();
  }
  checkpoint.ranks = ranks;
  // Pixel sources: x = (pixel/255 - mean) / std. (JPEG sources normalise per channel.)
  checkpoint.input_mean = data.eval_options().norm.mean;
  checkpoint.input_std = data.eval_options().norm.std;
  std::vector<float> avg_params, avg_buffers;
  // Apoptosis events carry the images/s of the 20 steps (at most an interval) after a decision.
  ApoptosisMetrics apoptosis_metrics(std::min<int64_t>(20, c.apoptosis.interval));
  if (c.apoptosis.enable && apoptosis_layers(c, trainer.graph()).empty())
    throw UsageError("apoptosis.layers = " + c.apoptosis.layers + ": " + c.model.name +
                     " has no such layer whose units may be removed (units that reach a residual "
                     "add, a concat or the output stay)");
  const int64_t global_batch = c.train.batch * ranks;
  const std::string mixing = c.gossip.mode == "allreduce"
                                 ? std::string("allreduce")
                                 : "gossip " + c.gossip.mode + " (" + c.gossip.schedule +
                                       (c.gossip.rotate ? "+rotate" : "") + ", " +
                                       c.gossip.transport + ")";
  if (lead && !run.started) {
    std::printf("gossipgrad: %d ranks x %d threads, %s (%lld params), %s backend\n", ranks, threads,
                c.model.name.c_str(), static_cast<long long>(trainer.graph().param_count()),
                c.train.backend.c_str());
    std::printf("gossipgrad: data: %s\n", data.describe().c_str());
    std::printf(
        "gossipgrad: %lld train / %lld test samples, global batch %lld, %lld steps/epoch, "
        "%lld epochs, peak lr %.4g, mixing: %s\n",
        static_cast<long long>(data.train_count()), static_cast<long long>(data.eval_count()),
        static_cast<long long>(global_batch), static_cast<long long>(per_epoch),
        static_cast<long long>(epochs), c.train.lr * global_batch / c.train.base_batch,
        mixing.c_str());
    if (!run.plan.empty())
      std::printf("gossipgrad: %zu simulated failure(s) planned, recovery: %s\n", run.plan.size(),
                  to_string(run.strategy));
    std::fflush(stdout);
    run.metrics.write({{"event", "start"},
                       {"ranks", ranks},
                       {"threads", threads},
                       {"model", c.model.name},
                       {"params", trainer.graph().param_count()},
                       {"global_batch", global_batch},
                       {"steps", total},
                       {"first_step", first},
                       {"mode", c.gossip.mode},
                       {"backend", c.train.backend},
                       {"faults_planned", run.plan.size()},
                       {"fault_strategy", to_string(run.strategy)}});
  }

  comm.barrier();  // the ranks' timelines start together
  // A timeline spans one group of ranks: with failures planned there may be several, so none.
  Timeline timeline(!c.log.timeline.empty() && run.plan.empty());
  if (lead && !c.log.timeline.empty() && !run.plan.empty() && !run.started)
    std::printf("gossipgrad: log.timeline is not written in a run with simulated failures\n");
  run.started = true;
  trainer.set_timeline(&timeline);
  data.start(epochs, first);
  shuffle::Batch batch;
  RunSummary& summary = run.summary;
  double loss_avg = 0, wait_before = 0;
  int64_t epoch = 0;
  summary.steps = first;
  auto log_samples = [&](int64_t s) {
    if (!run.samples) return;
    std::ostream& out = *run.samples;
    out << s << ' ' << batch.epoch;
    for (int64_t id : batch.ids) out << ' ' << id;
    out << '\n';
  };
  for (int64_t s = first; s < total; ++s) {
    const std::vector<int> failed = failures_due(run, s);
    if (!failed.empty() && run.strategy != FaultStrategy::Rollback) {
      // At the boundary before step s: the last step's messages are complete on every rank (a
      // pending overlapped weight exchange settles in capture_state), so no one waits on a rank
      // that leaves.
      const auto t0 = Clock::now();
      RankState own;
      trainer.capture_state(own);
      run.pending = PendingFault{s, failed, t0};
      if (run.strategy == FaultStrategy::Restart) return Ending::Restart;
      if (group_rank_of(run, run.world.rank()) >= 0 &&
          std::find(failed.begin(), failed.end(), run.world.rank()) != failed.end()) {
        std::printf("gossipgrad: rank %d: simulated failure before step %lld: leaving the job\n",
                    run.world.rank(), static_cast<long long>(s));
        std::fflush(stdout);
        return Ending::Left;
      }
      run.carry = std::move(own);
      run.carry_step = s;
      run.carry_per_epoch = per_epoch;
      return Ending::Shrink;
    }
    if (s == first + c.log.timeline_steps) trainer.set_timeline(nullptr);  // enough recorded
    const auto t0 = Clock::now();
    bool got = false;
    {
      Timeline::Span span(trainer.timeline(), "data", "data");
      got = data.next(s, batch);
    }
    if (!got) break;
    resilience.before_step(s, batch);
    const double data_wait = data.wait_seconds() - wait_before;
    wait_before = data.wait_seconds();
    RankState before;  // rollback: the state the interrupted step started from
    if (!failed.empty()) {
      trainer.capture_state(before);
      before.rank = comm.rank();
      before.ranks = ranks;
      before.steps_per_epoch = per_epoch;
    }
    StepStats st = trainer.step(batch.x.data(), batch.y.data());
    log_samples(s);
    const auto t_shuffle = Clock::now();
    {
      Timeline::Span span(trainer.timeline(), "shuffle", "data");
      data.finish_step(s);
    }
    const double shuffle_wait = seconds_since(t_shuffle);
    if (!failed.empty()) {
      // Rollback: the failed ranks lost step s and their state; each replacement takes a live
      // rank's state from before the step, and every rank redoes the step from there.
      const auto t_fail = Clock::now();
      std::vector<int> in_group;
      for (int r : failed) in_group.push_back(group_rank_of(run, r));
      trainer.rewind(replace_failed(comm, in_group, std::move(before)));
      st = trainer.step(batch.x.data(), batch.y.data());
      log_samples(s);
      run.pending = PendingFault{s, failed, t_fail};
      write_fault_events(run, comm, 1);
      run.pending.reset();
      if (lead && c.log.progress) {
        std::printf("gossipgrad: %zu rank(s) failed in step %lld: replaced, step redone (%.2f s)\n",
                    failed.size(), static_cast<long long>(s), seconds_since(t_fail));
        std::fflush(stdout);
      }
    }
    // A NaN/Inf loss on any rank: every rank goes back to its last good state (or training stops).
    const bool restored = resilience.after_step(s, st.loss, run.metrics);
    const double dt = seconds_since(t0);
    run.train_seconds += dt;
    run.images += static_cast<double>(global_batch);
    run.comm_seconds += st.comm_seconds;
    if (!restored) loss_avg = s == first ? st.loss : 0.95 * loss_avg + 0.05 * st.loss;
    epoch = batch.epoch;
    for (const auto& e : apoptosis_metrics.step(dt, global_batch)) run.metrics.write(e);
    if (c.apoptosis.enable && !restored && (s + 1) % c.apoptosis.interval == 0 && s + 1 < total &&
        static_cast<double>(s + 1) <= c.apoptosis.until * static_cast<double>(total)) {
      const ApoptosisReport a = trainer.apoptosis();
      run.train_seconds += a.seconds;  // rebuilding is part of training time
      for (const auto& e : apoptosis_metrics.finish()) run.metrics.write(e);
      apoptosis_metrics.decided(a);
      if (a.params_after != a.params_before) resilience.model_changed();
      if (lead && c.log.progress && a.params_after != a.params_before) {
        std::string removed;
        for (const auto& [name, n] : a.removed)
          removed += (removed.empty() ? "" : ", ") + name + " -" + std::to_string(n);
        std::printf("apoptosis at step %lld: %lld -> %lld params (%s)\n",
                    static_cast<long long>(s + 1), static_cast<long long>(a.params_before),
                    static_cast<long long>(a.params_after), removed.c_str());
        std::fflush(stdout);
      }
    }
    if (lead && !restored) {
      run.metrics.write({{"event", "step"},
                         {"step", s},
                         {"epoch", epoch},
                         {"loss", st.loss},
                         {"lr", st.lr},
                         {"images_per_s", global_batch / dt},
                         {"step_s", dt},
                         {"comm_s", st.comm_seconds},
                         {"data_wait_s", data_wait},
                         {"shuffle_s", shuffle_wait},
                         {"skipped", data.skipped()}});
      if (st.consensus >= 0)
        run.metrics.write({{"event", "consensus"}, {"step", s + 1}, {"consensus", st.consensus}});
      const double now = seconds_since(run.t_start);
      if (c.log.progress && (now - run.last_print >= c.log.interval || s + 1 == total)) {
        run.last_print = now;
        const double ips = run.images / run.train_seconds;
        std::printf("step %6lld/%lld  epoch %lld/%lld  loss %.4f  lr %.4f  %.0f img/s  ETA %s\n",
                    static_cast<long long>(s + 1), static_cast<long long>(total),
                    static_cast<long long>(epoch + 1), static_cast<long long>(epochs), loss_avg,
                    st.lr, ips, format_duration((total - s - 1) * global_batch / ips).c_str());
        std::fflush(stdout);
      }
    }
    const bool epoch_end = (s + 1) % per_epoch == 0 || s + 1 == total;
    if (epoch_end && data.eval_source() != nullptr) {
      EvalStats e;
      {
        Timeline::Span span(trainer.timeline(), "evaluate", "eval");
        e = trainer.evaluate(*data.eval_source(), data.eval_options());
      }
      summary.final_top1 = e.top1;
      summary.final_top5 = e.top5;
      if (lead) {
        std::printf("epoch %lld: test top-1 %.2f%%  top-5 %.2f%%  loss %.4f  (%lld samples)\n",
                    static_cast<long long>(epoch + 1), 100 * e.top1, 100 * e.top5, e.loss,
                    static_cast<long long>(e.samples));
        std::fflush(stdout);
        run.metrics.write({{"event", "eval"},
                           {"epoch", epoch + 1},
                           {"step", s + 1},
                           {"top1", e.top1},
                           {"top5", e.top5},
                           {"loss", e.loss},
                           {"consensus", e.consensus},
                           {"ranks", ranks},
                           {"wall_s", seconds_since(run.t_start)}});
      }
      const int64_t every = c.checkpoint.every_epochs;
      if (!c.checkpoint.dir.empty() &&
          (s + 1 == total || (every > 0 && (epoch + 1) % every == 0))) {
        trainer.average_model(avg_params, avg_buffers);
        checkpoint.epoch = epoch + 1;
        checkpoint.step = s + 1;
        checkpoint.top1 = e.top1;
        checkpoint.widths =
            kernels::changed_widths(kernels::build_model(checkpoint.model), trainer.graph());
        if (lead) {
          write_checkpoint(c.checkpoint.dir, checkpoint, trainer.graph(), avg_params, avg_buffers);
          run.metrics.write({{"event", "checkpoint"},
                             {"epoch", epoch + 1},
                             {"step", s + 1},
                             {"dir", c.checkpoint.dir}});
        }
      }
    }
    summary.steps = s + 1;
    if (resilience.after_step_done(s, epoch, s + 1 == total, run.metrics)) break;  // stop_at
  }
  for (const auto& e : apoptosis_metrics.finish()) run.metrics.write(e);
  summary.wall_seconds = seconds_since(run.t_start);
  if (timeline.enabled()) {
    trainer.set_timeline(nullptr);
    timeline.write(comm, c.log.timeline);
    if (lead) std::printf("gossipgrad: timeline written to %s\n", c.log.timeline.c_str());
  }
  // Every rank's corrupt files and shuffled samples (a collective: every rank gets here).
  int64_t data_totals[2] = {data.skipped(), data.shuffled_samples()};
  comm.allreduce_sum(data_totals, 2);
  summary.skipped_samples = data_totals[0];
  summary.images_per_second = run.train_seconds > 0 ? run.images / run.train_seconds : 0;
  if (lead) {
    const double comm_share = run.train_seconds > 0 ? run.comm_seconds / run.train_seconds : 0;
    char final_eval[64] = "no evaluation data";
    if (data.eval_source())
      std::snprintf(final_eval, sizeof final_eval, "final test top-1 %.2f%%",
                    100 * summary.final_top1);
    std::printf(
        "done: %lld steps in %s, %.0f img/s, exposed communication %.1f%% of step time, %s "
        "(metrics: %s)\n",
        static_cast<long long>(summary.steps), format_duration(summary.wall_seconds).c_str(),
        summary.images_per_second, 100 * comm_share, final_eval, c.log.metrics.c_str());
    run.metrics.write({{"event", "summary"},
                       {"steps", summary.steps},
                       {"top1", summary.final_top1},
                       {"top5", summary.final_top5},
                       {"wall_s", summary.wall_seconds},
                       {"images_per_s", summary.images_per_second},
                       {"comm_s", run.comm_seconds},
                       {"exposed_comm_share", comm_share},
                       {"data_wait_s", data.wait_seconds()},
                       {"params", trainer.graph().param_count()},
                       {"skipped", data_totals[0]},
                       {"shuffled_samples", data_totals[1]},
                       {"ranks", ranks},
                       {"faults", run.next_fault}});
  }
  return Ending::Done;
}

// The survivors of `failed` (original ranks) in `comm`, over a new communicator made by them
// alone (MPI_Comm_create_group: the failed ranks take no part).
std::unique_ptr<mpi::Comm> survivors_comm(const mpi::Comm& comm, Run& run,
                                          const std::vector<int>& failed) {
  std::vector<int> excluded;
  for (int r : failed) excluded.push_back(group_rank_of(run, r));
  MPI_Group all = MPI_GROUP_NULL, kept = MPI_GROUP_NULL;
  GG_MPI_CHECK(MPI_Comm_group(comm.get(), &all));
  GG_MPI_CHECK(MPI_Group_excl(all, static_cast<int>(excluded.size()), excluded.data(), &kept));
  MPI_Comm next = MPI_COMM_NULL;
  const int rc = MPI_Comm_create_group(comm.get(), kept, 0x4757, &next);
  MPI_Group_free(&kept);
  MPI_Group_free(&all);
  GG_MPI_CHECK(rc);
  std::vector<int> members;
  for (int r : run.members)
    if (std::find(failed.begin(), failed.end(), r) == failed.end()) members.push_back(r);
  run.members = std::move(members);
  return std::make_unique<mpi::Comm>(mpi::Comm::adopt(next));
}

// The config of a group after a failure: the test hooks (fault.kill, stall, nan) fired already.
Config without_hooks(const Config& c) {
  Config next = c;
  next.fault.kill.clear();
  next.fault.stall.clear();
  next.fault.nan = -1;
  return next;
}

}  // namespace

RunSummary run_training(const Config& c, const mpi::Comm& world) {
  Run run(world);
  run.t_start = Clock::now();
  for (int r = 0; r < world.size(); ++r) run.members.push_back(r);
  if (!c.log.samples.empty()) {
    const std::string path = c.log.samples + "." + std::to_string(world.rank());
    run.samples = std::make_unique<std::ofstream>(path, std::ios::trunc);
    if (!*run.samples) throw std::runtime_error("log.samples: cannot write " + path);
  }
  const mpi::Comm* comm = &world;
  run.configs.push_back(c);
  Ending end = Ending::Done;
  for (;;) {
    auto objects = std::make_unique<GroupObjects>();
    try {
      end = train_group(run.configs.back(), *comm, run, *objects);
    } catch (...) {
      // Unwinding must not wait in MPI_Win_free for a rank that left: the job is ending anyway.
      if (!run.parked.empty()) mpi::mark_peer_lost();
      throw;
    }
    if (end == Ending::Restart) {
      // Every rank is alive (the failed ones replaced): the objects go collectively, and a new
      // set reloads the newest full checkpoint of this run, or starts afresh without one.
      run.wrote_checkpoint |= objects->resilience->wrote_checkpoint();
      Config next = without_hooks(c);
      next.checkpoint.resume = run.wrote_checkpoint ? "auto" : c.checkpoint.resume;
      objects.reset();
      run.configs.push_back(next);
      continue;
    }
    if (end == Ending::Shrink) {
      run.parked.push_back(std::move(objects));
      run.comms.push_back(survivors_comm(*comm, run, run.pending->ranks));
      comm = run.comms.back().get();
      Config next = without_hooks(c);
      next.checkpoint.resume.clear();
      run.configs.push_back(next);
      continue;
    }
    if (end == Ending::Left) {
      run.parked.push_back(std::move(objects));
      run.metrics = MetricsWriter();
      // Out of training: wait (sleeping, not polling MPI hard) until the survivors are done, then
      // free the windows of the groups this rank was in, with them.
      MPI_Request wake = MPI_REQUEST_NULL;
      GG_MPI_CHECK(MPI_Irecv(nullptr, 0, MPI_BYTE, MPI_ANY_SOURCE, kWakeTag, world.get(), &wake));
      for (int done = 0; !done;) {
        GG_MPI_CHECK(MPI_Test(&wake, &done, MPI_STATUS_IGNORE));
        if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      run.parked.clear();
      RunSummary gone;
      gone.steps = run.summary.steps;
      return gone;
    }
    objects.reset();  // over the survivors' communicator: a collective among them
    break;
  }
  // The failed ranks wait for the end of training; then the windows of the earlier groups are
  // freed, oldest first, on every rank that was in them.
  if (comm->rank() == 0)
    for (int r = 0; r < world.size(); ++r)
      if (group_rank_of(run, r) < 0)
        GG_MPI_CHECK(MPI_Send(nullptr, 0, MPI_BYTE, r, kWakeTag, world.get()));
  run.parked.clear();
  return run.summary;
}

}  // namespace gg::gossip
