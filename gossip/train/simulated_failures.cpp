#include "gossip/train/simulated_failures.hpp"

#include <algorithm>
#include <cstdio>
#include <string>

#include "gossip/comm/wait_watch.hpp"

namespace gg::gossip {
namespace {

constexpr int kStateTag = 0x5254;  // rollback: a donor's state to a failed rank's replacement

bool contains(const std::vector<int>& v, int x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

void write_fault_events(JobState& job, const mpi::Comm& comm, int64_t steps_redone) {
  if (!job.pending || comm.rank() != 0) return;
  const double seconds = seconds_since(job.pending->t0);
  for (int r : job.pending->ranks)
    job.metrics.write({{"event", "fault"},
                       {"step", job.pending->step},
                       {"rank", r},
                       {"strategy", to_string(job.failures.strategy)},
                       {"recovery_s", seconds},
                       {"steps_redone", steps_redone},
                       {"ranks_after", comm.size()}});
}

// Rollback: each failed rank's replacement receives the state of the next live rank after it
// (one point-to-point message); every other rank keeps its own. Returns the state to rewind to.
RankState replace_failed(const mpi::Comm& comm, const std::vector<int>& failed, RankState own) {
  const int p = comm.size(), me = comm.rank();
  auto donor_of = [&](int v) {
    int d = (v + 1) % p;
    while (contains(failed, d)) d = (d + 1) % p;
    return d;
  };
  if (contains(failed, me)) {
    // This rank's state is lost: nothing of it survives into what it trains next.
    own = RankState{};
    MPI_Status st;
    const mpi::WatchedWait wait("MPI_Probe");
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

class RollbackHook : public StepHook {
 public:
  RollbackHook(Group& g, JobState& job) : g_(g), job_(job) {}

  void before_step(int64_t s, shuffle::Batch&) override {
    failed_ = job_.failures.due(s);
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
    for (int rank : failed_) in_group.push_back(job_.group_rank_of(rank));
    g_.trainer.rewind(replace_failed(g_.comm, in_group, std::move(before_)));
    r.stats = g_.trainer.step(r.batch->x.data(), r.batch->y.data());
    r.runs = 2;
    job_.pending = PendingFault{r.step, failed_, t_fail};
    write_fault_events(job_, g_.comm, 1);
    job_.pending.reset();
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

}  // namespace

std::vector<int> FailurePlan::due(int64_t s) {
  std::vector<int> ranks;
  while (next < events.size() && events[next].step <= s) ranks.push_back(events[next++].rank);
  return ranks;
}

int JobState::group_rank_of(int original) const {
  const auto it = std::find(members.begin(), members.end(), original);
  return it == members.end() ? -1 : static_cast<int>(it - members.begin());
}

void plan_failures(const Config& c, JobState& job, int ranks, int64_t total) {
  if (job.failures.planned) return;
  job.failures.strategy = parse_fault_strategy(c.fault.strategy);
  job.failures.events = make_fault_plan(c, ranks, total);
  job.failures.planned = true;
}

std::optional<Ending> fail_at_boundary(Group& g, JobState& job, int64_t s) {
  if (job.failures.strategy == FaultStrategy::Rollback) return std::nullopt;
  const std::vector<int> failed = job.failures.due(s);
  if (failed.empty()) return std::nullopt;
  // At the boundary before step s the last step's messages are complete on every rank (a
  // pending overlapped weight exchange settles in capture_state), so no one waits on a rank that
  // leaves.
  const auto t0 = Clock::now();
  RankState own;
  g.trainer.capture_state(own);
  job.pending = PendingFault{s, failed, t0};
  if (job.failures.strategy == FaultStrategy::Restart) return Ending::Restart;
  const int me = job.world.rank();
  if (job.group_rank_of(me) >= 0 && contains(failed, me)) {
    std::printf("gossipgrad: rank %d: simulated failure before step %lld: leaving the job\n", me,
                static_cast<long long>(s));
    std::fflush(stdout);
    return Ending::Left;
  }
  job.carry = std::move(own);
  job.carry_step = s;
  job.carry_per_epoch = g.per_epoch;
  return Ending::Shrink;
}

std::unique_ptr<StepHook> make_rollback_hook(Group& g, JobState& job) {
  if (job.failures.strategy != FaultStrategy::Rollback) return nullptr;
  return std::make_unique<RollbackHook>(g, job);
}

void report_recovery(Group& g, JobState& job) {
  if (!job.pending) return;
  const PendingFault& f = *job.pending;
  const bool forward = job.failures.strategy == FaultStrategy::Forward;
  const int64_t redone = job.failures.strategy == FaultStrategy::Restart ? f.step - g.first : 0;
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
  job.pending.reset();
}

std::unique_ptr<mpi::Comm> survivors_comm(const mpi::Comm& comm, JobState& job) {
  const std::vector<int>& failed = job.pending->ranks;
  std::vector<int> excluded;
  for (int r : failed) excluded.push_back(job.group_rank_of(r));
  MPI_Group all = MPI_GROUP_NULL, kept = MPI_GROUP_NULL;
  GG_MPI_CHECK(MPI_Comm_group(comm.get(), &all));
  GG_MPI_CHECK(MPI_Group_excl(all, static_cast<int>(excluded.size()), excluded.data(), &kept));
  MPI_Comm next = MPI_COMM_NULL;
  const int rc = MPI_Comm_create_group(comm.get(), kept, 0x4757, &next);
  MPI_Group_free(&kept);
  MPI_Group_free(&all);
  GG_MPI_CHECK(rc);
  std::vector<int> members;
  for (int r : job.members)
    if (!contains(failed, r)) members.push_back(r);
  job.members = std::move(members);
  return std::make_unique<mpi::Comm>(mpi::Comm::adopt(next));
}

Config without_test_hooks(const Config& c) {
  Config next = c;
  next.fault.kill.clear();
  next.fault.stall.clear();
  next.fault.nan = -1;
  next.fault.nan_stats = -1;
  return next;
}

}  // namespace gg::gossip
