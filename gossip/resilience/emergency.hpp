// Emergency states: what the survivors of a real rank death leave for `gossipgrad supervise`. On
// the launcher's notice (MPICH hydra's SIGUSR1 under -disable-auto-cleanup) or a partner timeout,
// each surviving rank starts a saver (a child in a session of its own, out of reach of hydra's
// proxy, which kills a node's ranks at its next event once it reaped a dead one) that marks
// `<attempt folder>/rank-NNNNN.saving`, writes the rank's state of the last completed step
// boundary, in the format of a full checkpoint's rank file (encode_state: self-checking with
// XXH3-64, written durably), to `rank-NNNNN.bin`, its line to `rank-NNNNN.log` and removes the
// mark. The rank itself writes no output (that is such an event) and does not exit (under hydra
// the first survivor that exits gets every other one killed): it waits. The
// supervisor watches the folder: at the first mark or state it sends the launcher SIGUSR1 (hydra
// passes it to every rank, so a partner timeout on one rank reaches all), and once no save is in
// flight it ends the job, scans the states and relaunches the survivors (forward recovery), or
// falls back to the newest full checkpoint. The saver, the scan and the recovery plan call no MPI:
// the supervisor and the tests use them alone.
//
// The rank's side (EmergencyState): after every step this rank encodes its state into memory it
// shares with its saver, a small process in a session of its own started with the job. When a
// peer dies (the launcher's SIGUSR1: hydra under -disable-auto-cleanup) the signal handler itself
// silences this process's output and tells the saver, which writes the newest complete state to
// disk, while this rank makes no further MPI call and waits for the supervisor to end it. Hydra's
// proxy kills a node's ranks, by process group, soon after it reaped a dead one (at its next
// event): the saver is out of its reach, and the handler needs no thread to be scheduled. A
// partner timeout (gossip.timeout_s) tells the saver the same way. Only active where
// GG_EMERGENCY_DIR is set.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gossip/comm/mpi.hpp"
#include "gossip/resilience/rank_state.hpp"
#include "partners/schedule.hpp"

namespace gg::gossip {

// A rank's exit code after it wrote its emergency state and no supervisor ended it within
// kEmergencyWaitSeconds (BSD's EX_TEMPFAIL: try again).
constexpr int kEmergencyExit = 75;
constexpr int kEmergencyWaitSeconds = 120;
// The mark a rank leaves while it writes its state: "rank-00000.saving"; and the line it has to
// say, which the supervisor prints (a survivor's own output would end the job): "rank-00000.log".
std::string saving_mark_name(int rank);
std::string emergency_log_name(int rank);
// When the saver saw its rank's end and how ("<unix seconds> <g|n|t>": gone, notice, timeout).
std::string emergency_when_name(int rank);
// Left by a saver that saved for a timeout when the launcher's notice reached its rank later.
std::string emergency_reached_name(int rank);
// Left by a saver when it starts: its rank has MPI up ("rank-00000.started").
std::string emergency_started_name(int rank);
// The lines the ranks of a job of `ranks` left in `folder`, in rank order.
std::vector<std::string> emergency_logs(const std::string& folder, int ranks);
// Environment of a supervised job: the folder where this attempt's ranks write their emergency
// states, and the folder of the previous attempt whose states this one continues from.
constexpr const char* kEmergencyDirEnv = "GG_EMERGENCY_DIR";
constexpr const char* kEmergencyFromEnv = "GG_EMERGENCY_FROM";
// The rank count of the supervised job as launched: its train.max_steps and train.stop_at count
// steps of that many ranks, also in a relaunch at another count (the same samples are trained).
constexpr const char* kPlanRanksEnv = "GG_SUPERVISE_RANKS";
constexpr const char* kRecoveryPlanFile = "RECOVERY.json";

// The memory a rank shares with its saver (a memfd): this header, then from kEmergencySlotsAt two
// slots of `capacity` bytes, each an encoded RankState (encode_state_into); `active` names the
// newest complete one, or kNoState. The rank writes the other slot, then flips `active`.
struct EmergencyHeader {
  std::atomic<uint32_t> active;
  std::atomic<uint32_t> ended;  // the rank ended cleanly: its pipe's end asks for no save
  uint64_t capacity;
  uint64_t size[2];
};
constexpr uint64_t kEmergencySlotsAt = 4096;
constexpr uint32_t kNoState = 2;
// What a rank tells its saver, one byte through a pipe: a peer died (the launcher's notice), or a
// partner timed out. The pipe's end without a byte and without `ended`: the rank process is gone
// (killed, by the launcher after a peer's death or on its own, or crashed): the saver saves too.
constexpr char kNoticeByte = 'n';
constexpr char kTimeoutByte = 't';
// `gossipgrad _emergency-saver FOLDER RANK`, started by a rank with the pipe's reading end on
// kSaverPipeFd and the memfd on kSaverMemFd: waits, and on a byte writes the active slot as
// FOLDER/rank-NNNNN.bin (its mark around it) and the rank's line as rank-NNNNN.log.
constexpr int kSaverPipeFd = 3;
constexpr int kSaverMemFd = 4;
int run_emergency_saver(const std::string& folder, int rank);

// What the supervisor found in an attempt's folder after the job of `ranks` ranks ended.
struct EmergencyScan {
  std::vector<int> survivors;  // ranks with a valid state, ascending
  std::vector<int> lost;       // ranks without one (dead, or killed before their state was durable)
  // Ranks with a state whose node the launcher's notice no longer reached after a partner
  // timeout (a cut link): counted as lost too.
  std::vector<int> unreachable;
  std::string corrupt;                 // the first invalid state file and why; empty when none
  int64_t min_step = 0, max_step = 0;  // over the survivors' states
  double first_written_unix = 0;       // when the first saver saw its rank's end
  int first_gone = -1;  // the rank whose process ended first, when one ended without a notice
  double first_gone_unix = 0;
};
// `ended_unix`: when the supervisor ended the job itself (0: it did not); how the savers that
// saw their ranks end after that ended says nothing about the failure.
EmergencyScan scan_emergency_states(const std::string& folder, int ranks, double ended_unix = 0);

// What the supervisor sees while the job runs: states written and saves in flight (marks).
struct EmergencyActivity {
  int states = 0, saving = 0;
  int timeouts = 0;  // saves for a partner timeout (no rank was told of a death)
  int started = 0;   // savers started (their ranks have MPI up)
  bool any() const { return states + saving > 0; }
};
EmergencyActivity emergency_activity(const std::string& folder);

// What a relaunch continues from: written by the supervisor into the failed attempt's folder.
// Ranks are the failed attempt's; new rank i takes the state of survivors[i]; every survivor
// continues at `step` (the oldest of their states: the step in flight, redone by those that had
// finished it).
struct RecoveryPlan {
  std::vector<int> survivors, lost;
  int first_gone = -1;  // EmergencyScan::first_gone
  // Lost ranks' slots are filled (supervise --replace-lost): the job goes on at its size, a lost
  // rank starting from its schedule partner's state.
  bool replace = false;
  // Every rank's state saved: the job goes on at its size ("restore"); else with the survivors
  // ("forward") or at its size with the lost slots filled ("replace").
  const char* strategy() const {
    return lost.empty() ? "restore" : replace ? "replace" : "forward";
  }
  // The ranks of the relaunched job.
  int ranks_after() const {
    return lost.empty() || replace ? ranks_before : static_cast<int>(survivors.size());
  }
  int ranks_before = 0;
  int64_t step = 0, steps_redone = 0;
  double failed_unix = 0;  // when the first emergency state was written
};
void write_recovery_plan(const std::string& folder, const RecoveryPlan& plan);
// Throws std::runtime_error naming the file when it is missing or malformed.
RecoveryPlan read_recovery_plan(const std::string& folder);

// The rank's side of emergency states (above): its shared memory, its saver, the notice's handler.
class EmergencyState {
 public:
  // nullptr unless GG_EMERGENCY_DIR is set; else the saver is started and the SIGUSR1 handler
  // installed. `rank`, `ranks`: this process in the job (the file's name and fields).
  static std::unique_ptr<EmergencyState> from_environment(int rank, int ranks);
  EmergencyState(std::string folder, int rank, int ranks);
  ~EmergencyState();
  EmergencyState(const EmergencyState&) = delete;
  EmergencyState& operator=(const EmergencyState&) = delete;

  // At a step boundary (every step done, hooks included): the state `capture` fills (the
  // trainer's, its steps per epoch and NaN restores) becomes the one to save. The capture may
  // wait in MPI (a pending overlapped weight exchange settles).
  void keep(const std::function<void(RankState&)>& capture);
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

// A relaunch by the supervisor (GG_EMERGENCY_FROM): the recovery plan, and this rank's survivor
// state to continue from at the plan's step. Every rank agrees; when any state is missing,
// corrupt or does not fit, rank 0 says so in one line and the run takes checkpoint.resume
// instead (nullopt). `schedule`: the gossip schedule at a rank count (--replace-lost starts a
// lost rank from the survivor it last sent to).
struct SurvivorState {
  RankState state;
  RecoveryPlan plan;
};
std::optional<SurvivorState> take_emergency_states(
    const mpi::Comm& world, const std::function<partners::Schedule(int ranks)>& schedule);

}  // namespace gg::gossip
