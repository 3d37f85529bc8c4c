// `gossipgrad train`: train a model on this rank's share of the data, under mpirun; with --dry-run
// the config validated and printed resolved, without MPI.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "gossip/cli/commands.hpp"
#include "gossip/comm/mpi.hpp"
#include "gossip/config/config.hpp"
#include "gossip/train/loop.hpp"
#include "gossip/train/preflight.hpp"
#include "gossip/train/stop_signals.hpp"

namespace gg::gossip {
namespace {

// --dry-run: the config validated (what concerns this machine only warns: another cluster's
// config names its own paths and backend) and printed resolved, as INI; nothing runs, nothing is
// written.
int dry_run(std::vector<std::string> args) {
  args.erase(std::remove(args.begin(), args.end(), "--dry-run"), args.end());
  const Config c = parse_train_args(args);
  try {
    check_this_machine(c);
    check_run_files(c);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "gossipgrad: warning: not on this machine: %s\n", e.what());
  }
  std::cout << "# gossipgrad train, resolved settings"
            << (c.config_path.empty() ? "" : " of " + c.config_path) << "\n"
            << to_ini(c);
  return 0;
}

}  // namespace

int cmd_train(const std::vector<std::string>& args, int argc, char** argv) {
  for (const auto& a : args)
    if (a == "--help" || a == "-h") {
      std::cout << train_help();
      return 0;
    }
  if (std::find(args.begin(), args.end(), "--dry-run") != args.end()) return dry_run(args);
  gg::mpi::Environment env(&argc, &argv);
  const gg::mpi::Comm world = gg::mpi::Comm::world();
  const int rank = world.rank();
  try {
    const Config c = parse_train_args(args);
    check_this_machine(c);
    check_run_files(c);
    world.barrier();  // every rank validated before rank 0 creates any file
    run_training(c, world);
    world.barrier();
    return 0;
  } catch (const StopRequested& e) {
    // Every rank stopped at the same step boundary: one line, and MPI ends normally.
    if (rank == 0) std::fprintf(stderr, "gossipgrad: %s\n", e.what());
    return 128 + e.signal;
  } catch (const UsageError& e) {
    // Every rank sees the same usage error; one line from rank 0 is enough.
    if (rank == 0) std::fprintf(stderr, "gossipgrad: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gossipgrad: rank %d: error: %s\n", rank, e.what());
    std::fflush(stderr);
    // mpirun drops output still in flight when the abort tears the job down: give it a moment.
    if (world.size() > 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    return 1;
  }
}

}  // namespace gg::gossip
