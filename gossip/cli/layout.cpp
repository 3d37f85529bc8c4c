// `gossipgrad layout`: where the ranks of a job landed, as MPI reports it, and whether that is the
// placement a config intends. Run it with the launch line of a real job (the job scripts in
// configs/ do, with --dry-run) to see the nodes before spending an allocation on training.
#include <sched.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "gossip/cli/commands.hpp"
#include "gossip/comm/mpi.hpp"
#include "gossip/config/config.hpp"
#include "kernels/executor.hpp"
#ifdef GG_HAVE_CUDA
#include "kernels/cuda/cuda_executor.hpp"
#endif

namespace gg::gossip {
namespace {

constexpr const char* kLayoutHelp =
    "usage: mpirun -n P gossipgrad layout [--config FILE] [--section.key value ...]\n\n"
    "Prints, from rank 0, the nodes of this job as MPI reports them: each node's name\n"
    "(MPI_Get_processor_name), its ranks as global/local (the local rank is the rank in\n"
    "MPI_Comm_split_type(MPI_COMM_TYPE_SHARED), which training binds devices with, never an\n"
    "environment variable), the CPUs each rank may run on, and the totals.\n"
    "Given a config, it checks the placement the config intends: network.ranks_per_node ranks\n"
    "on every node, one rank per GPU for train.backend cuda, train.threads within each rank's\n"
    "CPUs. Each mismatch is one 'gossipgrad: warning:' line on stderr (exit code still 0);\n"
    "without one it prints 'config FILE: matches'.\n"
    "The job scripts next to the configs (configs/*.sbatch) run it with --dry-run.\n";

// What one rank knows about itself, gathered at rank 0 as raw bytes.
struct RankInfo {
  char host[MPI_MAX_PROCESSOR_NAME + 1];
  int node_leader;  // lowest global rank of this rank's shared-memory node: names the node
  int local_rank;
  int local_size;
  int cpus;  // CPUs in this rank's affinity mask
  int gpus;  // CUDA devices this rank sees; -1: not asked (backend is not cuda)
};

int affinity_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return 0;
  return CPU_COUNT(&set);
}

// CUDA devices this process sees, or -1 when this gossipgrad has no CUDA backend.
int visible_gpus() {
#ifdef GG_HAVE_CUDA
  return kernels::cuda_device_count();
#else
  return -1;
#endif
}

RankInfo describe_this_rank(const mpi::Comm& world, const mpi::Comm& node, bool ask_gpus) {
  RankInfo me{};
  int len = 0;
  GG_MPI_CHECK(MPI_Get_processor_name(me.host, &len));
  me.host[std::clamp(len, 0, MPI_MAX_PROCESSOR_NAME)] = '\0';
  me.node_leader = world.rank();
  GG_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &me.node_leader, 1, MPI_INT, MPI_MIN, node.get()));
  me.local_rank = node.rank();
  me.local_size = node.size();
  me.cpus = affinity_cpus();
  me.gpus = ask_gpus ? visible_gpus() : -1;
  return me;
}

// One node: its ranks in global order.
struct Node {
  std::string host;
  std::vector<RankInfo> ranks;
  std::vector<int> global;
};

std::vector<Node> group_by_node(const std::vector<RankInfo>& all) {
  std::map<int, Node> by_leader;  // leaders ascending: nodes in the order of their first rank
  for (int r = 0; r < static_cast<int>(all.size()); ++r) {
    Node& n = by_leader[all[r].node_leader];
    if (n.ranks.empty()) n.host = all[r].host;
    n.ranks.push_back(all[r]);
    n.global.push_back(r);
  }
  std::vector<Node> nodes;
  for (auto& [leader, n] : by_leader) nodes.push_back(std::move(n));
  return nodes;
}

void warn(const std::string& line) {
  std::fprintf(stderr, "gossipgrad: warning: %s\n", line.c_str());
}

std::string per_node_text(int lo, int hi) {
  return lo == hi ? std::to_string(lo) : std::to_string(lo) + " to " + std::to_string(hi);
}

void print_layout(const std::vector<Node>& nodes, int size) {
  int lo = size, hi = 0;
  for (const Node& n : nodes) {
    lo = std::min(lo, static_cast<int>(n.ranks.size()));
    hi = std::max(hi, static_cast<int>(n.ranks.size()));
  }
  std::printf("layout: %zu node%s, %d rank%s, %s rank%s per node\n", nodes.size(),
              nodes.size() == 1 ? "" : "s", size, size == 1 ? "" : "s",
              per_node_text(lo, hi).c_str(), hi == 1 ? "" : "s");
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = nodes[i];
    std::printf("node %zu %s: %zu rank%s (global/local):", i, n.host.c_str(), n.ranks.size(),
                n.ranks.size() == 1 ? "" : "s");
    for (size_t k = 0; k < n.ranks.size(); ++k)
      std::printf(" %d/%d", n.global[k], n.ranks[k].local_rank);
    std::printf("; cpus per rank %d", n.ranks[0].cpus);
    if (n.ranks[0].gpus >= 0) std::printf("; gpus %d", n.ranks[0].gpus);
    std::printf("\n");
  }
}

// Things MPI itself got wrong or the job cannot rely on, config or not.
void check_consistency(const std::vector<Node>& nodes) {
  std::map<std::string, int> seen;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = nodes[i];
    for (const RankInfo& r : n.ranks)
      if (n.host != r.host)
        warn("node " + std::to_string(i) + " holds ranks on hosts '" + n.host + "' and '" + r.host +
             "': one shared-memory node under two names");
    auto [it, fresh] = seen.emplace(n.host, static_cast<int>(i));
    if (!fresh)
      warn("nodes " + std::to_string(it->second) + " and " + std::to_string(i) +
           " both call "
           "themselves '" +
           n.host + "' but share no memory (containers, or one host twice?)");
  }
}

// Whether the placement is what the config intends; a warning line for each way it is not.
// Returns the number of warnings.
int check_against_config(const Config& c, const std::vector<Node>& nodes) {
  const std::string name = c.config_path.empty() ? "the default config" : c.config_path;
  const int want = c.network.ranks_per_node;
  int warnings = 0;
  std::set<size_t> counts;
  for (const Node& n : nodes) counts.insert(n.ranks.size());
  if (counts.size() == 1 && static_cast<int>(*counts.begin()) != want) {
    warn(std::to_string(*counts.begin()) + " ranks per node, but " + name + " intends " +
         std::to_string(want) + " (network.ranks_per_node)");
    ++warnings;
  } else if (counts.size() > 1) {
    for (size_t i = 0; i < nodes.size(); ++i)
      if (static_cast<int>(nodes[i].ranks.size()) != want) {
        warn("node " + std::to_string(i) + " " + nodes[i].host + " has " +
             std::to_string(nodes[i].ranks.size()) + " ranks, but " + name + " intends " +
             std::to_string(want) + " per node (network.ranks_per_node)");
        ++warnings;
      }
  }
  if (backend_of(c) == kernels::Backend::Cuda) {
    if (!kernels::cuda_built()) {
      warn(name + " trains with train.backend cuda, but this gossipgrad was built without CUDA");
      ++warnings;
    } else {
      for (size_t i = 0; i < nodes.size(); ++i) {
        const int gpus = nodes[i].ranks[0].gpus;
        const int ranks = static_cast<int>(nodes[i].ranks.size());
        if (gpus == ranks) continue;
        warn("node " + std::to_string(i) + " " + nodes[i].host + " has " + std::to_string(ranks) +
             " ranks and " + std::to_string(gpus) + " GPUs, but " + name +
             " trains with train.backend cuda, one rank per GPU" +
             (gpus == 0      ? ""
              : ranks > gpus ? " (ranks would share GPUs, unless each sees a different one)"
                             : " (GPUs would idle)"));
        ++warnings;
      }
    }
  }
  if (c.train.threads > 0)
    for (size_t i = 0; i < nodes.size(); ++i) {
      const int cpus = nodes[i].ranks[0].cpus;
      if (cpus <= 0 || c.train.threads <= cpus) continue;
      warn("node " + std::to_string(i) + " " + nodes[i].host + ": a rank may run on " +
           std::to_string(cpus) + " CPUs, but " + name + " runs train.threads = " +
           std::to_string(c.train.threads) + " compute threads per rank");
      ++warnings;
    }
  if (warnings == 0)
    std::printf("config %s: matches (%d rank%s per node%s)\n", name.c_str(), want,
                want == 1 ? "" : "s",
                backend_of(c) == kernels::Backend::Cuda ? ", one per GPU" : "");
  return warnings;
}

// Rank 0 gathers every rank's RankInfo and prints; the others only send.
void report(const mpi::Comm& world, const RankInfo& me, const std::optional<Config>& c) {
  const int size = world.size();
  std::vector<RankInfo> all(world.rank() == 0 ? size : 0);
  GG_MPI_CHECK(
      MPI_Gather(&me, sizeof me, MPI_BYTE, all.data(), sizeof me, MPI_BYTE, 0, world.get()));
  if (world.rank() != 0) return;
  const std::vector<Node> nodes = group_by_node(all);
  print_layout(nodes, size);
  std::fflush(stdout);
  check_consistency(nodes);
  if (const char* fake = std::getenv("GG_RANKS_PER_NODE"); fake != nullptr && *fake != '\0')
    warn(std::string("GG_RANKS_PER_NODE=") + fake + " is set: training would take every " + fake +
         " consecutive ranks for one node (a test hook), not the nodes above");
  if (c) check_against_config(*c, nodes);
  std::fflush(stdout);
  std::fflush(stderr);
}

}  // namespace

int cmd_layout(const std::vector<std::string>& args, int argc, char** argv) {
  for (const auto& a : args)
    if (a == "--help" || a == "-h") {
      std::cout << kLayoutHelp;
      return 0;
    }
  mpi::Environment env(&argc, &argv);
  const mpi::Comm world = mpi::Comm::world();
  try {
    // Another machine's config, read only for what it intends: no check of its paths here.
    std::optional<Config> c;
    if (!args.empty()) c = parse_train_args(args);
    MPI_Comm shared = MPI_COMM_NULL;
    GG_MPI_CHECK(MPI_Comm_split_type(world.get(), MPI_COMM_TYPE_SHARED, world.rank(), MPI_INFO_NULL,
                                     &shared));
    const mpi::Comm node = mpi::Comm::adopt(shared);
    report(world, describe_this_rank(world, node, c && backend_of(*c) == kernels::Backend::Cuda),
           c);
    return 0;
  } catch (const UsageError& e) {
    // Every rank parsed the same arguments: one line from rank 0 is enough.
    if (world.rank() == 0) std::fprintf(stderr, "gossipgrad: error: %s\n", e.what());
    return 2;
  }
}

}  // namespace gg::gossip
