// Every blocking wait on other ranks is bounded. Gossip transports time out on their own
// (PartnerTimeout); the blocking collectives and requests of this layer (barrier, allreduce,
// broadcast, gather, Request::wait) register here while they wait, and a watchdog thread ends a
// job whose wait outlasts the limit: one line naming this rank, the call and what the thread was
// doing (its Activity), then MPI_Abort. A blocking MPI call cannot be interrupted, and its
// nonblocking twin may be slower (the allreduce baseline must stay MPICH's own).
#pragma once

#include <atomic>
#include <string>
#include <thread>

namespace gg::mpi {

// Watches the waits of this process while it lives (one at a time); `limit_s` 0: none.
// `what_to_raise` names the setting that gives the limit, for the message.
class WaitWatchdog {
 public:
  WaitWatchdog(double limit_s, std::string what_to_raise);
  ~WaitWatchdog();
  WaitWatchdog(const WaitWatchdog&) = delete;
  WaitWatchdog& operator=(const WaitWatchdog&) = delete;

 private:
  void watch();
  double limit_s_;
  std::string setting_;
  std::atomic<bool> done_{false};
  std::thread thread_;
};

// A blocking wait on other ranks in `call` ("MPI_Allreduce"), watched while it lives.
class WatchedWait {
 public:
  explicit WatchedWait(const char* call);
  ~WatchedWait();
  WatchedWait(const WatchedWait&) = delete;
  WatchedWait& operator=(const WatchedWait&) = delete;

 private:
  long id_ = -1;
};

// What the calling thread is doing ("step 120", "evaluation after step 120"), for the line a
// timeout prints; the previous activity comes back when it ends.
class Activity {
 public:
  explicit Activity(std::string what);
  ~Activity();
  Activity(const Activity&) = delete;
  Activity& operator=(const Activity&) = delete;

 private:
  std::string previous_;
};

// Replaces the MPI_Abort that ends a job whose wait outlasted the limit (after its line): a
// function that does not return (a supervised rank saves its state and waits:
// gossip/resilience/emergency.hpp). Null: MPI_Abort.
using WaitTimeoutHandler = void (*)();
void set_wait_timeout_handler(WaitTimeoutHandler handler);

}  // namespace gg::mpi
