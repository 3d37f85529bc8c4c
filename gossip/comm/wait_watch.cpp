#include "gossip/comm/wait_watch.hpp"

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <mutex>

namespace gg::mpi {
namespace {

using Clock = std::chrono::steady_clock;

struct Wait {
  Clock::time_point since;
  const char* call;
  std::string activity;
};

std::mutex g_mu;
std::map<long, Wait> g_waits;  // the waits in progress, by id
long g_next_id = 0;
std::atomic<bool> g_watching{false};
thread_local std::string t_activity;
std::atomic<WaitTimeoutHandler> g_timeout_handler{nullptr};

}  // namespace

void set_wait_timeout_handler(WaitTimeoutHandler handler) { g_timeout_handler = handler; }

WaitWatchdog::WaitWatchdog(double limit_s, std::string what_to_raise)
    : limit_s_(limit_s), setting_(std::move(what_to_raise)) {
  if (limit_s_ <= 0) return;
  g_watching = true;
  thread_ = std::thread([this] { watch(); });
}

WaitWatchdog::~WaitWatchdog() {
  if (!thread_.joinable()) return;
  done_ = true;
  thread_.join();
  g_watching = false;
  std::lock_guard lock(g_mu);
  g_waits.clear();
}

void WaitWatchdog::watch() {
  const auto limit = std::chrono::duration<double>(limit_s_);
  while (!done_) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::unique_lock lock(g_mu);
    for (const auto& [id, w] : g_waits) {
      if (Clock::now() - w.since < limit) continue;
      int rank = -1;
      MPI_Comm_rank(MPI_COMM_WORLD, &rank);
      std::fprintf(stderr,
                   "gossipgrad: rank %d waited more than %g s for the other ranks in %s%s%s%s: "
                   "a rank died or hangs (raise %s if it is only slow); stopping the job\n",
                   rank, limit_s_, w.call, w.activity.empty() ? "" : " (", w.activity.c_str(),
                   w.activity.empty() ? "" : ")", setting_.c_str());
      std::fflush(stderr);
      std::fflush(stdout);
      lock.unlock();
      if (const WaitTimeoutHandler handler = g_timeout_handler.load()) handler();
      std::this_thread::sleep_for(std::chrono::milliseconds(300));  // let mpirun pass it on
      MPI_Abort(MPI_COMM_WORLD, 1);
      return;
    }
  }
}

WatchedWait::WatchedWait(const char* call) {
  if (!g_watching) return;
  std::lock_guard lock(g_mu);
  id_ = g_next_id++;
  g_waits[id_] = {Clock::now(), call, t_activity};
}

WatchedWait::~WatchedWait() {
  if (id_ < 0) return;
  std::lock_guard lock(g_mu);
  g_waits.erase(id_);
}

Activity::Activity(std::string what) : previous_(std::move(t_activity)) {
  t_activity = std::move(what);
}

Activity::~Activity() { t_activity = std::move(previous_); }

}  // namespace gg::mpi
