// What `gossipgrad supervise [options] -- mpirun -n P gossipgrad train ...` (the command:
// gossip/cli/supervise.cpp) runs a training job with, and starts it again with when it dies: with
// the survivors of a real failure from their emergency states (gossip/resilience/emergency.hpp),
// else from its latest valid checkpoint (`--checkpoint.resume auto`) with the same or
// (--shrink-on-failure) one rank fewer.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gossip/resilience/emergency.hpp"

namespace gg::gossip {

// The command line of restart number `attempt` (>= 1) of `job`: every --checkpoint.resume of the
// job replaced by `--checkpoint.resume resume` (by none when `resume` is empty: afresh); without
// `resume`, the job's own kept, else auto added. With `shrink` the rank count after mpirun's
// -n/-np lowered by one per restart, never below `min_ranks`.
std::vector<std::string> restart_command(const std::vector<std::string>& job, int attempt,
                                         bool shrink, int min_ranks,
                                         const std::optional<std::string>& resume = std::nullopt);

// Whether `launcher` (argv[0] of the job) is MPICH's hydra mpirun/mpiexec, found on PATH.
bool is_hydra_launcher(const std::string& launcher);
// The job with hydra's failure notice on (-disable-auto-cleanup after the launcher: a dead rank
// no longer takes the others down, they get SIGUSR1); unchanged for other launchers.
std::vector<std::string> with_failure_notice(const std::vector<std::string>& job);
// The rank count after -n/-np (1 when none), and the job with another one.
int job_ranks(const std::vector<std::string>& job);
std::vector<std::string> with_ranks(const std::vector<std::string>& job, int ranks);
// Whether the job names its rank count (mpirun's -n/-np); whether `s` is one (1 to 7 digits).
bool names_ranks(const std::vector<std::string>& job);
bool is_count(const std::string& s);

// SIGTERM and SIGINT stop the supervised job: it hears SIGTERM once (mpirun forwards it to the
// ranks, which write a checkpoint and exit) and is not restarted. stop_requested(): the signal
// that came, 0 when none.
void install_stop_handlers();
int stop_requested();

// Runs `cmd` as attempt `attempt` (GG_SUPERVISE_ATTEMPT and `env` in its environment) in a
// process group of its own (a Ctrl-C reaches the job through the supervisor only, once) and waits
// for it; returns its wait status. Once a stop is requested the job has `stop_timeout` seconds
// before its process group is killed; with an emergency `folder` (the ranks' savers write there),
// it is ended once the survivors of a real failure saved their states, or when not all `ranks`
// started within `start_timeout` seconds (0: wait).
int run_attempt(const std::vector<std::string>& cmd, int attempt, int stop_timeout,
                const std::vector<std::pair<std::string, std::string>>& env,
                const std::string& folder, int ranks, int start_timeout);

// After the last attempt of `ranks` ranks failed: the survivors' states in `folder`, checked
// (only with hydra's `notice`). Returns the recovery plan to relaunch with (written into
// `folder`; `replace`: --replace-lost), or nullopt, with the one line saying why, to fall back to
// the newest full checkpoint.
std::optional<RecoveryPlan> plan_forward(const std::string& folder, int ranks, int min_ranks,
                                         bool notice, bool replace);

// The full checkpoints in the job's checkpoint.dir when the session began. A restart resumes from
// the newest valid one the job wrote since: never from one an earlier run left there, and not
// from the folder the job was launched with once it wrote newer ones (that folder may be pruned
// by now).
class SessionCheckpoints {
 public:
  SessionCheckpoints() = default;
  SessionCheckpoints(std::string dir, std::string launched_with);
  // What a restart passes as --checkpoint.resume (restart_command): that newest checkpoint, else
  // what the job was launched with (auto when it named none); nullopt when the job's settings are
  // unknown (a wrapper: its own --checkpoint.resume is kept, else auto).
  std::optional<std::string> restart_resume() const;

 private:
  // When the folder's manifest was written (none: not a complete checkpoint).
  static std::optional<std::string> written(const std::string& folder);
  std::string dir_, launched_;
  std::map<std::string, std::optional<std::string>> before_;
};

}  // namespace gg::gossip
