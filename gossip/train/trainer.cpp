#include "gossip/train/trainer.hpp"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <thread>

#include "gossip/comm/hierarchy.hpp"
#include "gossip/comm/mixing.hpp"
#include "gossip/train/agree.hpp"
#include "kernels/loss.hpp"
#include "kernels/weights.hpp"
#include "shuffle/loader.hpp"

namespace gg::gossip {
namespace {

// GG_TEST_DETACHED_STATE=1 (or =late: its loss a step late): the CPU stand-in for a device state
// (kernels/train_state.hpp).
std::string detached_state_for_tests() {
  const char* v = std::getenv("GG_TEST_DETACHED_STATE");
  return v && (std::string(v) == "1" || std::string(v) == "late") ? v : "";
}

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
      cadence_(cadence_of(c)),
      world_(world),
      net_(kernels::build_model(trained_model(c, world.rank(), std::move(input), classes)),
           c.train.backend, std::max<int64_t>(1, c.gossip.bucket_kb * 256), c.train.precision),
      sgd_(net_.graph().param_count(),
           {static_cast<float>(c.train.momentum), static_cast<float>(c.train.weight_decay),
            c.train.nesterov}),
      schedule_({c.train.lr, c.train.base_batch, c.train.batch * run_ranks(c, world.size()),
                 static_cast<int64_t>(std::llround(c.train.warmup_epochs * steps_per_epoch)),
                 total_steps, 0.0}),
      ranks_(run_ranks(c, world.size())) {
  net_.set_deterministic(c.train.deterministic);
  kernels::ParamStore& store = net_.store();
  const kernels::Graph& g = net_.graph();
  kernels::init_params(g, store, c.train.seed);
  if (!c.train.init_from.empty()) load_initial_weights();
  // Every rank starts from rank 0's weights, whatever its RNG did.
  world_.broadcast(store.params.data(), g.param_count(), 0);
  world_.broadcast(store.buffers.data(), g.buffer_count(), 0);
  choose_layout();
  if (c.train.resident) {
    one_node_ = world_.split_shared().size() == world_.size();  // a collective
    for (int weights : {0, 1}) ipc_why_[weights] = ipc_refusal(weights == 1);
  }
  make_exchanges();
  // One rank per GPU (CUDA backend): the rank on this node picks the device.
  if (net_.backend() == kernels::Backend::Cuda)
    kernels::bind_device(net_.backend(), world_.split_shared().rank());
  if (emulated(c)) {  // an executor that waits: nothing is computed
    emulated_ = std::make_unique<EmulatedExecutor>(c, world_.rank(), net_.buckets(), step_);
    train_exec_ = emulated_.get();
  } else {
    // Compiled only now: the gradient buffer may have moved into the exchange's shared memory.
    // The evaluation's executor is compiled at the first evaluation (a run without evaluation
    // data never holds one: on a GPU, ResNet-50's activations at eval_batch 500 take tens of GiB).
    train_exec_ = &net_.at_batch(c.train.batch);
  }
  make_state();
  attach_gate();
}

void Trainer::make_state() {
  kernels::ParamStore& store = net_.store();
  const int64_t classes = graph().classes();
  if (c_.train.resident) {
    state_ = kernels::make_device_state(*train_exec_, store, sgd_);
  } else if (const std::string test = detached_state_for_tests(); !test.empty()) {
    check_resident(c_, "GG_TEST_DETACHED_STATE=" + test);
    state_ = kernels::make_detached_host_state(*train_exec_, store, sgd_, classes, test == "late");
  } else {
    state_ = kernels::make_host_state(*train_exec_, store, sgd_, classes);
  }
  // A gradient exchange mixes the gradients' host copy, bucket by bucket as backward ends them.
  state_->stage_grads(exchange_ != nullptr);
  if (device_grads() || device_weights()) make_device_exchanges();
}

kernels::ParamStore& Trainer::store() {
  if (state_) state_->to_host(kernels::kParams | kernels::kBuffers);
  return net_.store();
}

void Trainer::store_written(unsigned parts) {
  if (state_) state_->from_host(parts);
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
  const Algorithm& a = algorithm_;
  if (c_.train.virtual_ranks > 0) return make_virtual_exchanges();
  if (a.allreduce) {
    exchange_ = std::make_unique<AllreduceExchange>(world_, store.grads.data(), net_.buckets());
    return;
  }
  // One rank (a run without mpirun, the last survivor of a forward recovery) has no partner:
  // nothing is mixed or sent (a rank mixing with its own copy on a lossy wire would only round).
  // Options that do not fit the model are still refused, as at every rank count (--dry-run
  // refuses them too); with partners, the exchanges' own options are fitted below.
  if (world_.size() == 1) {
    fitted(gg::gossip::exchange_options(c_, Mixed::Weights));
    return;
  }
  const partners::Schedule schedule = gossip_schedule(c_, world_.size());
  if (c_.gossip.hierarchy == Hierarchy::Node) {
    try {
      exchange_ = std::make_unique<HierarchicalExchange>(world_, store.grads.data(), net_.buckets(),
                                                         schedule, c_.gossip.timeout_s);
    } catch (const std::invalid_argument& e) {
      throw UsageError(e.what());
    }
    return;
  }
  try {
    if (a.grads && !device_grads()) {
      // The exchange provides the gradient buffer: in shared memory, partners on this node that
      // pair up in a step average it in place, with no copy.
      auto grads = std::make_unique<GossipExchange>(world_, nullptr, net_.buckets(),
                                                    exchange_options(schedule, Mixed::Grads));
      net_.share_grads(grads->buffer());
      exchange_ = std::move(grads);
    }
    // After the update: the weights, and with them the momentum (the authors' GossipGraD); on a
    // device state's memory, made with it (make_device_exchanges).
    if (a.weights && !device_weights())
      model_exchange_ = std::make_unique<GossipExchange>(
          world_, store.params.data(), net_.buckets(), exchange_options(schedule, Mixed::Weights));
    if (a.momentum && !device_weights())
      momentum_exchange_ =
          std::make_unique<GossipExchange>(world_, sgd_.velocity().data(), net_.buckets(),
                                           exchange_options(schedule, Mixed::Momentum));
  } catch (const std::invalid_argument& e) {
    throw UsageError(std::string("gossip: ") + e.what());
  }
  // Exchanges made mid-run (after apoptosis shrank the buffers): the transports count their steps
  // from here, the schedule goes on.
  set_first_step(step_);
}

GossipOptions Trainer::exchange_options(const partners::Schedule& schedule, Mixed what) const {
  GossipOptions o = gg::gossip::exchange_options(c_, what);
  o.schedule = schedule;
  return fitted(std::move(o));
}

GossipOptions Trainer::fitted(GossipOptions o) const {
  try {
    fit_to_model(o, graph(), net_.layout(), c_.model.name);
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
  return o;
}

void Trainer::set_first_step(int64_t step) {
  if (exchange_) exchange_->set_first_step(step);
  for (WeightExchange* e : after_update()) e->set_first_step(cadence_.round(step));
}

std::vector<WeightExchange*> Trainer::after_update() const {
  std::vector<WeightExchange*> all;
  for (WeightExchange* e : {model_exchange_.get(), momentum_exchange_.get()})
    if (e) all.push_back(e);
  return all;
}

std::vector<BucketExchange*> Trainer::exchanges() const {
  std::vector<BucketExchange*> all;
  if (exchange_) all.push_back(exchange_.get());
  for (WeightExchange* e : after_update()) all.push_back(e);
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
  return step([x, y](int) { return StepInput{x, y}; });
}

StepStats Trainer::step(const std::function<StepInput(int)>& input) {
  StepStats s;
  Timeline::Span whole(timeline_, "step " + std::to_string(step_), "step");
  // The last update's weights: overlapped, behind this step's compute; pipelined, each bucket
  // waited for by forward's gate.
  start_model_exchange();
  s.lr = schedule_.at(step_) * lr_scale_;
  if (!held_.empty())
    compute_held(input, s);
  else
    compute(input, s);
  if (!streams_weights()) {
    if (exchange_) {
      Timeline::Span span(timeline_, "wait gradients", "wait");
      s.comm_seconds = exchange_->finish_step();
      // The mixed gradients where the update reads them.
      if (exchange_->host_memory())
        state_->from_host(kernels::kGrads);
      else
        state_->changed(kernels::kGrads);
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
         cadence_.weights_after(step_);
}

void Trainer::backward_streaming(StepStats& s) {
  {
    // The last round complete (forward's gate waited for its buckets) before any is updated.
    Timeline::Span span(timeline_, "wait weights", "wait");
    s.comm_seconds += flush_model();
  }
  for (WeightExchange* e : after_update()) e->begin_step(cadence_.round(step_));
  const auto lr = static_cast<float>(s.lr);
  const std::vector<kernels::Bucket>& buckets = net_.buckets();
  {
    Timeline::Span span(timeline_, "backward", "compute");
    state_->backward([&](int b) {
      if (!emulated_) state_->update_range(lr, buckets[b].begin, buckets[b].end);
      for (WeightExchange* e : after_update()) e->on_bucket_ready(b);
    });
  }
  if (emulated_)
    emulated_->update();
  else
    state_->end_ranges();
  weights_pending_ = true;
}

// A real rank's forward and backward (or, streaming the weights, its backward with the update).
void Trainer::compute(const std::function<StepInput(int)>& input, StepStats& s) {
  const StepInput in = input(0);
  kernels::StepLoss loss;
  {
    Timeline::Span span(timeline_, "forward", "compute");
    loss = state_->forward(in.x, in.y);
  }
  if (loss.known) {  // emulated compute has none; a device state's is the last step's
    s.loss = last_loss_ = loss.loss;
    s.correct = loss.correct;
    if (loss.lag > 0) s.loss_step = step_ - loss.lag;
  } else if (!emulated_) {
    s.has_loss = false;  // a device state's first step
  }
  if (streams_weights()) return backward_streaming(s);
  // Backward hands each bucket to the exchange as it completes it.
  std::function<void(int)> ready;
  if (exchange_) ready = [this](int b) { exchange_->on_bucket_ready(b); };
  if (exchange_) exchange_->begin_step(step_);
  Timeline::Span span(timeline_, "backward", "compute");
  state_->backward(ready);
}

// Every held rank's forward and backward on its own batch, its weights and statistics swapped
// into the network and its gradients and statistics out; the exchange runs when all are done.
void Trainer::compute_held(const std::function<StepInput(int)>& input, StepStats& s) {
  if (static_cast<int>(held_.size()) != ranks_)
    throw std::logic_error("Trainer::step: " + std::to_string(held_.size()) + " of " +
                           std::to_string(ranks_) + " virtual ranks were added");
  kernels::ParamStore& store = net_.store();
  if (exchange_) exchange_->begin_step(step_);
  for (int i = 0; i < held(); ++i) {
    HeldRank& r = held_[static_cast<size_t>(i)];
    const StepInput in = input(i);
    load(i);
    const kernels::StepLoss loss = state_->forward(in.x, in.y);
    r.loss = loss.loss;
    if (i == 0) {
      s.loss = loss.loss;
      s.correct = loss.correct;
    }
    state_->backward({});
    std::copy(store.grads.data(), store.grads.data() + store.grads.size(), r.grads.begin());
    std::copy(store.buffers.begin(), store.buffers.end(), r.buffers.begin());
  }
}

void Trainer::update(float lr) {
  Timeline::Span span(timeline_, "optimizer", "optimizer");
  if (emulated_) return emulated_->update();
  if (held_.empty()) return state_->update(lr);
  for (int i = 0; i < held(); ++i) sgd_of(i).step(params_of(i), grads_of(i), lr);
}

double Trainer::exchange_weights() {
  if (!model_exchange_ || !cadence_.weights_after(step_)) return 0;
  // Numbered in rounds (Cadence). Overlapped: the exchange starts
  // with the next step (start_model_exchange), after the collectives between steps, which would
  // otherwise queue behind the weights' bytes on the partners' connections (over TCP, a whole
  // exchange's worth).
  if (c_.gossip.overlap_model || c_.gossip.pipeline_weights) {
    model_due_ = cadence_.round(step_);
    return 0;
  }
  double seconds = 0;
  for (WeightExchange* e : after_update()) {
    const unsigned part = e == model_exchange_.get() ? kernels::kParams : kernels::kVelocity;
    if (state_->detached() && e->host_memory()) {
      seconds += exchange_staged(*e, part);
    } else {
      seconds += e->exchange_all(cadence_.round(step_));
      state_->changed(part);  // a device exchange mixed where the state lives (else nothing)
    }
  }
  return seconds;
}

double Trainer::exchange_staged(WeightExchange& e, unsigned part) {
  // A detached state's host copy, bucket by bucket: what exchange_all does, each bucket on its
  // way while the next still copies, then the mixed copy back.
  const auto t0 = std::chrono::steady_clock::now();
  e.begin_step(cadence_.round(step_));
  state_->to_host_buckets(part, net_.buckets(), [&e](int b) { e.on_bucket_ready(b); });
  e.finish_step();
  state_->from_host(part);
  return seconds_since(t0);
}

double Trainer::average_globally() {
  if (!cadence_.global_after(step_)) return 0;
  const auto t0 = std::chrono::steady_clock::now();
  flush_model();
  average_state();
  forget_distance();
  return seconds_since(t0);
}

void Trainer::forget_distance() {
  // The ranks' weights are equal now: what the exchange completed by flush_model measured before
  // the average is no evidence for the next check of gossip.consensus_bound.
  if (model_exchange_) model_exchange_->take_distances();
}

double Trainer::control_consensus(StepStats& s) {
  const double bound = c_.gossip.consensus_bound;
  if (bound <= 0 || !model_exchange_ || !cadence_.weights_after(step_)) return 0;
  const auto t0 = std::chrono::steady_clock::now();
  if (c_.gossip.pipeline_weights) flush_model();  // the distance is measured by the mixing
  // What the weight exchange applied in this step found (overlapped: the last update's weights,
  // corrected before this update; otherwise this update's), summed over the ranks.
  // Relative to the weights' size (the ranks' mean ||w||^2), so that one bound fits any model,
  // rank count and learning rate: E||w_i - w_j||^2 is twice the consensus distance.
  const std::vector<double> distances = model_exchange_->take_distances();
  const auto n = static_cast<size_t>(graph().param_count());
  double d[2];
  sum_over_ranks(d, 2, [&](int i, int k) {
    return k == 0 ? distances[static_cast<size_t>(i)] : squared_norm({params_of(i), n});
  });
  s.consensus_estimate = d[1] > 0 ? d[0] / (2 * d[1]) : 0;
  if (s.consensus_estimate > bound) {
    flush_model();
    average_state();
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

void Trainer::start_model_exchange() {
  if (model_due_ < 0) return;
  Timeline::Span span(timeline_, "start weight exchange", "comm");
  state_->to_host(weight_parts());  // what the exchange sends (a detached state: host-staged)
  for (WeightExchange* e : after_update()) {
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
    for (WeightExchange* e : after_update()) waited += e->finish_step();
    weights_pending_ = false;
  }
  if (c_.gossip.overlap_model && model_exchange_) {
    // The correction lands in the host copies, current since start_model_exchange (the update
    // that would change them waits for this).
    state_->to_host(weight_parts());
    for (WeightExchange* e : after_update()) waited += e->finish_delayed();
    state_->from_host(weight_parts());
  }
  return waited;
}

unsigned Trainer::weight_parts() const {
  unsigned parts = 0;
  if (model_exchange_ && model_exchange_->host_memory()) parts |= kernels::kParams;
  if (momentum_exchange_ && momentum_exchange_->host_memory()) parts |= kernels::kVelocity;
  return parts;
}

}  // namespace gg::gossip
