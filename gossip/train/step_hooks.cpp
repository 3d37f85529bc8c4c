#include "gossip/train/step_hooks.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "gossip/comm/wait_watch.hpp"
#include "gossip/resilience/checkpoint.hpp"
#include "gossip/train/agree.hpp"
#include "gossip/train/apoptosis.hpp"
#include "gossip/train/events.hpp"
#include "gossip/train/fault_hooks.hpp"
#include "gossip/train/stop_signals.hpp"
#include "gossip/train/test_hooks.hpp"
#include "kernels/apoptosis.hpp"
#include "kernels/tensor.hpp"

namespace gg::gossip {
namespace {

// Time that is not training (evaluation, checkpoints): added to job.untimed_seconds, which the
// step that follows leaves out of its time.
class Untimed {
 public:
  explicit Untimed(JobState& job) : job_(job), t0_(Clock::now()) {}
  ~Untimed() { job_.untimed_seconds += seconds_since(t0_); }
  Untimed(const Untimed&) = delete;
  Untimed& operator=(const Untimed&) = delete;

 private:
  JobState& job_;
  Clock::time_point t0_;
};

// log.samples: every step's sample ids, once per time the step ran ("step epoch id ...").
class SampleLog : public StepHook {
 public:
  explicit SampleLog(std::ostream& out) : out_(out) {}
  void after_step(StepRecord& r) override {
    for (int k = 0; k < r.runs; ++k) {
      out_ << r.step << ' ' << r.batch->epoch;
      for (int64_t id : r.batch->ids) out_ << ' ' << id;
      out_ << '\n';
    }
    if (!out_) throw std::runtime_error("log.samples: cannot write the sample log (disk full?)");
  }

 private:
  std::ostream& out_;
};

// log.losses: every step's loss on this rank, exactly, once per time the step ran.
class LossLog : public StepHook {
 public:
  explicit LossLog(std::ostream& out) : out_(out) {}
  void after_step(StepRecord& r) override {
    if (!r.stats.has_loss) return;  // a device state's first step (its loss comes with the next)
    out_ << loss_line(r.stats.loss_step >= 0 ? r.stats.loss_step : r.step, r.stats.loss);
    if (!out_) throw std::runtime_error("log.losses: cannot write the loss log (disk full?)");
  }

 private:
  std::ostream& out_;
};

// A NaN/Inf loss on any rank: every rank goes back to its last good state (or training stops).
class NanGuardHook : public StepHook {
 public:
  NanGuardHook(NanGuard& guard, MetricsWriter& metrics) : guard_(guard), metrics_(metrics) {}
  void before_step(int64_t s, shuffle::Batch&) override { guard_.before_step(s); }
  void after_step(StepRecord& r) override {
    r.restored = guard_.after_step(r.step, r.stats.loss, r.last, metrics_);
  }

 private:
  NanGuard& guard_;
  MetricsWriter& metrics_;
};

// Neuron apoptosis every apoptosis.interval steps, and the metrics events of its decisions, which
// carry the images/s of the 20 steps (at most an interval) after a decision.
class Apoptosis : public StepHook {
 public:
  Apoptosis(Group& g, JobState& job)
      : g_(g), job_(job), metrics_(std::min<int64_t>(20, g.c.apoptosis.interval)) {}

  void after_step(StepRecord& r) override {
    for (const auto& e : metrics_.step(r.seconds, g_.global_batch)) job_.metrics.write(e);
    const Config& c = g_.c;
    const int64_t done = r.step + 1;
    if (!c.apoptosis.enable || r.restored || done % c.apoptosis.interval != 0 || done >= g_.total ||
        static_cast<double>(done) > c.apoptosis.until * g_.total)
      return;
    const ApoptosisReport a = g_.trainer.apoptosis();
    job_.train_seconds += a.seconds;  // rebuilding is part of training time
    for (const auto& e : metrics_.finish()) job_.metrics.write(e);
    metrics_.decided(a);
    if (a.params_after == a.params_before) return;
    g_.recovery.guard().model_changed();
    if (!g_.lead || !c.log.progress) return;
    std::string removed;
    for (const auto& [name, n] : a.removed)
      removed += (removed.empty() ? "" : ", ") + name + " -" + std::to_string(n);
    std::printf("apoptosis at step %lld: %lld -> %lld params (%s)\n", static_cast<long long>(done),
                static_cast<long long>(a.params_before), static_cast<long long>(a.params_after),
                removed.c_str());
    std::fflush(stdout);
  }
  void finish() override {
    for (const auto& e : metrics_.finish()) job_.metrics.write(e);
  }

 private:
  Group& g_;
  JobState& job_;
  ApoptosisMetrics metrics_;
};

// The job's totals, the step and consensus events, and a progress line every log.interval s.
class Progress : public StepHook {
 public:
  Progress(Group& g, JobState& job) : g_(g), job_(job) {}

  void after_step(StepRecord& r) override {
    job_.train_seconds += r.seconds;
    job_.images += static_cast<double>(g_.global_batch);
    job_.comm_seconds += r.stats.comm_seconds;
    if (r.restored) return;
    if (r.stats.has_loss) {
      loss_avg_ =
          r.step == g_.first || !averaging_ ? r.stats.loss : 0.95 * loss_avg_ + 0.05 * r.stats.loss;
      averaging_ = true;
    }
    if (!g_.lead) return;
    nlohmann::json event = step_event({.step = r.step,
                                       .epoch = r.epoch,
                                       .has_loss = !emulated(g_.c),
                                       .seconds = r.seconds,
                                       .global_batch = g_.global_batch,
                                       .data_wait_s = r.data_wait,
                                       .shuffle_s = r.shuffle_wait,
                                       .skipped = g_.data.skipped()},
                                      r.stats);
    if (g_.held) g_.held->add_to_step(event);
    job_.metrics.write(event);
    if (r.stats.consensus >= 0) job_.metrics.write(consensus_event(r.step, r.stats.consensus));
    print(r);
  }

 private:
  void print(const StepRecord& r) {
    const double now = seconds_since(job_.t_start);
    if (!g_.c.log.progress || (now - job_.last_print < g_.c.log.interval && !r.last)) return;
    job_.last_print = now;
    const double ips = job_.images / job_.train_seconds;
    char loss[32] = "emulated";
    if (!emulated(g_.c)) std::snprintf(loss, sizeof loss, "loss %.4f", loss_avg_);
    std::printf("%sstep %6lld/%lld  epoch %lld/%lld  %s  lr %.4f  %.0f img/s  ETA %s\n",
                g_.held ? "VIRTUAL " : "", static_cast<long long>(r.step + 1),
                static_cast<long long>(g_.total), static_cast<long long>(r.epoch + 1),
                static_cast<long long>(g_.epochs), loss, r.stats.lr, ips,
                format_duration((g_.total - r.step - 1) * g_.global_batch / ips).c_str());
    std::fflush(stdout);
  }
  Group& g_;
  JobState& job_;
  double loss_avg_ = 0;
  bool averaging_ = false;  // loss_avg_ holds a loss
};

// At the end of every epoch: the test top-1/top-5 of the ranks' average model, and the
// average-model checkpoint (model.npz + meta.json) every checkpoint.every_epochs and at the end.
class Evaluation : public StepHook {
 public:
  Evaluation(Group& g, JobState& job) : g_(g), job_(job) {
    meta_.model = model_spec(g.c, g.comm.rank(), g.data.input(), g.data.classes());
    meta_.ranks = g.comm.size();
    // Pixel sources: x = (pixel/255 - mean) / std. (JPEG sources normalise per channel.)
    meta_.input_mean = g.data.eval_options().norm.mean;
    meta_.input_std = g.data.eval_options().norm.std;
  }

  void after_step(StepRecord& r) override {
    if (!r.epoch_end || g_.data.eval_source() == nullptr) return;
    const mpi::Activity doing("evaluation after step " + std::to_string(r.step + 1));
    const Untimed untimed(job_);
    EvalStats e;
    {
      Timeline::Span span(g_.trainer.timeline(), "evaluate", "eval");
      e = g_.trainer.evaluate(*g_.data.eval_source(), g_.data.eval_options());
    }
    job_.summary.final_top1 = e.top1;
    job_.summary.final_top5 = e.top5;
    job_.summary.eval_step = r.step + 1;
    if (g_.lead) report(r, e);
    const int64_t every = g_.c.checkpoint.every_epochs;
    if (!g_.c.checkpoint.dir.empty() && (r.last || (every > 0 && (r.epoch + 1) % every == 0)))
      save(r, e);
  }

 private:
  void report(const StepRecord& r, const EvalStats& e) {
    char text[160];
    std::snprintf(text, sizeof text,
                  "epoch %lld: test top-1 %.2f%%  top-5 %.2f%%  loss %.4f  (%lld samples",
                  static_cast<long long>(r.epoch + 1), 100 * e.top1, 100 * e.top5, e.loss,
                  static_cast<long long>(e.samples));
    std::string line = text;
    nlohmann::json event =
        eval_event(r.epoch + 1, r.step + 1, e, g_.trainer.ranks(), seconds_since(job_.t_start));
    if (g_.held) g_.held->add_to_eval(r.last, r.step + 1, e.consensus, line, event, job_.metrics);
    std::printf("%s)\n", line.c_str());
    std::fflush(stdout);
    job_.metrics.write(event);
  }
  void save(const StepRecord& r, const EvalStats& e) {
    g_.trainer.average_model(params_, buffers_);  // a collective
    // Every rank holds the same average: all refuse alike, and nothing is written.
    if (!kernels::all_finite(params_) || !kernels::all_finite(buffers_))
      throw std::runtime_error("checkpoint: the ranks' average model holds NaN or inf after step " +
                               std::to_string(r.step + 1) +
                               ": model.npz not written; lower train.lr");
    meta_.epoch = r.epoch + 1;
    meta_.step = r.step + 1;
    meta_.top1 = e.top1;
    meta_.widths = kernels::changed_widths(kernels::build_model(meta_.model), g_.trainer.graph());
    if (!g_.lead) return;
    write_checkpoint(g_.c.checkpoint.dir, meta_, g_.trainer.graph(), params_, buffers_);
    job_.metrics.write({{"event", "checkpoint"},
                        {"epoch", r.epoch + 1},
                        {"step", r.step + 1},
                        {"dir", g_.c.checkpoint.dir}});
  }
  Group& g_;
  JobState& job_;
  CheckpointMeta meta_;
  std::vector<float> params_, buffers_;
};

// Full checkpoints (checkpoint.every, every_minutes, at the end) and train.stop_at.
class FullCheckpoints : public StepHook {
 public:
  FullCheckpoints(Recovery& recovery, JobState& job)
      : recovery_(recovery), job_(job), metrics_(job.metrics) {}
  void after_step(StepRecord& r) override {
    const mpi::Activity doing("checkpoints after step " + std::to_string(r.step + 1));
    const Untimed untimed(job_);
    stop_ = recovery_.after_step_done(r.step, r.epoch, r.last, metrics_);
  }
  bool stop() const override { return stop_; }

 private:
  Recovery& recovery_;
  JobState& job_;
  MetricsWriter& metrics_;
  bool stop_ = false;
};

// SIGTERM / SIGINT on any rank: every rank stops after this step (one 8-byte collective a step
// agrees on it; with guard.lag 1 it runs behind the next step, and every rank stops after that
// one), with a full checkpoint where checkpoint.dir is set.
class StopOnSignal : public StepHook {
 public:
  StopOnSignal(Group& g, JobState& job) : g_(g), job_(job), agreement_(g.comm) {}
  void after_step(StepRecord& r) override {
    double sig = agreement_.running() ? agreement_.finish()[0] : 0;
    if (sig == 0) {
      const bool behind = g_.c.guard.lag > 0 && !r.last;
      agreement_.start(r.step, {static_cast<double>(StopSignals::requested())}, behind);
      if (behind) return;
      sig = agreement_.finish()[0];
    }
    if (sig == 0) return;
    const int signal = static_cast<int>(sig);
    if (job_.stop_signals) job_.stop_signals->taken_up();
    const int64_t done = r.step + 1;
    const std::string folder = g_.recovery.checkpoint_now(done, r.epoch, job_.metrics);
    job_.metrics.write(stopped_event(signal_name(signal), done));
    throw StopRequested(signal,
                        std::string("stopped by ") + signal_name(signal) + " after step " +
                            std::to_string(done) + " of " + std::to_string(g_.total) +
                            (folder.empty() ? ": no checkpoint.dir, so nothing was saved"
                                            : ": full checkpoint in " + folder +
                                                  "; resume with --checkpoint.resume auto"));
  }

 private:
  Group& g_;
  JobState& job_;
  LaggedMax agreement_;
};

}  // namespace

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

StepHooks make_step_hooks(Group& g, JobState& job) {
  StepHooks hooks;
  if (auto rollback = make_rollback_hook(g, job)) hooks.add(std::move(rollback));
  if (job.samples) hooks.add(std::make_unique<SampleLog>(*job.samples));
  if (job.losses) hooks.add(std::make_unique<LossLog>(*job.losses));
  // Virtual ranks: their losses (every rank's log.losses), a NaN loss refused; the NaN guard's
  // snapshots are real ranks' states.
  if (g.held)
    hooks.add(g.held->hook());
  else
    hooks.add(std::make_unique<NanGuardHook>(g.recovery.guard(), job.metrics));
  if (auto test = make_test_hook(g.c, g.comm, g.trainer, g.recovery.resumed()))
    hooks.add(std::move(test));
  hooks.add(std::make_unique<Apoptosis>(g, job));
  hooks.add(std::make_unique<Progress>(g, job));
  hooks.add(std::make_unique<Evaluation>(g, job));
  hooks.add(std::make_unique<FullCheckpoints>(g.recovery, job));
  hooks.add(std::make_unique<StopOnSignal>(g, job));
  // Last: the state a real failure saves is that of a step whose agreements all completed.
  if (job.failures.emergency) hooks.add(make_emergency_hook(g, *job.failures.emergency));
  return hooks;
}

}  // namespace gg::gossip
