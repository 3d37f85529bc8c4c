#include "gossip/train/trainer.hpp"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <thread>

#include "gossip/comm/hierarchy.hpp"
#include "gossip/comm/mixing.hpp"
#include "gossip/train/agree.hpp"
#include "kernels/loss.hpp"
#include "kernels/weights.hpp"
#include "shuffle/loader.hpp"

namespace gg::gossip {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
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

kernels::ModelSpec usual_model_spec(const Config& c, int rank) {
  const bool small = small_model(c);
  const kernels::Dims input = small ? kernels::Dims{1, 28, 28} : kernels::Dims{3, 224, 224};
  return model_spec(c, rank, input, small ? 10 : 1000);
}

namespace {
// The model this rank trains: on the data's samples, or, with emulated compute, on the usual ones
// (its gradient bytes are what an emulated step exchanges; no sample reaches it).
kernels::ModelSpec trained_model(const Config& c, int rank, kernels::Dims input, int64_t classes) {
  return emulated(c) ? usual_model_spec(c, rank) : model_spec(c, rank, std::move(input), classes);
}
}  // namespace

int compute_threads(const Config& c, const mpi::Comm& world) {
  if (c.train.threads > 0) return c.train.threads;
  mpi::Comm node = world.split_shared();
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, cores / node.size());
}

Trainer::Trainer(const Config& c, const mpi::Comm& world, kernels::Dims input, int64_t classes,
                 int64_t total_steps, int64_t steps_per_epoch)
    : c_(c),
      algorithm_(mixing_of(c)),
      world_(world),
      net_(kernels::build_model(trained_model(c, world.rank(), std::move(input), classes)),
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
  choose_layout();
  make_exchanges();
  // One rank per GPU (CUDA backend): the rank on this node picks the device.
  if (net_.backend() == kernels::Backend::Cuda)
    kernels::bind_device(net_.backend(), world_.split_shared().rank());
  if (emulated(c)) {  // an executor that waits: nothing is computed
    emulated_ = std::make_unique<EmulatedExecutor>(c, world_.rank(), net_.buckets(), step_);
    train_exec_ = emulated_.get();
    attach_gate();
    return;
  }
  // Compiled only now: the gradient buffer may have moved into the exchange's shared memory.
  // The evaluation's executor is compiled at the first evaluation (a run without evaluation data
  // never holds one: on a GPU, ResNet-50's activations at eval_batch 500 take tens of GiB).
  train_exec_ = &net_.at_batch(c.train.batch);
  attach_gate();
}

void Trainer::choose_layout() {
  if (plain_weights(c_)) return;
  // The exchanges mix the ranks' buffers element by element: every rank must hold the same layout.
  // The CPU decides it (oneDNN's blocks), so ranks on different CPUs may not agree; they then
  // all stay plain.
  const uint64_t mine = kernels::native_param_layout(net_.graph(), net_.backend()).fingerprint();
  double f[2] = {static_cast<double>(mine >> 12), -static_cast<double>(mine >> 12)};  // exact
  world_.allreduce_max(f, 2);
  if (f[0] == -f[1]) {
    net_.use_native_layout();
  } else if (world_.rank() == 0) {
    std::fprintf(stderr,
                 "gossipgrad: note: the ranks' CPUs want different weight layouts; the weights "
                 "stay in the plain layout, reordered every step\n");
  }
}

partners::Schedule gossip_schedule(const Config& c, int p) {
  try {
    return schedule_of(c, p);
  } catch (const std::invalid_argument& e) {
    throw UsageError(std::string("gossip.schedule: ") + e.what());
  }
}

void Trainer::make_exchanges() {
  sent_bytes_ = 0;  // new exchanges count from 0
  lateness_ = {};
  kernels::ParamStore& store = net_.store();
  // Which combinations of exchange options are valid: check_exchange (gossip/config), before MPI.
  const GossipPlan plan = gossip_plan(c_);
  const Algorithm& a = *plan.algorithm;
  if (a.allreduce) {
    exchange_ = std::make_unique<AllreduceExchange>(world_, store.grads.data(), net_.buckets());
    return;
  }
  // One rank (a run without mpirun, the last survivor of a forward recovery) has no partner:
  // nothing is mixed or sent (a rank mixing with its own copy on a lossy wire would only round).
  if (world_.size() == 1) return;
  const partners::Schedule schedule = gossip_schedule(c_, world_.size());
  if (plan.node_hierarchy) {
    try {
      exchange_ = std::make_unique<HierarchicalExchange>(world_, store.grads.data(), net_.buckets(),
                                                         schedule, c_.gossip.timeout_s);
    } catch (const std::invalid_argument& e) {
      throw UsageError(e.what());
    }
    return;
  }
  try {
    if (a.grads) {
      // The exchange provides the gradient buffer: in shared memory, partners on this node that
      // pair up in a step average it in place, with no copy.
      auto grads = std::make_unique<GossipExchange>(world_, nullptr, net_.buckets(),
                                                    exchange_options(plan, schedule, Mixed::Grads));
      net_.share_grads(grads->buffer());
      exchange_ = std::move(grads);
    }
    // After the update: the weights, and with them the momentum (the authors' GossipGraD).
    if (a.weights)
      model_exchange_ =
          std::make_unique<GossipExchange>(world_, store.params.data(), net_.buckets(),
                                           exchange_options(plan, schedule, Mixed::Weights));
    if (a.momentum)
      momentum_exchange_ =
          std::make_unique<GossipExchange>(world_, sgd_.velocity().data(), net_.buckets(),
                                           exchange_options(plan, schedule, Mixed::Momentum));
  } catch (const std::invalid_argument& e) {
    throw UsageError(std::string("gossip: ") + e.what());
  }
  // Exchanges made mid-run (after apoptosis shrank the buffers): the transports count their steps
  // from here, the schedule goes on.
  set_first_step(step_);
}

GossipOptions Trainer::exchange_options(const GossipPlan& plan, const partners::Schedule& schedule,
                                        Mixed what) const {
  GossipOptions o = gg::gossip::exchange_options(c_, plan, what);
  o.schedule = schedule;
  fit_to_model(o, graph(), net_.layout(), c_.model.name);
  return o;
}

int64_t Trainer::model_round(int64_t step) const { return step / c_.gossip.model_every; }

void Trainer::set_first_step(int64_t step) {
  if (exchange_) exchange_->set_first_step(step);
  for (GossipExchange* e : after_update()) e->set_first_step(model_round(step));
}

std::vector<GossipExchange*> Trainer::after_update() const {
  std::vector<GossipExchange*> all;
  for (GossipExchange* e : {model_exchange_.get(), momentum_exchange_.get()})
    if (e) all.push_back(e);
  return all;
}

std::vector<BucketExchange*> Trainer::exchanges() const {
  std::vector<BucketExchange*> all;
  if (exchange_) all.push_back(exchange_.get());
  for (GossipExchange* e : after_update()) all.push_back(e);
  return all;
}

void Trainer::set_timeline(Timeline* t) {
  timeline_ = t && t->enabled() ? t : nullptr;
  for (BucketExchange* e : exchanges()) e->set_timeline(timeline_);
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
  // The last update's weights: overlapped, behind this step's compute; pipelined, each bucket
  // waited for by forward's gate.
  start_model_exchange();
  const float* logits = nullptr;
  {
    Timeline::Span span(timeline_, "forward", "compute");
    logits = train_exec_->forward(x, true);
  }
  if (logits) {  // emulated compute has no loss and no accuracy
    const auto loss = kernels::softmax_cross_entropy(logits, y, c_.train.batch, graph().classes(),
                                                     dlogits_.data());
    s.loss = loss.loss;
    s.correct = loss.correct;
  }
  s.lr = schedule_.at(step_) * lr_scale_;
  if (streams_weights()) {
    backward_streaming(s);
  } else {
    // Backward hands each bucket to the exchange as it completes it.
    std::function<void(int)> ready;
    if (exchange_) ready = [this](int b) { exchange_->on_bucket_ready(b); };
    if (exchange_) exchange_->begin_step(step_);
    {
      Timeline::Span span(timeline_, "backward", "compute");
      train_exec_->backward(dlogits_.data(), ready);
    }
    if (exchange_) {
      Timeline::Span span(timeline_, "wait gradients", "wait");
      s.comm_seconds = exchange_->finish_step();
    }
    {
      Timeline::Span span(timeline_, "wait weights", "wait");
      s.comm_seconds += flush_model();
    }
    update(static_cast<float>(s.lr));
    s.comm_seconds += exchange_weights();
  }
  s.comm_seconds += average_globally();
  s.comm_seconds += control_consensus(s);
  account(s);
  ++step_;
  return s;
}

bool Trainer::streams_weights() const {
  return c_.gossip.pipeline_weights && !exchange_ && model_exchange_ &&
         (step_ + 1) % c_.gossip.model_every == 0;
}

void Trainer::backward_streaming(StepStats& s) {
  {
    // The last round complete (forward's gate waited for its buckets) before any is updated.
    Timeline::Span span(timeline_, "wait weights", "wait");
    s.comm_seconds += flush_model();
  }
  for (GossipExchange* e : after_update()) e->begin_step(model_round(step_));
  const auto lr = static_cast<float>(s.lr);
  const std::vector<kernels::Bucket>& buckets = net_.buckets();
  {
    Timeline::Span span(timeline_, "backward", "compute");
    train_exec_->backward(dlogits_.data(), [&](int b) {
      if (!emulated_)
        sgd_.step_range(store().params.data(), store().grads.data(), lr, buckets[b].begin,
                        buckets[b].end);
      for (GossipExchange* e : after_update()) e->on_bucket_ready(b);
    });
  }
  if (emulated_)
    emulated_->update();
  else
    sgd_.end_ranges();
  weights_pending_ = true;
}

void Trainer::update(float lr) {
  Timeline::Span span(timeline_, "optimizer", "optimizer");
  if (emulated_)
    emulated_->update();
  else
    sgd_.step(store().params.data(), store().grads.data(), lr);
}

double Trainer::exchange_weights() {
  if (!model_exchange_ || (step_ + 1) % c_.gossip.model_every != 0) return 0;
  // The weight exchanges are numbered in rounds (one every gossip.model_every steps), so that the
  // transports and the partner schedule see consecutive numbers. Overlapped: the exchange starts
  // with the next step (start_model_exchange), after the collectives between steps, which would
  // otherwise queue behind the weights' bytes on the partners' connections (over TCP, a whole
  // exchange's worth).
  if (c_.gossip.overlap_model || c_.gossip.pipeline_weights) {
    model_due_ = model_round(step_);
    return 0;
  }
  double seconds = 0;
  for (GossipExchange* e : after_update()) seconds += e->exchange_all(model_round(step_));
  return seconds;
}

double Trainer::average_globally() {
  const int64_t h = c_.gossip.global_every;
  if (algorithm_.allreduce || h <= 0 || (step_ + 1) % h != 0) return 0;
  const auto t0 = std::chrono::steady_clock::now();
  flush_model();
  average_over_ranks(store().params);
  average_over_ranks(store().buffers);
  forget_distance();
  return seconds_since(t0);
}

void Trainer::forget_distance() {
  // The ranks' weights are equal now: what the exchange completed by flush_model measured before
  // the average is no evidence for the next check of gossip.consensus_bound.
  if (model_exchange_) model_exchange_->take_distance();
}

double Trainer::control_consensus(StepStats& s) {
  const double bound = c_.gossip.consensus_bound;
  if (bound <= 0 || !model_exchange_ || (step_ + 1) % c_.gossip.model_every != 0) return 0;
  const auto t0 = std::chrono::steady_clock::now();
  if (c_.gossip.pipeline_weights) flush_model();  // the distance is measured by the mixing
  // What the weight exchange applied in this step found (overlapped: the last update's weights,
  // corrected before this update; otherwise this update's), summed over the ranks.
  // Relative to the weights' size (the ranks' mean ||w||^2), so that one bound fits any model,
  // rank count and learning rate: E||w_i - w_j||^2 is twice the consensus distance.
  double d[2] = {model_exchange_->take_distance(),
                 squared_norm({store().params.data(), static_cast<size_t>(store().params.size())})};
  world_.allreduce_sum(d, 2);
  s.consensus_estimate = d[1] > 0 ? d[0] / (2 * d[1]) : 0;
  if (s.consensus_estimate > bound) {
    flush_model();
    average_over_ranks(store().params);
    average_over_ranks(store().buffers);
    forget_distance();
    s.consensus_average = true;
    ++consensus_averages_;
  }
  return seconds_since(t0);
}

void Trainer::account(StepStats& s) {
  const int64_t n = c_.gossip.consensus_every;
  if (n > 0 && (step_ + 1) % n == 0) {
    if (c_.gossip.pipeline_weights) flush_model();  // the mixed weights, as without pipelining
    s.consensus = consensus_distance();
  }
  if (algorithm_.allreduce) return;
  s.sent_bytes = unreported_bytes();
  sent_bytes_ += s.sent_bytes;
  BucketExchange::Lateness now;
  for (BucketExchange* e : exchanges()) {
    now.late += e->lateness().late;
    now.unmixed += e->lateness().unmixed;
  }
  if (c_.gossip.staleness == 0) return;
  s.late_buckets = now.late - lateness_.late;
  s.unmixed_buckets = now.unmixed - lateness_.unmixed;
  lateness_ = now;
}

shuffle::LoaderOptions evaluation_loader(shuffle::LoaderOptions o, int64_t batch, int rank,
                                         int ranks) {
  o.batch = batch;
  o.rank = rank;
  o.ranks = ranks;
  o.augment.enabled = false;
  o.shuffle = false;
  o.drop_last = false;
  o.prefetch = 2;
  return o;
}

int64_t evaluation_batch(int64_t eval_batch, int64_t samples, int ranks) {
  const int64_t share = (samples + ranks - 1) / std::max(1, ranks);
  return std::max<int64_t>(1, std::min(eval_batch, share));
}

EvalSums evaluation_sums(kernels::Executor& exec, int64_t classes,
                         const shuffle::SampleSource& data, shuffle::LoaderOptions o, int rank,
                         int ranks) {
  o = evaluation_loader(o, exec.batch(), rank, ranks);
  EvalSums sums = {0, 0, 0, 0};
  // The last ranks' shares of a test set cut into slices of ceil(n / ranks) may be empty (10,000
  // samples over 4,096 ranks: 3 each for 3,334 ranks, none for the rest).
  if (shuffle::batches_per_epoch(data.size(), o) == 0) return sums;
  shuffle::PrefetchLoader loader(data, o, 0, 1);
  shuffle::Batch b;
  while (loader.next(b)) {
    const float* logits = exec.forward(b.x.data(), false);
    const auto r = kernels::softmax_cross_entropy(logits, b.y.data(), o.batch, classes, nullptr);
    int64_t n = 0;
    for (int32_t v : b.y) n += v >= 0;
    sums[0] += r.loss * static_cast<double>(n);
    sums[1] += static_cast<double>(r.correct);
    sums[2] += static_cast<double>(r.top5);
    sums[3] += static_cast<double>(n);
  }
  return sums;
}

EvalStats eval_stats(const EvalSums& sums) {
  EvalStats e;
  e.samples = static_cast<int64_t>(sums[3]);
  if (e.samples > 0) {
    e.loss = sums[0] / sums[3];
    e.top1 = sums[1] / sums[3];
    e.top5 = sums[2] / sums[3];
  }
  return e;
}

EvalStats Trainer::evaluate(const shuffle::SampleSource& data, shuffle::LoaderOptions o) {
  // Evaluate the average model, then give every rank its own weights back.
  flush_model();
  const std::vector<float> own_params = store().params, own_buffers = store().buffers;
  if (world_.size() > 1) {
    average_over_ranks(store().params);
    average_over_ranks(store().buffers);
  }
  const double consensus =
      distance_to_average(own_params.data(), store().params.data(), store().params.size());
  if (!eval_exec_)
    eval_exec_ = &net_.at_batch(evaluation_batch(c_.train.eval_batch, data.size(), world_.size()));
  EvalSums sums =
      evaluation_sums(*eval_exec_, graph().classes(), data, o, world_.rank(), world_.size());
  world_.allreduce_sum(sums.data(), static_cast<int64_t>(sums.size()));
  EvalStats e = eval_stats(sums);
  store().params = own_params;
  store().buffers = own_buffers;
  e.consensus = consensus;
  return e;
}

void Trainer::capture_state(RankState& s) {
  if (c_.gossip.pipeline_weights) flush_model();  // the weights as mixed after the last update
  s.step = step_;
  s.lr_scale = lr_scale_;
  s.dropout_step = train_exec_ ? train_exec_->dropout_step() : 0;
  s.sgd_started = sgd_.started();
  // States leave the run in the plain layout (files, other ranks, other CPUs read them).
  s.params = net_.plain(store().params.data());
  s.buffers = store().buffers;
  s.delayed_delta.clear();
  start_model_exchange();  // the state holds the correction of the last update's exchange
  // The momentum's correction is applied now: nothing reads or moves the momentum before the next
  // update, so the numbers are those of an uninterrupted run.
  if (momentum_exchange_ && c_.gossip.overlap_model) momentum_exchange_->finish_delayed();
  s.velocity = net_.plain(sgd_.velocity().data());
  if (model_exchange_ && c_.gossip.overlap_model) {
    s.delayed_delta = model_exchange_->delayed_delta();
    if (!s.delayed_delta.empty()) s.delayed_delta = net_.plain(s.delayed_delta.data());
  }
  // After the settling above: it may have measured the pending exchange.
  s.consensus_distance = model_exchange_ ? model_exchange_->distance() : 0;
  s.rank = world_.rank();
  s.ranks = world_.size();
  s.parts.clear();
  const StateLayout layout = state_layout();
  for (const auto& [name, e] : named_exchanges()) {
    const size_t first = s.parts.size();
    e->save_state(s.parts, layout);
    for (size_t i = first; i < s.parts.size(); ++i) s.parts[i].exchange = name;
  }
}

std::vector<std::pair<std::string, BucketExchange*>> Trainer::named_exchanges() const {
  std::vector<std::pair<std::string, BucketExchange*>> all;
  if (exchange_) all.emplace_back(kGradientExchange, exchange_.get());
  if (model_exchange_) all.emplace_back(kWeightExchange, model_exchange_.get());
  if (momentum_exchange_) all.emplace_back(kMomentumExchange, momentum_exchange_.get());
  return all;
}

StateLayout Trainer::state_layout() const {
  return {[this](const float* v, int64_t) { return net_.plain(v); },
          [this](const std::vector<float>& v) { return net_.from_plain(v); }};
}

int64_t Trainer::unreported_bytes() const {
  if (algorithm_.allreduce) return 0;
  int64_t sent = 0;
  for (const BucketExchange* e : exchanges()) sent += e->bytes_sent();
  return sent - sent_bytes_;
}

void Trainer::restore_model(const RankState& s) {
  if (static_cast<int64_t>(s.params.size()) != store().params.size() ||
      static_cast<int64_t>(s.buffers.size()) != store().buffers.size() ||
      s.velocity.size() != sgd_.velocity().size())
    throw std::invalid_argument("the saved state does not fit this model");
  // A weight exchange due or in flight completes (its partner waits for it) and is then replaced.
  start_model_exchange();
  if (c_.gossip.pipeline_weights) flush_model();
  if (momentum_exchange_ && c_.gossip.overlap_model) momentum_exchange_->finish_delayed();
  if (model_exchange_ && c_.gossip.overlap_model)
    model_exchange_->set_delayed_delta(s.delayed_delta.empty() ? s.delayed_delta
                                                               : net_.from_plain(s.delayed_delta));
  if (model_exchange_) model_exchange_->restore_distance(s.consensus_distance);
  // What the exchanges keep (state_part.hpp) is this rank's own: a state of another rank (a
  // rollback's donor, a survivor's under supervise, an average over another rank count) brings
  // none, and every exchange starts again from nothing (what rounding still owed would be paid
  // twice; what a pair shares names its peers by rank in this group). A part of an algorithm this run
  // does not use is left unread, and one this run uses but the state lacks starts from nothing.
  const bool own = own_state(s);
  const StateLayout layout = state_layout();
  for (const auto& [name, e] : named_exchanges()) {
    std::vector<StatePart> mine;
    if (own)
      for (const StatePart& p : s.parts)
        if (p.exchange == name) mine.push_back(p);
    e->load_state(mine, layout);
  }
  net_.from_plain(s.params, store().params.data());
  // A correction pending in a state of an overlapped run, restored by a run that does not overlap
  // (or sends no weights): the pair average it completes is applied now, before the next forward.
  if (!s.delayed_delta.empty() && !(model_exchange_ && c_.gossip.overlap_model))
    apply_correction({store().params.data(), static_cast<size_t>(store().params.size())},
                     net_.from_plain(s.delayed_delta));
  std::copy(s.buffers.begin(), s.buffers.end(), store().buffers.begin());
  net_.from_plain(s.velocity, sgd_.velocity().data());
  sgd_.set_started(s.sgd_started);
}

bool Trainer::own_state(const RankState& s) const {
  return s.ranks == world_.size() && s.rank == world_.rank();
}

void Trainer::resume_at(int64_t step, uint64_t dropout_step, int64_t unreported_bytes) {
  step_ = step;
  sent_bytes_ -= unreported_bytes;  // counted by the first step, as in an uninterrupted run
  if (train_exec_) train_exec_->set_dropout_step(dropout_step);
  set_first_step(step);
}

void Trainer::forget_peers(const std::vector<int>& lost) {
  if (lost.empty()) return;
  for (BucketExchange* e : exchanges()) e->forget_peers(lost);
}

void Trainer::rewind(const RankState& s) {
  restore_model(s);
  const int64_t back = step_ - s.step;
  if (exchange_) exchange_->repeat_steps(back);
  for (GossipExchange* e : after_update())
    e->repeat_steps(model_round(step_) - model_round(s.step));
  step_ = s.step;
  if (train_exec_) train_exec_->set_dropout_step(s.dropout_step);
}

void Trainer::load_initial_weights() {
  // Rank 0 reads the file; its verdict is shared so that every rank fails the same way.
  mpi::RankError error;
  if (world_.rank() == 0) {
    try {
      kernels::load_weights(c_.train.init_from, net_.graph(), net_.store());
    } catch (const std::invalid_argument& e) {  // weights that do not fit the model
      error = {std::string("train.init_from: ") + e.what(), true};
    } catch (const std::exception& e) {  // an unreadable file
      error = {std::string("train.init_from: ") + e.what(), false};
    }
  }
  throw_agreed(world_, error);
}

void Trainer::average_model(std::vector<float>& params, std::vector<float>& buffers) {
  flush_model();
  params = net_.plain(store().params.data());
  buffers = store().buffers;
  if (world_.size() > 1) {
    average_over_ranks(params);
    average_over_ranks(buffers);
  }
}

void Trainer::start_model_exchange() {
  if (model_due_ < 0) return;
  Timeline::Span span(timeline_, "start weight exchange", "comm");
  for (GossipExchange* e : after_update()) {
    if (c_.gossip.pipeline_weights)
      e->start_all(model_due_);
    else
      e->start_delayed(model_due_);
  }
  weights_pending_ = c_.gossip.pipeline_weights;
  model_due_ = -1;
}

void Trainer::attach_gate() {
  if (!c_.gossip.pipeline_weights || !model_exchange_) return;
  train_exec_->set_bucket_gate([this](int b) {
    if (!weights_pending_) return;
    Timeline::Span span(timeline_, "wait weights " + std::to_string(b), "wait");
    gate_waited_ += model_exchange_->wait_bucket(b);
  });
}

double Trainer::flush_model() {
  start_model_exchange();
  double waited = gate_waited_;
  gate_waited_ = 0;
  if (weights_pending_) {
    for (GossipExchange* e : after_update()) waited += e->finish_step();
    weights_pending_ = false;
  }
  if (c_.gossip.overlap_model)
    for (GossipExchange* e : after_update()) waited += e->finish_delayed();
  return waited;
}

void Trainer::average_over_ranks(float* v, int64_t n) {
  world_.allreduce_sum(v, n);
  const float inv = 1.f / static_cast<float>(world_.size());
  for (int64_t i = 0; i < n; ++i) v[i] *= inv;
}

double Trainer::consensus_distance() {
  std::vector<float> avg(store().params);
  average_over_ranks(avg);
  return distance_to_average(store().params.data(), avg.data(), store().params.size());
}

double Trainer::distance_to_average(const float* w, const float* avg, int64_t n) {
  const auto count = static_cast<size_t>(n);
  double d = squared_distance({w, count}, {avg, count});
  world_.allreduce_sum(&d, 1);
  return d / world_.size();
}

// Changing the network's shape: apoptosis removes units (agreed by every rank), a resume of a
// checkpoint taken after a shrink rebuilds the shrunk widths.

ApoptosisReport Trainer::apoptosis() {
  const auto t0 = std::chrono::steady_clock::now();
  flush_model();  // scores from the weights as they are after the last update
  ApoptosisReport rep;
  rep.step = step_;
  rep.params_before = graph().param_count();
  const kernels::Removal r = agree_removal(world_, graph(), net_.plain(store().params.data()), c_);
  for (const auto& [node, units] : r)
    rep.removed[graph().node(node).name] = static_cast<int64_t>(units.size());
  shrink(r);
  rep.params_after = graph().param_count();
  for (const kernels::PrunableLayer& l : apoptosis_layers(c_, graph()))
    rep.widths[graph().node(l.node).name] = l.units;
  rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return rep;
}

void Trainer::shrink(const kernels::Removal& r) {
  if (r.empty()) return;
  flush_model();  // a pending weight exchange belongs to the old layout
  const kernels::Shrink s = kernels::plan_shrink(graph(), r);
  std::vector<float> params = s.params(net_.plain(store().params.data()));
  std::vector<float> buffers = s.buffers(store().buffers);
  std::vector<float> velocity = s.params(net_.plain(sgd_.velocity().data()));
  rebuild(s.graph, std::move(params), std::move(buffers), std::move(velocity));
}

void Trainer::rebuild(kernels::Graph g, std::vector<float> params, std::vector<float> buffers,
                      std::vector<float> velocity) {
  const uint64_t dropout_step = train_exec_->dropout_step();
  // The exchanges go first, on every rank alike (freeing their windows is collective): the
  // gradient exchange owns the memory the gradients live in, the model exchange points at the
  // parameters about to be replaced.
  flush_model();  // a weight exchange still due goes out over the old layout first
  exchange_.reset();
  model_exchange_.reset();
  momentum_exchange_.reset();
  train_exec_ = eval_exec_ = nullptr;
  net_.rebuild(std::move(g), std::move(params), std::move(buffers));
  sgd_.set_velocity(net_.from_plain(velocity));  // in the rebuilt network's layout
  make_exchanges();
  train_exec_ = &net_.at_batch(c_.train.batch);
  train_exec_->set_dropout_step(dropout_step);
  attach_gate();
}

void Trainer::reshape(kernels::Graph g) {
  const auto params = static_cast<size_t>(g.param_count());
  const auto buffers = static_cast<size_t>(g.buffer_count());
  rebuild(std::move(g), std::vector<float>(params, 0.f), std::vector<float>(buffers, 0.f),
          std::vector<float>(params, 0.f));
}

}  // namespace gg::gossip
