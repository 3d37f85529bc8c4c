// `gossipgrad train`: train a model on this rank's share of the data, under mpirun; with --dry-run
// the config validated as the real run would and printed resolved, without MPI.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "gossip/cli/commands.hpp"
#include "gossip/comm/low_rank.hpp"
#include "gossip/comm/mpi.hpp"
#include "gossip/config/config.hpp"
#include "gossip/train/agree.hpp"
#include "gossip/train/apoptosis.hpp"
#include "gossip/train/data.hpp"
#include "gossip/train/loop.hpp"
#include "gossip/train/preflight.hpp"
#include "gossip/train/stop_signals.hpp"
#include "gossip/train/trainer.hpp"
#include "kernels/weights.hpp"
#include "shuffle/source.hpp"

namespace gg::gossip {
namespace {

// The job's rank count and this process's rank as the launcher tells them (MPICH's hydra and
// Open MPI), without starting MPI: 1 and 0 outside mpirun.
int env_int(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : -1;
}
int env_ranks() {
  const int n = std::max(env_int("PMI_SIZE"), env_int("OMPI_COMM_WORLD_SIZE"));
  return n > 0 ? n : 1;
}
// A restart by gossipgrad supervise (test_hooks.hpp: fault.kill and fault.stall stay inert).
bool supervised_restart() {
  const char* attempt = std::getenv("GG_SUPERVISE_ATTEMPT");
  return attempt != nullptr && std::string(attempt) != "0";
}
int env_rank() { return std::max({0, env_int("PMI_RANK"), env_int("OMPI_COMM_WORLD_RANK")}); }

// The model the run builds on this data (emulated compute: the model it stands for).
kernels::Graph model_on(const Config& c, const shuffle::SampleSource& s) {
  if (emulated(c)) return kernels::build_model(usual_model_spec(c, 0));
  const auto [ch, h, w] = s.shape();
  const kernels::Dims input = s.encoding() == shuffle::Encoding::Jpeg
                                  ? kernels::Dims{3, c.data.crop, c.data.crop}
                                  : kernels::Dims{ch, h, w};
  return kernels::build_model(model_spec(c, 0, input, s.classes()));
}

// --dry-run: what the real run finds once its data is open and its model built, at `ranks` ranks
// (train.virtual_ranks: that many virtual ones), where this machine holds the data: the batch
// against a rank's share of the samples, train.stop_at against the run's last step,
// gossip.low_rank against the model's matrices, apoptosis.layers and a virtual run's dropout
// against its layers, train.init_from against its tensors (issue 52 row 8: the dry run said 0
// where the run refused). Opening the data reads its index (or its idx files), not its samples.
void check_model_and_data(const Config& c, int ranks) {
  shuffle::DataSplits data;
  try {
    const std::string labels = val_labels_file(c);
    data = shuffle::open_splits(data_source(c), labels);
  } catch (const std::exception&) {
    return;  // the data is another machine's: warned about by check_run_files
  }
  const shuffle::SampleSource& s = *data.train;
  const bool virtual_ranks = c.train.virtual_ranks > 0;
  const int p = run_ranks(c, ranks);
  const int64_t per_epoch = full_batches_per_epoch(c, s.size(), p);
  if (per_epoch < 1) throw UsageError(no_full_batch(c, s.size(), p, virtual_ranks));
  int64_t total = per_epoch * c.train.epochs;
  if (c.train.max_steps > 0) total = std::min(total, c.train.max_steps);
  if (c.train.stop_at > 0 && c.train.stop_at >= total)
    throw UsageError("train.stop_at = " + std::to_string(c.train.stop_at) +
                     " is not before the run's last step (" + std::to_string(total) +
                     " steps): it would never stop the run; set it lower or leave it at 0");
  const kernels::Graph g = model_on(c, s);
  try {
    if (c.gossip.low_rank > 0) check_gains(c.gossip.low_rank, g, c.model.name);
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
  if (c.apoptosis.enable && apoptosis_layers(c, g).empty())
    throw UsageError("apoptosis.layers = " + text_of(c.apoptosis.layers) + ": " + c.model.name +
                     " has no such layer whose units may be removed (units that reach a residual "
                     "add, a concat or the output stay)");
  if (virtual_ranks)
    for (const kernels::Node& node : g.nodes())
      if (node.op == kernels::Op::Dropout)
        throw UsageError("train.virtual_ranks: " + c.model.name +
                         " has dropout, whose masks are seeded per rank; virtual ranks share one "
                         "network and do not reproduce them: use a model without dropout");
  if (c.train.init_from.empty() || emulated(c) ||
      !std::filesystem::is_regular_file(c.train.init_from))
    return;
  kernels::ParamStore store(g);
  try {
    kernels::load_weights(c.train.init_from, g, store);
  } catch (const std::invalid_argument& e) {  // weights that do not fit the model
    throw UsageError(std::string("train.init_from: ") + e.what());
  } catch (const std::exception&) {  // an unreadable file: check_run_files names it
  }
}

// "4 ranks", "1 rank", or the virtual ranks one process runs: "8 virtual ranks in 1 process".
std::string ranks_text(const Config& c, int ranks) {
  const int p = run_ranks(c, ranks);
  return std::to_string(p) + (c.train.virtual_ranks > 0 ? " virtual" : "") + " rank" +
         (p == 1 ? "" : "s") + (c.train.virtual_ranks > 0 ? " in 1 process" : "");
}

void warn_inert(const Config& c) {
  for (const std::string& what : inert_settings(c))
    std::fprintf(stderr, "gossipgrad: warning: %s\n", what.c_str());
}

// --dry-run: the config validated as a real run at this rank count would (under mpirun, the
// launcher's; 1 otherwise) and printed resolved, as INI, by one rank; what concerns this
// machine's files only warns (another cluster's config names its own paths and backend). Nothing
// runs, nothing is written.
int dry_run(std::vector<std::string> args) {
  args.erase(std::remove(args.begin(), args.end(), "--dry-run"), args.end());
  const bool lead = env_rank() == 0;
  try {
    const Config c = parse_train_args(args);
    check_ranks(c, env_ranks(), supervised_restart());
    check_model_and_data(c, env_ranks());
    if (!lead) return 0;
    warn_inert(c);
    try {
      check_this_machine(c);
      check_run_files(c);
    } catch (const UsageError& e) {
      std::fprintf(stderr, "gossipgrad: warning: not on this machine: %s\n", e.what());
    }
    std::cout << "# gossipgrad train, resolved settings"
              << (c.config_path.empty() ? "" : " of " + c.config_path) << " for "
              << ranks_text(c, env_ranks()) << "\n"
              << to_ini(c);
    return 0;
  } catch (const UsageError& e) {
    if (lead) std::fprintf(stderr, "gossipgrad: error: %s\n", e.what());
    return 2;
  }
}

// The settings every rank resolved, agreed: a usage error on any rank (its options, the rank
// count, this machine's files) or settings that differ between ranks end every rank with the
// same line, printed once, before any other collective.
Config agreed_config(const std::vector<std::string>& args, const mpi::Comm& world) {
  Config c;
  mpi::RankError error;
  try {
    c = parse_train_args(args);
    check_ranks(c, world.size(), supervised_restart());
  } catch (const UsageError& e) {
    error = {e.what(), true};
  }
  throw_agreed(world, error);
  agree_on_config(world, c);
  try {
    check_this_machine(c);
    check_run_files(c);
  } catch (const UsageError& e) {
    error = {e.what(), true};
  }
  throw_agreed(world, error);
  if (world.rank() == 0) warn_inert(c);
  return c;
}

}  // namespace

int cmd_train(const std::vector<std::string>& args, int argc, char** argv) {
  for (const auto& a : args)
    if (a == "--help" || a == "-h") {
      std::cout << train_help();
      return 0;
    }
  if (std::find(args.begin(), args.end(), "--dry-run") != args.end()) return dry_run(args);
  // One process: what the options say is refused before MPI starts. Several ranks agree on the
  // verdict over MPI instead (agreed_config, the same checks): the parts of an MPMD launch line
  // may differ, and a rank that left before MPI_Init would leave the others waiting in it.
  if (env_ranks() == 1) {
    try {
      check_ranks(parse_train_args(args), 1, supervised_restart());
    } catch (const UsageError& e) {
      std::fprintf(stderr, "gossipgrad: error: %s\n", e.what());
      return 2;
    }
  }
  gg::mpi::Environment env(&argc, &argv);
  const gg::mpi::Comm world = gg::mpi::Comm::world();
  const int rank = world.rank();
  try {
    const Config c = agreed_config(args, world);  // every rank validated before any file is made
    // train.virtual_ranks: P logical ranks in this one process (check_ranks), no MPI traffic.
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
