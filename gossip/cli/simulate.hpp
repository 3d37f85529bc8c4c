// `gossipgrad simulate`: the step time and efficiency a config would reach at many rank counts,
// from partners/cost_model with the config's network, model buckets and compute per step.
#pragma once

#include <string>
#include <vector>

namespace gg::gossip {

// args: everything after `simulate`. Prints a table (or JSON with --json); returns the exit code.
// Throws UsageError for bad arguments.
int run_simulate(const std::vector<std::string>& args);

}  // namespace gg::gossip
