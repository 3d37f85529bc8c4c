// The training loop: one function that reads as the algorithm (train_group), the set-up of a
// group of ranks around it, and the job over successive groups when simulated failures end one
// (parking, the wake and the survivors' communicator: gossip/resilience/groups.hpp).
#include "gossip/train/loop.hpp"

#include <omp.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <thread>

#include "gossip/comm/wait_watch.hpp"
#include "gossip/train/agree.hpp"
#include "gossip/train/events.hpp"
#include "gossip/train/fault_hooks.hpp"
#include "gossip/train/job.hpp"
#include "gossip/train/run_lock.hpp"
#include "gossip/train/step_hooks.hpp"
#include "gossip/train/stop_signals.hpp"

namespace gg::gossip {
namespace {

// Where group g starts: the state a failure carried over (a forward recovery, or the survivors
// of a real failure), else a resumed checkpoint or step 0; the job's failures planned first, and
// checked against the survivors they leave.
int64_t first_step(const Config& c, const mpi::Comm& comm, Group& g, JobState& job) {
  plan_failures(c, job, comm.size(), g.total);
  JobFailures& f = job.failures;
  if (!f.carry && !f.plan.events.empty()) {
    // The survivors of a forward recovery keep these settings (fault.mtbf_steps' failures are
    // known only now); the node layout as the fullest node has it, so that every rank agrees.
    double on_node = g.ranks_on_node;
    comm.allreduce_max(&on_node, 1);
    check_forward_survivors(c, comm.size(), static_cast<int>(on_node), f.plan.events);
  }
  if (!f.carry) return g.recovery.resume();
  const int64_t first = g.recovery.continue_from(*f.carry, f.carry_step, f.carry_per_epoch);
  // Slots of lost ranks filled with another rank's state (supervise --replace-lost).
  if (f.real_failure && f.real_failure->replace) g.trainer.forget_peers(f.real_failure->lost);
  // Later failures happen at the same point of training, in the survivors' steps.
  for (size_t i = f.plan.next; i < f.plan.events.size(); ++i)
    f.plan.events[i].step = g.recovery.same_point(f.plan.events[i].step, f.carry_per_epoch);
  f.carry.reset();
  return first;
}

// The data, the trainer and its recovery over `comm`, and where this group starts: a resumed
// checkpoint, the state a forward recovery carried over, or step 0.
Group open_group(const Config& c, const mpi::Comm& comm, JobState& job, GroupObjects& o) {
  const int threads = compute_threads(c, comm);
  omp_set_num_threads(threads);
  o.data = std::make_unique<TrainingData>(c, comm);
  TrainingData& data = *o.data;
  const int64_t per_epoch = data.steps_per_epoch();
  int64_t total = per_epoch * c.train.epochs;
  // train.max_steps and train.stop_at count steps of the job as launched: over another rank count
  // (a forward recovery, a shrink) a step trains another number of samples, so they move to the
  // same point of the same epoch in this group's steps (rounded up: no planned sample left out).
  const int64_t plan_per_epoch = data.steps_per_epoch_at(job.failures.plan_ranks);
  const auto at_plan_point = [&](int64_t step) {
    if (plan_per_epoch == per_epoch || step / plan_per_epoch >= c.train.epochs) return step;
    return step / plan_per_epoch * per_epoch +
           (step % plan_per_epoch * per_epoch + plan_per_epoch - 1) / plan_per_epoch;
  };
  double planned_epochs = static_cast<double>(c.train.epochs);
  if (c.train.max_steps > 0 && c.train.max_steps / plan_per_epoch < c.train.epochs) {
    total = std::min(total, at_plan_point(c.train.max_steps));
    planned_epochs = static_cast<double>(c.train.max_steps) / static_cast<double>(plan_per_epoch);
  }
  o.trainer = std::make_unique<Trainer>(c, comm, data.input(), data.classes(), total, per_epoch);
  o.recovery = std::make_unique<Recovery>(c, comm, *o.trainer, data,
                                          model_spec(c, 0, data.input(), data.classes()));
  if (c.train.stop_at > 0) {
    // At or after the last step it would never stop the run (the end checkpoints anyway).
    if (at_plan_point(c.train.stop_at) >= total)
      throw UsageError("train.stop_at = " + std::to_string(c.train.stop_at) +
                       " is not before the run's last step (" + std::to_string(total) +
                       " steps): it would never stop the run; set it lower or leave it at 0");
    o.recovery->plan_stop_at(at_plan_point(c.train.stop_at));
  }
  Group g{c, comm, data, *o.trainer, *o.recovery};
  g.threads = threads;
  g.ranks_on_node = comm.split_shared().size();
  g.per_epoch = per_epoch;
  g.total = total;
  g.epochs = (total + per_epoch - 1) / per_epoch;
  g.planned_epochs = planned_epochs;
  g.global_batch = c.train.batch * o.trainer->ranks();
  g.lead = comm.rank() == 0;
  if (c.train.virtual_ranks > 0) {
    o.held = std::make_unique<VirtualRanks>(c, *o.trainer, data, total, g.epochs);
    g.held = o.held.get();
  }
  if (g.lead && total < per_epoch * c.train.epochs && plan_per_epoch != per_epoch) {
    std::printf(
        "gossipgrad: train.max_steps %lld counts steps of the %d ranks the job was launched "
        "with: at %d ranks its %.4g planned epochs end after step %lld\n",
        static_cast<long long>(c.train.max_steps), job.failures.plan_ranks, comm.size(),
        planned_epochs, static_cast<long long>(total));
    std::fflush(stdout);
  }
  g.first = first_step(c, comm, g, job);
  if (c.apoptosis.enable && apoptosis_layers(c, g.trainer.graph()).empty())
    throw UsageError("apoptosis.layers = " + text_of(c.apoptosis.layers) + ": " + c.model.name +
                     " has no such layer whose units may be removed (units that reach a residual "
                     "add, a concat or the output stay)");
  return g;
}

// More compute threads on this node than it has cores: every step waits for the slowest thread.
void warn_if_oversubscribed(const Group& g) {
  const int ranks_here = g.ranks_on_node;
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (ranks_here * g.threads <= cores) return;
  std::printf(
      "gossipgrad: warning: %d ranks x %d threads on a node of %d cores: oversubscribed, "
      "expect much slower steps (lower train.threads, or run fewer ranks per node)\n",
      ranks_here, g.threads, cores);
}

// checkpoint.dir must hold at least one checkpoint of this run (every rank's state and the
// average model): found out now, not after the first epoch (rank 0 decides, every rank stops).
void check_checkpoint_space(const Group& g) {
  mpi::RankError error;
  if (g.lead && !g.c.checkpoint.dir.empty()) {
    const double p = static_cast<double>(g.trainer.graph().param_count());
    const double b = static_cast<double>(g.trainer.graph().buffer_count());
    const double need = (g.comm.size() * (3 * p + b) + p + b) * sizeof(float);
    struct statvfs fs = {};
    if (::statvfs(g.c.checkpoint.dir.c_str(), &fs) == 0) {
      const double free = static_cast<double>(fs.f_bavail) * static_cast<double>(fs.f_frsize);
      if (free < need)
        error = {"checkpoint.dir = " + g.c.checkpoint.dir + " has " +
                     std::to_string(static_cast<int64_t>(free / 1e6)) +
                     " MB free; one checkpoint of this run needs about " +
                     std::to_string(static_cast<int64_t>(need / 1e6) + 1) +
                     " MB: free some space or choose another folder",
                 true};
    }
  }
  throw_agreed(g.comm, error);
}

// log.metrics as this job writes it: for runs/latest/metrics.jsonl a fresh run folder, made by
// rank 0 once the run has really started (nothing is left behind by a refused start) and told to
// every rank (a survivor may take over the file); a run that continues from a checkpoint or its
// states appends to the file runs/latest leads to. Other paths as given. A collective.
std::string job_metrics_path(const Group& g, const JobState& job) {
  const std::string& given = g.c.log.metrics;
  if (!names_run_folder(given)) return given;
  mpi::RankError error;
  std::string path;
  if (g.lead) {
    try {
      std::error_code ec;
      const bool continuing = g.first > 0 || job.failures.real_failure;
      if (continuing && std::filesystem::exists(given, ec)) {
        path = std::filesystem::canonical(given).string();
      } else {
        std::string moved;
        path = start_run_folder(given, &moved);
        if (!moved.empty()) std::printf("gossipgrad: %s\n", moved.c_str());
      }
    } catch (const std::exception& e) {
      error = {e.what(), false};
    }
  }
  throw_agreed(g.comm, error);
  g.comm.broadcast(path, 0);
  return path;
}

// The start line's "mixing: ..." part.
std::string describe_mixing(const Group& g) {
  const Config& c = g.c;
  // Virtual ranks move nothing between processes: their exchanges are in memory.
  const std::string how = g.held ? std::string("in one process")
                          : c.gossip.hierarchy == Hierarchy::Node
                              ? "node average, then across nodes"
                              : text_of(c.gossip.transport);
  const std::string mixing =
      mixing_of(c).allreduce
          ? std::string(g.held ? "allreduce (summed in MPICH's order)" : "allreduce")
          : "gossip " + c.gossip.mode + " (" + text_of(c.gossip.schedule) +
                (c.gossip.rotate ? "+rotate" : "") + ", " + how + ")";
  return mixing;
}

// The start line's note on a state kept apart from the host (train.resident), else nothing.
std::string state_note(const Group& g) {
  const std::string where = g.trainer.state_where();
  if (g.c.train.resident)
    return ", state on the " + where + " (" + g.trainer.exchange_path() +
           "; each step reports the loss of the step before)";
  if (where == "host") return "";
  return ", state in a " + where;
}

// The metrics file (rank 0 of the job, or of the survivors once it failed) and the job's first
// lines: ranks, model, data, schedule.
void announce_start(Group& g, JobState& job) {
  const Config& c = g.c;
  if (!job.started) {
    job.metrics_path = job_metrics_path(g, job);
    if (g.lead)
      job.metrics = MetricsWriter(job.metrics_path, c.log.overwrite, !c.checkpoint.resume.empty());
  } else if (g.lead && !job.metrics.enabled()) {
    job.metrics = MetricsWriter(job.metrics_path, false, true);  // appends to the same file
  }
  if (emulated(c)) job.metrics.tag("emulated", true);
  if (g.held) job.metrics.tag("virtual", true);
  report_recovery(g, job);
  report_real_failure(g, job);
  if (!g.lead || job.started) return;
  const std::string mixing = describe_mixing(g);
  const int64_t params = g.trainer.graph().param_count();
  if (g.held)
    g.held->announce(g.threads);
  else
    std::printf("gossipgrad: %d ranks x %d threads, %s (%lld params), %s backend%s\n",
                g.comm.size(), g.threads, c.model.name.c_str(), static_cast<long long>(params),
                text_of(c.train.backend).c_str(), state_note(g).c_str());
  std::printf("gossipgrad: data: %s\n", g.data.describe().c_str());
  if (emulated(c))
    std::printf(
        "gossipgrad: EMULATED compute: forward %g ms, backward %g ms, update %g ms per step "
        "(jitter p99 x%g%s%s); %s gets its usual input, the data is only counted, no accuracy\n",
        c.emulate.forward_ms, c.emulate.backward_ms, c.emulate.update_ms, c.emulate.jitter_p99,
        c.emulate.slow.empty() ? "" : ", slow ", c.emulate.slow.c_str(), c.model.name.c_str());
  std::printf(
      "gossipgrad: %lld train / %lld test samples, global batch %lld, %lld steps/epoch, "
      "%lld epochs, peak lr %.4g, mixing: %s\n",
      static_cast<long long>(g.data.train_count()), static_cast<long long>(g.data.eval_count()),
      static_cast<long long>(g.global_batch), static_cast<long long>(g.per_epoch),
      static_cast<long long>(g.epochs), c.train.lr * g.global_batch / c.train.base_batch,
      mixing.c_str());
  const FailurePlan& f = job.failures.plan;
  if (!f.events.empty())
    std::printf("gossipgrad: %zu simulated failure(s) planned, recovery: %s\n", f.events.size(),
                text_of(f.strategy).c_str());
  warn_if_oversubscribed(g);
  std::fflush(stdout);
  nlohmann::json start = start_event(c, {.ranks = g.trainer.ranks(),
                                         .threads = g.threads,
                                         .params = params,
                                         .global_batch = g.global_batch,
                                         .steps = g.total,
                                         .first_step = g.first,
                                         .epochs_planned = g.planned_epochs,
                                         .faults_planned = static_cast<int64_t>(f.events.size()),
                                         .fault_strategy = f.strategy});
  if (g.held) g.held->add_to_start(start);
  job.metrics.write(start);
}

// One step: its batch, the hooks before it, forward/backward with the buckets exchanged as they
// complete, the wait for the partner, the update, and the step's share of the sample exchange.
// False when the data has no batch for step s. r.seconds is the time since `since` (the end of
// the previous step: its hooks, whose collectives may wait for slower ranks, count in this
// step's time, so that the times add up to the time the loop trained), less the evaluation and
// checkpoints in between (job.untimed_seconds); the clock moves to now.
struct StepClock {
  Clock::time_point since = Clock::now();  // the end of the previous step
  double untimed = 0;                      // job.untimed_seconds then
};

bool run_step(Group& g, StepHooks& hooks, int64_t s, shuffle::Batch& batch, StepRecord& r,
              StepClock& clock, JobState& job) {
  const double waited_before = g.data.wait_seconds();
  if (g.held) {
    // Virtual ranks: each rank's batch when its turn in the step comes.
    hooks.before_step(s, batch);
    r = StepRecord{};
    r.stats = g.trainer.step([&](int i) {
      g.held->between_turns(s, job.metrics);
      if (!g.data.next_of(i, batch))
        throw std::logic_error("virtual ranks: a rank's data ended before step " +
                               std::to_string(s));
      return StepInput{batch.x.data(), batch.y.data()};
    });
    r.stats.comm_seconds = 0;  // nothing moves between processes
    r.data_wait = g.data.wait_seconds() - waited_before;
  } else {
    {
      Timeline::Span span(g.trainer.timeline(), "data", "data");
      if (!g.data.next(s, batch)) return false;
    }
    hooks.before_step(s, batch);
    r = StepRecord{};
    r.data_wait = g.data.wait_seconds() - waited_before;
    r.stats = g.trainer.step(batch.x.data(), batch.y.data());
  }
  const auto t_shuffle = Clock::now();
  {
    Timeline::Span span(g.trainer.timeline(), "shuffle", "data");
    g.data.finish_step(s);
  }
  r.shuffle_wait = seconds_since(t_shuffle);
  r.step = s;
  r.epoch = batch.epoch;
  r.batch = &batch;
  r.last = s + 1 == g.total;
  r.epoch_end = (s + 1) % g.per_epoch == 0 || r.last;
  const auto now = Clock::now();
  r.seconds = std::chrono::duration<double>(now - clock.since).count() -
              (job.untimed_seconds - clock.untimed);
  clock = {now, job.untimed_seconds};
  return true;
}

// "final test top-1 X%", or, when the last steps went unevaluated, the step it was measured at.
std::string format_top1(const RunSummary& s) {
  char text[96];
  if (s.eval_step == s.steps)
    std::snprintf(text, sizeof text, "final test top-1 %.2f%%", 100 * s.final_top1);
  else
    std::snprintf(text, sizeof text, "test top-1 %.2f%% after step %lld (not evaluated since)",
                  100 * s.final_top1, static_cast<long long>(s.eval_step));
  return text;
}

// After the group's last step: the timeline, every rank's totals, and the summary on rank 0.
void finish_group(Group& g, JobState& job, Timeline& timeline) {
  const mpi::Activity doing("the end of training");
  RunSummary& summary = job.summary;
  summary.wall_seconds = seconds_since(job.t_start);
  if (timeline.enabled()) {
    g.trainer.set_timeline(nullptr);
    // Its folder is made, as log.metrics' and checkpoint.dir's are (preflight found it can be).
    if (const auto folder = std::filesystem::path(g.c.log.timeline).parent_path();
        g.lead && !folder.empty()) {
      std::error_code ec;
      std::filesystem::create_directories(folder, ec);
    }
    timeline.write(g.comm, g.c.log.timeline);
    if (g.lead) std::printf("gossipgrad: timeline written to %s\n", g.c.log.timeline.c_str());
  }
  // Every rank's corrupt files and shuffled samples (a collective: every rank gets here).
  int64_t data_totals[2] = {g.data.held_skipped(), g.data.shuffled_samples()};
  g.comm.allreduce_sum(data_totals, 2);
  summary.skipped_samples = data_totals[0];
  summary.images_per_second = job.train_seconds > 0 ? job.images / job.train_seconds : 0;
  if (!g.lead) return;
  const double comm_share = job.train_seconds > 0 ? job.comm_seconds / job.train_seconds : 0;
  // An accuracy only where one was measured: a run stopped before its first evaluation has none
  // (issue 31: it said "final test top-1 0.00%").
  const bool evaluated = summary.eval_step >= 0 && !emulated(g.c);
  std::string final_eval = "not evaluated (no evaluation data)";
  if (emulated(g.c))
    final_eval = "emulated compute: no accuracy";
  else if (evaluated)
    final_eval = format_top1(summary);
  else if (g.data.eval_source())
    final_eval = "not evaluated: no epoch ended in this run";
  nlohmann::json event = summary_event({.steps = summary.steps,
                                        .per_epoch = g.per_epoch,
                                        .eval_step = evaluated ? summary.eval_step : -1,
                                        .epochs_planned = g.planned_epochs,
                                        .top1 = summary.final_top1,
                                        .top5 = summary.final_top5,
                                        .wall_s = summary.wall_seconds,
                                        .images_per_s = summary.images_per_second,
                                        .comm_s = job.comm_seconds,
                                        .train_s = job.train_seconds,
                                        .data_wait_s = g.data.wait_seconds(),
                                        .params = g.trainer.graph().param_count(),
                                        .skipped = data_totals[0],
                                        .shuffled = data_totals[1],
                                        .consensus_averages = g.trainer.consensus_averages(),
                                        .faults = static_cast<int64_t>(job.failures.plan.next),
                                        .ranks = g.trainer.ranks()});
  if (g.held)  // its line and fields, from one reading of the memory and lateness
    std::printf("%s\n", g.held->summarise(summary, final_eval, job.metrics_path, event).c_str());
  else
    std::printf(
        "done: %lld steps in %s, %.0f img/s, exposed communication %.1f%% of step time, %s "
        "(metrics: %s)\n",
        static_cast<long long>(summary.steps), format_duration(summary.wall_seconds).c_str(),
        summary.images_per_second, 100 * comm_share, final_eval.c_str(), job.metrics_path.c_str());
  job.metrics.write(event);
}

// A run resumed from the checkpoint of its last step: the restored model is evaluated, not
// reported as 0%.
Ending nothing_to_do(Group& g, JobState& job) {
  job.summary.steps = g.first;
  if (g.lead) {
    std::printf("gossipgrad: resumed at step %lld of %lld: nothing left to train%s\n",
                static_cast<long long>(g.first), static_cast<long long>(g.total),
                g.data.eval_source() ? "; evaluating the restored model" : "");
    std::fflush(stdout);
  }
  if (g.data.eval_source()) {
    const mpi::Activity doing("evaluation of the restored model");
    const EvalStats e = g.trainer.evaluate(*g.data.eval_source(), g.data.eval_options());
    job.summary.final_top1 = e.top1;
    job.summary.final_top5 = e.top5;
    job.summary.eval_step = g.first;
    if (g.lead)
      job.metrics.write(
          eval_event(g.epochs, g.first, e, g.comm.size(), seconds_since(job.t_start)));
  }
  Timeline none;
  finish_group(g, job, none);
  return Ending::Done;
}

// Training over the group of ranks in `comm`, until the end or a failure the group cannot absorb.
Ending train_group(const Config& c, const mpi::Comm& comm, JobState& job, GroupObjects& o) {
  const mpi::Activity doing("start-up: data, model, checkpoint");
  Group g = open_group(c, comm, job, o);
  check_checkpoint_space(g);
  announce_start(g, job);
  comm.barrier();  // the ranks' timelines start together
  // A timeline spans one group of ranks: with failures planned there may be several, so none.
  const bool failures = !job.failures.plan.events.empty();
  Timeline timeline(!c.log.timeline.empty() && !failures);
  if (g.lead && !c.log.timeline.empty() && failures && !job.started)
    std::printf("gossipgrad: log.timeline is not written in a run with simulated failures\n");
  job.started = true;
  g.trainer.set_timeline(&timeline);
  if (g.first >= g.total) return nothing_to_do(g, job);
  StepHooks hooks = make_step_hooks(g, job);
  g.data.start(g.epochs, g.first);
  // The state before the group's first step.
  if (job.failures.emergency) keep_emergency_state(g, *job.failures.emergency);
  job.summary.steps = g.first;
  shuffle::Batch batch;
  StepRecord r;
  StepClock clock{Clock::now(), job.untimed_seconds};
  for (int64_t s = g.first; s < g.total; ++s) {
    const mpi::Activity doing("step " + std::to_string(s));  // named if a wait times out
    if (auto end = fail_at_boundary(g, job, s)) return *end;
    if (s == g.first + c.log.timeline_steps) g.trainer.set_timeline(nullptr);  // enough recorded
    if (!run_step(g, hooks, s, batch, r, clock, job)) break;
    hooks.after_step(r);
    job.summary.steps = s + 1;
    if (hooks.stop()) break;
  }
  hooks.finish();
  finish_group(g, job, timeline);
  return Ending::Done;
}

// A rank that failed (simulated) waits until the survivors are done, then frees the windows of
// the groups it was in, with them.
RunSummary wait_as_failed(JobState& job) {
  job.metrics = MetricsWriter();
  const std::string error = wait_for_wake(job.world, [] {
    if (const int sig = StopSignals::requested())  // the survivors stop too, without waking it
      throw StopRequested(sig, std::string("stopped by ") + signal_name(sig));
  });
  // The survivors ended on a usage error: this rank ends with it (and, as rank 0, prints it).
  if (!error.empty()) {
    job.world.mark_peer_lost();
    throw UsageError(error);
  }
  job.failures.parked.clear();
  RunSummary gone;
  gone.steps = job.summary.steps;
  return gone;
}

[[noreturn]] void abort_job(const mpi::Comm& world, const char* what) {
  // A peer died and this rank's state is being saved: aborting would kill every survivor.
  if (EmergencyState::handling()) EmergencyState::park();
  std::fprintf(stderr, "gossipgrad: rank %d: error: %s\n", world.rank(), what);
  std::fflush(stderr);
  std::fflush(stdout);
  // mpirun drops output still in flight when the abort tears the job down: give it a moment.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  mpi::abort_job(1);
}

// Rank 0 locks checkpoint.dir for the run (issue: two runs in one folder); every rank learns
// whether it could.
std::unique_ptr<RunLock> lock_checkpoint_dir(const Config& c, const mpi::Comm& world) {
  std::unique_ptr<RunLock> lock;
  mpi::RankError error;
  if (world.rank() == 0 && !c.checkpoint.dir.empty()) {
    try {
      lock = std::make_unique<RunLock>(c.checkpoint.dir);
    } catch (const UsageError& e) {
      error = {e.what(), true};
    } catch (const std::exception& e) {
      error = {e.what(), false};
    }
  }
  throw_agreed(world, error);
  return lock;
}

// log.samples, log.losses: PATH.<rank> (nullptr when PATH is empty). A resumed run goes on with
// the file of the run it continues.
std::unique_ptr<std::ofstream> open_rank_log(const Config& c, const std::string& key,
                                             const std::string& path, int rank) {
  if (path.empty()) return nullptr;
  const std::string file = rank_log_path(path, rank);
  const auto mode = c.checkpoint.resume.empty() ? std::ios::trunc : std::ios::app;
  auto out = std::make_unique<std::ofstream>(file, mode);
  if (!*out) throw std::runtime_error(key + ": cannot write " + file);
  return out;
}

// The job's state before its first group: the clock, log.samples, the first config, and the
// survivors' states of a real failure when this is the supervisor's relaunch.
void start_job(const Config& c, const mpi::Comm& world, JobState& job) {
  job.t_start = Clock::now();
  job.samples = open_rank_log(c, "log.samples", c.log.samples, world.rank());
  // Virtual ranks: every rank's file, written by VirtualRanks.
  if (c.train.virtual_ranks == 0)
    job.losses = open_rank_log(c, "log.losses", c.log.losses, world.rank());
  else
    job.failures.plan_ranks = c.train.virtual_ranks;  // train.max_steps counts their steps
  job.configs.push_back(c);
  take_survivor_states(c, world, job);  // a relaunch of the survivors of a real failure
}

// train_group, and where it throws, the end every rank agrees on (a usage error, a stop) or this
// rank's own: an emergency save under supervise, else an abort of the job with this rank's line.
Ending train_group_or_end(const Config& c, const mpi::Comm& comm, JobState& job,
                          GroupObjects& objects) {
  try {
    return train_group(c, comm, job, objects);
  } catch (const UsageError& e) {  // every rank has it (agreed, or from the config alike)
    // Unwinding must not wait to free windows with a rank that left: the job is ending anyway.
    // The ranks that left wait for the survivors' end: they end with this error too.
    if (!job.failures.parked.empty()) {
      job.world.mark_peer_lost();
      wake_failed(job.world, comm, job.failures, e.what());
    }
    throw;
  } catch (const StopRequested&) {  // every rank stopped at the same step boundary
    if (!job.failures.parked.empty()) job.world.mark_peer_lost();
    throw;
  } catch (const std::exception& e) {
    // A partner timed out under supervise: a peer died without a notice (a lost link). This
    // rank saves its state and leaves the relaunch to the supervisor.
    if (job.failures.emergency && job.world.peer_lost()) job.failures.emergency->save_and_wait();
    // Maybe this rank's alone (a full disk, a failed read): unwinding would wait in collective
    // teardown for ranks that went on, so the job ends here, with this rank's line.
    if (job.world.size() > 1) abort_job(job.world, e.what());
    throw;
  }
}

// After a group ended in a failure (restart or shrink): the next group's config, and its
// communicator (the survivors' after a shrink).
const mpi::Comm* next_group(const Config& c, const mpi::Comm* comm, JobState& job, Ending end,
                            std::unique_ptr<GroupObjects> objects) {
  JobFailures& f = job.failures;
  Config next = without_test_hooks(c);
  if (end == Ending::Restart) {
    // Every rank is alive (the failed ones replaced): the objects go collectively, and a new
    // set reloads the newest full checkpoint of this job, or starts afresh without one.
    f.wrote_checkpoint |= objects->recovery->wrote_checkpoint();
    next.checkpoint.resume = f.wrote_checkpoint ? "auto" : c.checkpoint.resume;
    objects.reset();
  } else {  // Shrink
    f.parked.push_back(std::move(objects));
    f.comms.push_back(survivors_comm(*comm, f));
    comm = f.comms.back().get();
    next.checkpoint.resume.clear();
  }
  job.configs.push_back(next);
  return comm;
}

}  // namespace

RunSummary run_training(const Config& c, const mpi::Comm& world) {
  // SIGTERM, SIGINT: stop at a step boundary (step_hooks.cpp), or give up after the grace period
  // (virtual ranks stop between two ranks' turns: a turn, one forward and backward, is far
  // shorter than theirs).
  StopSignals stop_signals(c.train.virtual_ranks > 0 ? 600
                                                     : std::max(60.0, 2 * c.gossip.timeout_s));
  // Every wait on other ranks is bounded by gossip.timeout_s (comm/wait_watch.hpp).
  const mpi::WaitWatchdog watchdog(c.gossip.timeout_s, "gossip.timeout_s");
  const std::unique_ptr<RunLock> lock = lock_checkpoint_dir(c, world);
  JobState job(world);
  job.stop_signals = &stop_signals;
  // Under gossipgrad supervise: a real failure's notice saves this rank's state (emergency.hpp).
  const char* supervised = std::getenv(kEmergencyDirEnv);
  if (c.train.virtual_ranks > 0 && supervised && *supervised)
    throw UsageError(
        "train.virtual_ranks: gossipgrad supervise relaunches real ranks that fail; "
        "virtual ranks share one process and save no state: run them without "
        "supervise");
  const std::unique_ptr<EmergencyState> emergency =
      EmergencyState::from_environment(world.rank(), world.size());
  job.failures.emergency = emergency.get();
  start_job(c, world, job);
  const mpi::Comm* comm = &world;
  for (;;) {
    auto objects = std::make_unique<GroupObjects>();
    const Ending end = train_group_or_end(job.configs.back(), *comm, job, *objects);
    if (end == Ending::Done) break;
    if (end == Ending::Left) {
      job.failures.parked.push_back(std::move(objects));
      return wait_as_failed(job);
    }
    comm = next_group(c, comm, job, end, std::move(objects));
  }
  // The last group's objects went with the loop (over the survivors' communicator: a collective
  // among them). The failed ranks wait for the end of training; then the windows of the earlier
  // groups are freed, oldest first, on every rank that was in them.
  wake_failed(world, *comm, job.failures);
  job.failures.parked.clear();
  return job.summary;
}

}  // namespace gg::gossip
