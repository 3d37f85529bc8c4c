// `gossipgrad supervise [options] -- mpirun -n P gossipgrad train ...`: runs a training job and,
// when it dies, starts it again: with the survivors of a real failure from their emergency states
// (gossip/resilience/emergency.hpp), else from its latest valid checkpoint
// (`--checkpoint.resume auto`) with the same or (--shrink-on-failure) one rank fewer.
#pragma once

#include <optional>
#include <string>
#include <vector>

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

// The whole subcommand; returns the exit code.
int cmd_supervise(const std::vector<std::string>& args);

}  // namespace gg::gossip
