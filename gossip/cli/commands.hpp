// The `gossipgrad` commands, one file each in gossip/cli/; main.cpp dispatches to them. Each takes
// the words after its name, prints its --help when asked, returns the exit code and throws
// UsageError (exit 2) for a mistake in what the user asked for.
#pragma once

#include <string>
#include <vector>

namespace gg::gossip {

// train.cpp: train under mpirun (argc/argv go to MPI_Init), or --dry-run: print the resolved
// config.
int cmd_train(const std::vector<std::string>& args, int argc, char** argv);
// layout.cpp: under mpirun, the nodes and node-local ranks MPI reports, checked against a config.
int cmd_layout(const std::vector<std::string>& args, int argc, char** argv);
// info.cpp: a model's layers, parameter count and forward FLOPs, as a table or JSON.
int cmd_info(const std::vector<std::string>& args);
// export.cpp: a checkpoint's model -> .npz with torchvision state_dict names.
int cmd_export(const std::vector<std::string>& args);
// infer.cpp: eval-mode logits of a model with .npz weights for the images in a .npy file.
int cmd_infer(const std::vector<std::string>& args);
// partners.cpp: who talks to whom at each step, and how fast the schedule mixes.
int cmd_partners(const std::vector<std::string>& args);
// simulate.cpp: predicted step time and efficiency of gossip vs allreduce at many rank counts.
int cmd_simulate(const std::vector<std::string>& args);
// pack.cpp: an image folder -> WebDataset tar shards, with a progress line on stderr.
int cmd_pack(const std::vector<std::string>& args);
// supervise.cpp: run a training job and start it again when it dies (from the survivors'
// emergency states or its newest checkpoint).
int cmd_supervise(const std::vector<std::string>& args);

}  // namespace gg::gossip
