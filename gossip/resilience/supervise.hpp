// `gossipgrad supervise [options] -- mpirun -n P gossipgrad train ...`: runs a training job and,
// when it dies, starts it again from its latest valid checkpoint (`--checkpoint.resume auto`),
// with the same or (--shrink-on-failure) one rank fewer, until it completes.
#pragma once

#include <string>
#include <vector>

namespace gg::gossip {

// The command line of restart number `attempt` (>= 1) of `job`: --checkpoint.resume auto added
// unless the job names a resume already, and with `shrink` the rank count after mpirun's -n/-np
// lowered by one per restart, never below `min_ranks`.
std::vector<std::string> restart_command(const std::vector<std::string>& job, int attempt,
                                         bool shrink, int min_ranks);

// The whole subcommand; returns the exit code.
int cmd_supervise(const std::vector<std::string>& args);

}  // namespace gg::gossip
