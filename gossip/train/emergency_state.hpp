// Real failures under `gossipgrad supervise` (gossip/resilience/emergency.hpp): after every step
// this rank encodes its state into memory it shares with its saver, a small process in a session
// of its own started with the job. When a peer dies (the launcher's SIGUSR1: hydra under
// -disable-auto-cleanup) the signal handler itself silences this process's output and tells the
// saver, which writes the newest complete state to disk, while this rank makes no further MPI
// call and waits for the supervisor to end it. Hydra's proxy kills a node's ranks, by process
// group, soon after it reaped a dead one (at its next event): the saver is out of its reach, and
// the handler needs no thread to be scheduled. A partner timeout (gossip.timeout_s) tells the
// saver the same way. Only active where GG_EMERGENCY_DIR is set.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>

#include "gossip/resilience/rank_state.hpp"
#include "gossip/train/hooks.hpp"
#include "gossip/train/job.hpp"

namespace gg::gossip {

struct EmergencyHeader;

class EmergencyState {
 public:
  // nullptr unless GG_EMERGENCY_DIR is set; else the saver is started and the SIGUSR1 handler
  // installed. `rank`, `ranks`: this process in the job (the file's name and fields).
  static std::unique_ptr<EmergencyState> from_environment(int rank, int ranks);
  EmergencyState(std::string folder, int rank, int ranks);
  ~EmergencyState();
  EmergencyState(const EmergencyState&) = delete;
  EmergencyState& operator=(const EmergencyState&) = delete;

  // At a step boundary (every step done, hooks included): this state becomes the one to save.
  // The capture may wait in MPI (a pending overlapped weight exchange settles).
  void keep(Group& g);
  // A partner timed out (no notice came): the saver writes the newest state, and this rank
  // waits for the supervisor to end it, at most kEmergencyWaitSeconds, then exits with
  // kEmergencyExit. Never calls MPI.
  [[noreturn]] void save_and_wait();
  // A peer's death is being handled: nothing else may end the process (MPI_Abort would kill the
  // survivors before their states are on disk), nor call MPI, nor write output.
  static bool handling();
  // Parks the calling thread until the process ends.
  [[noreturn]] static void park();

 private:
  // Room for states of `bytes` in both slots of the shared memory.
  void reserve(size_t bytes);
  // Starts the saver (a new pipe; the old one, if any, closed).
  void start_saver();
  // A saver that ended (killed) is said in one line and started again, up to kSaverRestarts.
  void check_saver();
  static constexpr int kSaverRestarts = 3;
  int saver_restarts_ = 0;
  std::string folder_;
  int rank_, ranks_;
  int memfd_ = -1;
  EmergencyHeader* shared_ = nullptr;
  size_t mapped_ = 0;
  pid_t saver_ = -1;
  RankState scratch_;
};

// The hook that keeps the state after every step (the last hook: after the step's agreements).
std::unique_ptr<StepHook> make_emergency_hook(Group& g, EmergencyState& e);

// A relaunch by the supervisor (GG_EMERGENCY_FROM): this rank's survivor state into job.carry,
// at the plan's step. Every rank agrees; when any state is missing, corrupt or does not fit, rank
// 0 says so in one line and the run takes checkpoint.resume instead (returns false).
bool take_emergency_states(const Config& c, const mpi::Comm& world, JobState& job);

}  // namespace gg::gossip
