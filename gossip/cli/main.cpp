// gossipgrad: the usage text and the dispatch to the commands, one file each (commands.hpp lists
// them). Usage errors exit 2, runtime failures exit 1.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "gossip/cli/commands.hpp"
#include "gossip/cli/fatal_signals.hpp"
#include "gossip/config/config.hpp"
#include "gossip/resilience/emergency.hpp"

using gg::gossip::UsageError;

namespace {

constexpr const char* kUsage =
    "gossipgrad: data-parallel training with gossip SGD\n\n"
    "usage:\n"
    "  mpirun -n P gossipgrad train --config FILE [--section.key value ...]\n"
    "  gossipgrad info --model NAME [--input C,H,W] [--classes N] [--width W] [--json]\n"
    "  gossipgrad export --checkpoint DIR --output W.npz [--overwrite]\n"
    "  gossipgrad infer --model NAME --weights W.npz --input X.npy --output Y.npy [--classes N]\n"
    "                   [--backend onednn|reference|cuda] [--batch B] [--overwrite]\n"
    "  gossipgrad partners --ranks P [--schedule S] [--rotate] [--steps T] [--seed N] [--json]\n"
    "  gossipgrad simulate --config FILE --ranks 2,4,...,4096 [--json] [--section.key value ...]\n"
    "  gossipgrad pack --input DIR --output DIR [--shard-size MB] [--threads N] [--shuffle SEED]\n"
    "  mpirun -n P gossipgrad layout [--config FILE] [--section.key value ...]\n"
    "  gossipgrad supervise [--max-restarts N] [--shrink-on-failure] [--min-ranks M]\n"
    "                       [--replace-lost] [--stop-timeout S] [--start-timeout S]\n"
    "                       [--emergency-dir DIR|none]\n"
    "                       -- mpirun -n P gossipgrad train ...\n"
    "  gossipgrad help | --help | COMMAND --help\n\n"
    "commands:\n"
    "  train   train a model on this rank's share of the data (run under mpirun)\n"
    "  info    print a model's layers, parameter count and forward FLOPs\n"
    "  export  write a checkpoint's model as .npz with torchvision state_dict names\n"
    "  infer   logits (eval mode) of a model with .npz weights for the images in a .npy file\n"
    "  partners  print who talks to whom at each step, and how fast the schedule mixes\n"
    "  simulate  predict step time and efficiency of gossip vs allreduce at many rank counts\n"
    "  pack    image folder (ImageNet layout) -> tar shards for data.source = shards:DIR\n"
    "  layout  print the nodes and node-local ranks MPI reports, checked against a config\n"
    "  supervise  run a training job; when a rank dies, go on from every rank's state of the\n"
    "             last completed step (or its latest checkpoint); SIGTERM or Ctrl-C stops it\n"
    "             with a checkpoint instead. --replace-lost: after a real failure, relaunch at\n"
    "             the job's size, a lost rank starting from the state of the survivor it last\n"
    "             sent to (not with the survivors only); --start-timeout S: with emergency\n"
    "             states, end a job whose ranks have not all started (MPI up) S seconds after\n"
    "             launch (default 120; 0: wait)\n\n"
    "example: mpirun -n 2 gossipgrad train --config configs/laptop.ini\n";

}  // namespace

int main(int argc, char** argv) {
  gg::gossip::install_fatal_signal_handlers();
  const std::vector<std::string> all(argv + 1, argv + argc);
  if (all.empty()) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  const std::string cmd = all[0];
  const std::vector<std::string> rest(all.begin() + 1, all.end());
  try {
    if (cmd == "--help" || cmd == "-h" || cmd == "help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (cmd == "train") return gg::gossip::cmd_train(rest, argc, argv);
    if (cmd == "info") return gg::gossip::cmd_info(rest);
    if (cmd == "partners") return gg::gossip::cmd_partners(rest);
    if (cmd == "export") return gg::gossip::cmd_export(rest);
    if (cmd == "infer") return gg::gossip::cmd_infer(rest);
    if (cmd == "simulate") return gg::gossip::cmd_simulate(rest);
    if (cmd == "pack") return gg::gossip::cmd_pack(rest);
    if (cmd == "layout") return gg::gossip::cmd_layout(rest, argc, argv);
    if (cmd == "supervise") return gg::gossip::cmd_supervise(rest);
    // Internal: a training rank's saver under supervise (gossip/resilience/emergency.hpp).
    if (cmd == "_emergency-saver" && rest.size() == 2) {
      char* end = nullptr;
      const long rank = std::strtol(rest[1].c_str(), &end, 10);
      if (rest[1].empty() || *end != '\0' || rank < 0 || rank > 1 << 24)
        throw UsageError("_emergency-saver (internal): '" + rest[1] + "' is no rank");
      return gg::gossip::run_emergency_saver(rest[0], static_cast<int>(rank));
    }
    throw UsageError("unknown command '" + cmd + "' (try gossipgrad --help)");
  } catch (const UsageError& e) {
    std::fprintf(stderr, "gossipgrad: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gossipgrad: error: %s\n", e.what());
    return 1;
  }
}
