#include "gossip/trainer.hpp"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <thread>

#include "gossip/checkpoint.hpp"
#include "gossip/data.hpp"
#include "gossip/resilience.hpp"
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

RunSummary run_training(const Config& c, const mpi::Comm& world) {
  const int rank = world.rank(), ranks = world.size();
  const bool lead = rank == 0;
  const int threads = compute_threads(c, world);
  omp_set_num_threads(threads);

  TrainingData data(c, world);
  const int64_t per_epoch = data.steps_per_epoch();
  int64_t total = per_epoch * c.train.epochs;
  if (c.train.max_steps > 0) total = std::min(total, c.train.max_steps);
  const int64_t epochs = (total + per_epoch - 1) / per_epoch;

  Trainer trainer(c, world, data.input(), data.classes(), total, per_epoch);
  CheckpointMeta checkpoint;
  checkpoint.model = model_spec(c, world.rank(), data.input(), data.classes());
  Resilience resilience(c, world, trainer, data, model_spec(c, 0, data.input(), data.classes()));
  const int64_t first = resilience.resume();
  MetricsWriter metrics;  // a resumed run appends
  if (lead) metrics = MetricsWriter(c.log.metrics, c.log.overwrite, !c.checkpoint.resume.empty());
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
  if (lead) {
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
    std::fflush(stdout);
    metrics.write({{"event", "start"},
                   {"ranks", ranks},
                   {"threads", threads},
                   {"model", c.model.name},
                   {"params", trainer.graph().param_count()},
                   {"global_batch", global_batch},
                   {"steps", total},
                   {"first_step", first},
                   {"mode", c.gossip.mode},
                   {"backend", c.train.backend}});
  }

  world.barrier();  // the ranks' timelines start together
  Timeline timeline(!c.log.timeline.empty());
  trainer.set_timeline(&timeline);
  data.start(epochs, first);
  shuffle::Batch batch;
  RunSummary summary;
  const auto t_start = Clock::now();
  double train_seconds = 0, last_print = 0, loss_avg = 0, wait_before = 0, comm_seconds = 0;
  int64_t epoch = 0;
  summary.steps = first;
  for (int64_t s = first; s < total; ++s) {
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
    const StepStats st = trainer.step(batch.x.data(), batch.y.data());
    const auto t_shuffle = Clock::now();
    {
      Timeline::Span span(trainer.timeline(), "shuffle", "data");
      data.finish_step(s);
    }
    const double shuffle_wait = seconds_since(t_shuffle);
    // A NaN/Inf loss on any rank: every rank goes back to its last good state (or training stops).
    const bool restored = resilience.after_step(s, st.loss, metrics);
    const double dt = seconds_since(t0);
    train_seconds += dt;
    comm_seconds += st.comm_seconds;
    if (!restored) loss_avg = s == first ? st.loss : 0.95 * loss_avg + 0.05 * st.loss;
    epoch = batch.epoch;
    for (const auto& e : apoptosis_metrics.step(dt, global_batch)) metrics.write(e);
    if (c.apoptosis.enable && !restored && (s + 1) % c.apoptosis.interval == 0 && s + 1 < total &&
        static_cast<double>(s + 1) <= c.apoptosis.until * static_cast<double>(total)) {
      const ApoptosisReport a = trainer.apoptosis();
      train_seconds += a.seconds;  // rebuilding is part of training time
      for (const auto& e : apoptosis_metrics.finish()) metrics.write(e);
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
      metrics.write({{"event", "step"},
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
        metrics.write({{"event", "consensus"}, {"step", s + 1}, {"consensus", st.consensus}});
      const double now = seconds_since(t_start);
      if (c.log.progress && (now - last_print >= c.log.interval || s + 1 == total)) {
        last_print = now;
        const double ips = global_batch * (s + 1 - first) / train_seconds;
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
        metrics.write({{"event", "eval"},
                       {"epoch", epoch + 1},
                       {"step", s + 1},
                       {"top1", e.top1},
                       {"top5", e.top5},
                       {"loss", e.loss},
                       {"consensus", e.consensus},
                       {"wall_s", seconds_since(t_start)}});
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
          metrics.write({{"event", "checkpoint"},
                         {"epoch", epoch + 1},
                         {"step", s + 1},
                         {"dir", c.checkpoint.dir}});
        }
      }
    }
    summary.steps = s + 1;
    if (resilience.after_step_done(s, epoch, s + 1 == total, metrics)) break;  // train.stop_at
  }
  for (const auto& e : apoptosis_metrics.finish()) metrics.write(e);
  summary.wall_seconds = seconds_since(t_start);
  if (timeline.enabled()) {
    trainer.set_timeline(nullptr);
    timeline.write(world, c.log.timeline);
    if (lead) std::printf("gossipgrad: timeline written to %s\n", c.log.timeline.c_str());
  }
  // Every rank's corrupt files and shuffled samples (a collective: every rank gets here).
  int64_t data_totals[2] = {data.skipped(), data.shuffled_samples()};
  world.allreduce_sum(data_totals, 2);
  summary.skipped_samples = data_totals[0];
  summary.images_per_second =
      train_seconds > 0 ? global_batch * (summary.steps - first) / train_seconds : 0;
  if (lead) {
    const double comm_share = train_seconds > 0 ? comm_seconds / train_seconds : 0;
    char final_eval[64] = "no evaluation data";
    if (data.eval_source())
      std::snprintf(final_eval, sizeof final_eval, "final test top-1 %.2f%%",
                    100 * summary.final_top1);
    std::printf(
        "done: %lld steps in %s, %.0f img/s, exposed communication %.1f%% of step time, %s "
        "(metrics: %s)\n",
        static_cast<long long>(summary.steps), format_duration(summary.wall_seconds).c_str(),
        summary.images_per_second, 100 * comm_share, final_eval, c.log.metrics.c_str());
    metrics.write({{"event", "summary"},
                   {"steps", summary.steps},
                   {"top1", summary.final_top1},
                   {"top5", summary.final_top5},
                   {"wall_s", summary.wall_seconds},
                   {"images_per_s", summary.images_per_second},
                   {"comm_s", comm_seconds},
                   {"exposed_comm_share", comm_share},
                   {"data_wait_s", data.wait_seconds()},
                   {"params", trainer.graph().param_count()},
                   {"skipped", data_totals[0]},
                   {"shuffled_samples", data_totals[1]}});
  }
  return summary;
}

}  // namespace gg::gossip
