// The train side of the failures (gossip/train/fault_hooks.hpp).
#include "gossip/train/fault_hooks.hpp"

#include <chrono>
#include <cstdio>
#include <string>

namespace gg::gossip {
namespace {

void write_fault_events(JobState& job, const mpi::Comm& comm, int64_t steps_redone) {
  const std::optional<PendingFault>& pending = job.failures.pending;
  if (!pending || comm.rank() != 0) return;
  const double seconds = seconds_since(pending->t0);
  for (int r : pending->ranks)
    job.metrics.write({{"event", "fault"},
                       {"step", pending->step},
                       {"rank", r},
                       {"strategy", text_of(job.failures.plan.strategy)},
                       {"recovery_s", seconds},
                       {"steps_redone", steps_redone},
                       {"ranks_after", comm.size()}});
}

class RollbackHook : public StepHook {
 public:
  RollbackHook(Group& g, JobState& job) : g_(g), job_(job) {}

  void before_step(int64_t s, shuffle::Batch&) override {
    failed_ = job_.failures.plan.due(s);
    if (failed_.empty()) return;
    g_.trainer.capture_state(before_);  // the state the interrupted step started from
    before_.rank = g_.comm.rank();
    before_.ranks = g_.comm.size();
    before_.steps_per_epoch = g_.per_epoch;
  }

  // The failed ranks lost step s and their state; each replacement takes a live rank's state
  // from before the step, and every rank redoes the step from there.
  void after_step(StepRecord& r) override {
    if (failed_.empty()) return;
    const auto t_fail = Clock::now();
    std::vector<int> in_group;
    for (int rank : failed_) in_group.push_back(job_.failures.group_rank_of(rank));
    g_.trainer.rewind(replace_failed(g_.comm, in_group, std::move(before_)));
    g_.trainer.forget_peers(in_group);
    r.stats = g_.trainer.step(r.batch->x.data(), r.batch->y.data());
    r.runs = 2;
    job_.failures.pending = PendingFault{r.step, failed_, t_fail};
    write_fault_events(job_, g_.comm, 1);
    job_.failures.pending.reset();
    if (g_.lead && g_.c.log.progress) {
      std::printf("gossipgrad: %zu rank(s) failed in step %lld: replaced, step redone (%.2f s)\n",
                  failed_.size(), static_cast<long long>(r.step), seconds_since(t_fail));
      std::fflush(stdout);
    }
    failed_.clear();
  }

 private:
  Group& g_;
  JobState& job_;
  std::vector<int> failed_;  // due at this step (original ranks)
  RankState before_;
};

class KeepAtBoundary : public StepHook {
 public:
  KeepAtBoundary(Group& g, EmergencyState& e) : g_(g), e_(e) {}
  void before_step(int64_t, shuffle::Batch&) override {
    if (EmergencyState::handling()) EmergencyState::park();
  }
  void after_step(StepRecord&) override { keep_emergency_state(g_, e_); }

 private:
  Group& g_;
  EmergencyState& e_;
};

}  // namespace

void keep_emergency_state(Group& g, EmergencyState& e) {
  e.keep([&](RankState& s) {
    g.trainer.capture_state(s);  // may wait for a pending weight exchange
    s.steps_per_epoch = g.per_epoch;
    s.nan_restores = g.recovery.guard().restores();
  });
}

std::unique_ptr<StepHook> make_emergency_hook(Group& g, EmergencyState& e) {
  return std::make_unique<KeepAtBoundary>(g, e);
}

void take_survivor_states(const Config& c, const mpi::Comm& world, JobState& job) {
  std::optional<SurvivorState> taken =
      take_emergency_states(world, [&](int ranks) { return gossip_schedule(c, ranks); });
  if (!taken) return;
  JobFailures& f = job.failures;
  f.carry_per_epoch = taken->state.steps_per_epoch;
  f.carry_step = taken->plan.step;
  f.carry = std::move(taken->state);
  f.real_failure = taken->plan;
}

void plan_failures(const Config& c, JobState& job, int ranks, int64_t total) {
  plan_failures(c, job.failures.plan, ranks, total);
}

std::optional<Ending> fail_at_boundary(Group& g, JobState& job, int64_t s) {
  return fail_at_boundary(job.failures, s, job.world.rank(), g.per_epoch,
                          [&](RankState& own) { g.trainer.capture_state(own); });
}

std::unique_ptr<StepHook> make_rollback_hook(Group& g, JobState& job) {
  if (job.failures.plan.strategy != FaultStrategy::Rollback) return nullptr;
  return std::make_unique<RollbackHook>(g, job);
}

void report_recovery(Group& g, JobState& job) {
  if (!job.failures.pending) return;
  const PendingFault& f = *job.failures.pending;
  const FaultStrategy strategy = job.failures.plan.strategy;
  const bool forward = strategy == FaultStrategy::Forward;
  const int64_t redone = strategy == FaultStrategy::Restart ? f.step - g.first : 0;
  write_fault_events(job, g.comm, redone);
  if (g.lead) {
    std::string who;
    for (int r : f.ranks) who += (who.empty() ? "" : ", ") + std::to_string(r);
    if (forward)
      std::printf(
          "gossipgrad: rank %s failed before step %lld: %d survivors carry on at step %lld of "
          "%lld (samples reassigned, recovery %.2f s)\n",
          who.c_str(), static_cast<long long>(f.step), g.comm.size(),
          static_cast<long long>(g.first), static_cast<long long>(g.total), seconds_since(f.t0));
    else
      std::printf(
          "gossipgrad: rank %s failed before step %lld: every rank restarted from step %lld "
          "(%lld steps redone, recovery %.2f s)\n",
          who.c_str(), static_cast<long long>(f.step), static_cast<long long>(g.first),
          static_cast<long long>(redone), seconds_since(f.t0));
    std::fflush(stdout);
  }
  job.failures.pending.reset();
}

void report_real_failure(Group& g, JobState& job) {
  if (!job.failures.real_failure) return;
  const RecoveryPlan& p = *job.failures.real_failure;
  const double now_unix =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  if (g.lead) {
    std::string who;
    for (int r : p.lost) who += (who.empty() ? "" : ", ") + std::to_string(r);
    const std::string what = p.lost.empty()
                                 ? "every rank's state was saved (rank " +
                                       std::to_string(p.first_gone) + "'s process ended first)"
                                 : "rank(s) " + who + " lost";
    std::printf(
        "gossipgrad: a real failure in step %lld of %d ranks: %s; %d ranks carry on from their "
        "emergency states at step %lld of %lld (%s, %lld step(s) redone, %.1f s after the "
        "failure)\n",
        static_cast<long long>(p.step), p.ranks_before, what.c_str(), g.comm.size(),
        static_cast<long long>(g.first), static_cast<long long>(g.total), p.strategy(),
        static_cast<long long>(p.steps_redone), now_unix - p.failed_unix);
    std::fflush(stdout);
    std::vector<int> ranks = p.lost;
    if (ranks.empty()) ranks.push_back(p.first_gone);
    for (int r : ranks)
      job.metrics.write({{"event", "fault"},
                         {"real", true},
                         {"step", p.step},
                         {"rank", r},
                         {"strategy", p.strategy()},
                         {"steps_redone", p.steps_redone},
                         {"ranks_before", p.ranks_before},
                         {"ranks_after", g.comm.size()},
                         {"first_step", g.first},
                         {"recovery_s", now_unix - p.failed_unix},
                         {"t_unix", now_unix}});
  }
  job.failures.real_failure.reset();
}

}  // namespace gg::gossip
