// Emergency states: what the survivors of a real rank death leave for `gossipgrad supervise`. On
// the launcher's notice (MPICH hydra's SIGUSR1 under -disable-auto-cleanup) or a partner timeout,
// each surviving rank writes its state of the last completed step boundary, in the format of a
// full checkpoint's rank file (encode_state: self-checking with XXH3-64, written durably), to
// `<attempt folder>/rank-NNNNN.bin`, and exits with kEmergencyExit. The supervisor scans the folder
// and relaunches the survivors (forward recovery), or falls back to the newest full checkpoint.
// No MPI here: the supervisor and the tests use it alone.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gg::gossip {

// A rank's exit code after it wrote its emergency state (BSD's EX_TEMPFAIL: try again).
constexpr int kEmergencyExit = 75;
// Environment of a supervised job: the folder where this attempt's ranks write their emergency
// states, and the folder of the previous attempt whose states this one continues from.
constexpr const char* kEmergencyDirEnv = "GG_EMERGENCY_DIR";
constexpr const char* kEmergencyFromEnv = "GG_EMERGENCY_FROM";
constexpr const char* kRecoveryPlanFile = "RECOVERY.json";

// What the supervisor found in an attempt's folder after the job of `ranks` ranks ended.
struct EmergencyScan {
  std::vector<int> survivors;  // ranks with a valid state, ascending
  std::vector<int> lost;       // ranks without one (dead, or killed before their state was durable)
  std::string corrupt;         // the first invalid state file and why; empty when none
  int64_t min_step = 0, max_step = 0;  // over the survivors' states
  double first_written_unix = 0;       // the earliest state file's modification time
};
EmergencyScan scan_emergency_states(const std::string& folder, int ranks);

// What a relaunch continues from: written by the supervisor into the failed attempt's folder.
// Ranks are the failed attempt's; new rank i takes the state of survivors[i]; every survivor
// continues at `step` (the oldest of their states: the step in flight, redone by those that had
// finished it).
struct RecoveryPlan {
  std::vector<int> survivors, lost;
  int ranks_before = 0;
  int64_t step = 0, steps_redone = 0;
  double failed_unix = 0;  // when the first emergency state was written
};
void write_recovery_plan(const std::string& folder, const RecoveryPlan& plan);
// Throws std::runtime_error naming the file when it is missing or malformed.
RecoveryPlan read_recovery_plan(const std::string& folder);

}  // namespace gg::gossip
