// The gossip algorithms, one registry line each (gossip.mode): which buffers an algorithm mixes
// with the step's partner and when, what --help says of it, and the buffers' worth of bytes it
// sends per step. The option's choices, its help, the option-combination rules and the trainer's
// exchanges all follow from this table; the arithmetic is a mixing rule's (gossip/comm/rules.hpp).
// docs/gossip.md, "Adding a gossip algorithm", walks through a new line.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace gg::gossip {

struct Algorithm {
  std::string_view name;  // the gossip.mode value
  std::string_view help;
  bool allreduce = false;  // the exact average of the gradients over all ranks (no partners)
  bool grads = false;      // gradients, with this step's partner, as backward completes them
  bool weights = false;    // weights, with the partner, after the update
  bool momentum = false;   // the SGD momentum too, with the weights (the authors' GossipGraD)
};

// Every algorithm, in --help's order.
const std::vector<Algorithm>& algorithms();
// The one named `name`; throws std::invalid_argument listing the names otherwise.
const Algorithm& find_algorithm(const std::string& name);
// The names of the algorithms that mix `what` (&Algorithm::weights, ...), as messages list them:
// "model, both or gossipgrad". Messages take them from here, so a new line is never left out.
std::string modes_that(bool Algorithm::*what);
// Flat buffers' worth (of the model's parameters) this rank sends per step: gradients every step,
// weights and momentum every `model_every`-th step. Allreduce: none of its own (MPI moves them).
double buffers_per_step(const Algorithm& a, int64_t model_every);

}  // namespace gg::gossip
