// Groups of ranks (gossip/resilience/groups.hpp): a failure at a step boundary, the survivors'
// communicator, and the wake message that ends a failed rank's wait.
#include "gossip/resilience/groups.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

namespace gg::gossip {
namespace {

constexpr int kWakeTag = 0x5755;       // the end of training, to the failed ranks
constexpr int kSurvivorsTag = 0x4757;  // the survivors' new communicator

bool contains(const std::vector<int>& v, int x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

}  // namespace

JobFailures::JobFailures(int ranks) : plan_ranks(ranks) {
  for (int r = 0; r < ranks; ++r) members.push_back(r);
  if (const char* launched = std::getenv(kPlanRanksEnv)) {  // a relaunch by the supervisor
    const int n = std::atoi(launched);
    if (n >= 1 && n <= (1 << 24)) plan_ranks = n;
  }
}

int JobFailures::group_rank_of(int original) const {
  const auto it = std::find(members.begin(), members.end(), original);
  return it == members.end() ? -1 : static_cast<int>(it - members.begin());
}

std::optional<Ending> fail_at_boundary(JobFailures& f, int64_t s, int me, int64_t per_epoch,
                                       const std::function<void(RankState&)>& capture) {
  if (f.plan.strategy == FaultStrategy::Rollback) return std::nullopt;
  const std::vector<int> failed = f.plan.due(s);
  if (failed.empty()) return std::nullopt;
  // At the boundary before step s the last step's messages are complete on every rank (a
  // pending overlapped weight exchange settles in the capture), so no one waits on a rank that
  // leaves.
  const auto t0 = std::chrono::steady_clock::now();
  RankState own;
  capture(own);
  f.pending = PendingFault{s, failed, t0};
  if (f.plan.strategy == FaultStrategy::Restart) return Ending::Restart;
  if (f.group_rank_of(me) >= 0 && contains(failed, me)) {
    std::printf("gossipgrad: rank %d: simulated failure before step %lld: leaving the job\n", me,
                static_cast<long long>(s));
    std::fflush(stdout);
    return Ending::Left;
  }
  f.carry = std::move(own);
  f.carry_step = s;
  f.carry_per_epoch = per_epoch;
  return Ending::Shrink;
}

std::unique_ptr<mpi::Comm> survivors_comm(const mpi::Comm& comm, JobFailures& f) {
  const std::vector<int>& failed = f.pending->ranks;
  std::vector<int> excluded;
  for (int r : failed) excluded.push_back(f.group_rank_of(r));
  auto next = std::make_unique<mpi::Comm>(comm.without(excluded, kSurvivorsTag));
  std::vector<int> members;
  for (int r : f.members)
    if (!contains(failed, r)) members.push_back(r);
  f.members = std::move(members);
  return next;
}

void wake_failed(const mpi::Comm& world, const mpi::Comm& comm, const JobFailures& f,
                 const std::string& error) {
  if (comm.rank() != 0) return;
  const std::vector<uint8_t> text(error.begin(), error.end());
  for (int r = 0; r < world.size(); ++r)
    if (f.group_rank_of(r) < 0) world.send_bytes(text, r, kWakeTag);
}

std::string wait_for_wake(const mpi::Comm& world, const std::function<void()>& poll) {
  for (;;) {
    if (const auto text = world.try_recv_bytes(kWakeTag))
      return std::string(text->begin(), text->end());
    poll();  // a stop signal: no wake comes for a rank that stops
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace gg::gossip
