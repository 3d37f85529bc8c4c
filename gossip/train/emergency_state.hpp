// Real failures under `gossipgrad supervise` (gossip/resilience/emergency.hpp): this rank keeps its
// state of the last completed step boundary in memory, and when a peer dies it writes that state
// and exits with kEmergencyExit, without another MPI call. A peer's death is learned from the
// launcher's SIGUSR1 (hydra under -disable-auto-cleanup; the handler only sets a flag and posts a
// semaphore, and a watcher thread does the rest, so a main thread blocked in MPI does not matter)
// or from a partner timeout (gossip.timeout_s). Only active where GG_EMERGENCY_DIR is set.
#pragma once

#include <semaphore.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "gossip/resilience/rank_state.hpp"
#include "gossip/train/hooks.hpp"
#include "gossip/train/job.hpp"

namespace gg::gossip {

class EmergencyState {
 public:
  // nullptr unless GG_EMERGENCY_DIR is set; else the SIGUSR1 handler and watcher are installed
  // for its lifetime. `rank`, `ranks`: this process in the job (the file's name and fields).
  static std::unique_ptr<EmergencyState> from_environment(int rank, int ranks);
  EmergencyState(std::string folder, int rank, int ranks);
  ~EmergencyState();
  EmergencyState(const EmergencyState&) = delete;
  EmergencyState& operator=(const EmergencyState&) = delete;

  // At a step boundary (every step done, hooks included): this state becomes the one to save.
  // The capture may wait in MPI (a pending overlapped weight exchange settles), the swap does not.
  void keep(Group& g);
  // Saves the kept state and ends the process with kEmergencyExit; `why` goes into its line.
  [[noreturn]] void save_and_exit(const std::string& why);
  // A peer's death is being handled: nothing else may end the process (MPI_Abort would kill the
  // survivors before their states are on disk), nor call MPI.
  static bool handling();
  // Parks the calling thread until save_and_exit ends the process.
  [[noreturn]] static void park();

 private:
  void watch();
  std::string folder_;
  int rank_, ranks_;
  std::mutex mu_;  // guards kept_ (the watcher writes it while the main thread goes on)
  RankState kept_, scratch_;
  bool have_kept_ = false;
  std::atomic<bool> done_{false};
  std::thread watcher_;
};

// The hook that keeps the state after every step (the last hook: after the step's agreements).
std::unique_ptr<StepHook> make_emergency_hook(Group& g, EmergencyState& e);

// A relaunch by the supervisor (GG_EMERGENCY_FROM): this rank's survivor state into job.carry,
// at the plan's step. Every rank agrees; when any state is missing, corrupt or does not fit, rank
// 0 says so in one line and the run takes checkpoint.resume instead (returns false).
bool take_emergency_states(const Config& c, const mpi::Comm& world, JobState& job);

}  // namespace gg::gossip
