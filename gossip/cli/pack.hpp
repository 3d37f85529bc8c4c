// `gossipgrad pack`: an image folder -> WebDataset tar shards, with a progress line on stderr.
#pragma once

#include <string>
#include <vector>

namespace gg::gossip {

// Returns the exit code; throws UsageError for a usage mistake.
int cmd_pack(const std::vector<std::string>& args);

}  // namespace gg::gossip
