// Run under mpirun with GG_RANKS_PER_NODE=K (simulated nodes of K consecutive ranks):
// gossip.hierarchy = node. After every step each rank holds (its node's average + the average of
// the node it receives from) / 2, bucket by bucket (exactly at the first step, where the values are
// small integers; within float rounding after), every rank of a node the same values to the bit,
// and it sent 1/K of the buffer. With nodes of different sizes the exchange is refused with one
// line naming the sizes. Without GG_RANKS_PER_NODE every rank is on one node: the node average
// alone.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "gossip/comm/hierarchy.hpp"
#include "gossip/comm/mpi.hpp"
#include "tests/gossip/bucket_layout.hpp"
#include "tests/gossip/mpi_check.hpp"

using namespace gg;

namespace {

using test::check;
using test::failures;
using test::make_layout;

// Every rank's buffer, gathered (rank-major).
std::vector<float> gather(const mpi::Comm& world, const std::vector<float>& x) {
  std::vector<float> all(x.size() * static_cast<size_t>(world.size()));
  MPI_Allgather(x.data(), static_cast<int>(x.size()), MPI_FLOAT, all.data(),
                static_cast<int>(x.size()), MPI_FLOAT, world.get());
  return all;
}

void run(const mpi::Comm& world, partners::Kind kind, bool rotate) {
  const int me = world.rank(), p = world.size();
  const int64_t count = 1000;
  std::vector<float> x(count);
  for (int64_t i = 0; i < count; ++i) x[i] = static_cast<float>((me * 5 + i * 3) % 32);
  const std::vector<kernels::Bucket> buckets = make_layout(count);
  gossip::HierarchicalExchange ex(world, x.data(), buckets, {kind, 0, rotate, 3}, 60);
  const gossip::NodeLayout& l = ex.layout();
  const int per = l.per_node, nodes = l.nodes;
  // The node of every world rank (a collective).
  std::vector<int> node_of(static_cast<size_t>(p));
  MPI_Allgather(&l.node, 1, MPI_INT, node_of.data(), 1, MPI_INT, world.get());
  const std::string label = std::string("hierarchy ") + partners::kind_name(kind) +
                            (rotate ? "+rotate" : "") + ", " + std::to_string(nodes) +
                            " nodes of " + std::to_string(per);
  int64_t sent_before = 0;
  std::mt19937 rng(11 + static_cast<unsigned>(me));
  for (int64_t step = 0; step < 5; ++step) {
    const std::vector<float> all = gather(world, x);
    // The expected values: each node's average, the same sums and scaling as the exchange.
    const float inv = 1.f / static_cast<float>(per);
    auto node_avg = [&](int node, int64_t i) {
      float s = 0;
      for (int r = 0; r < p; ++r)
        if (node_of[static_cast<size_t>(r)] == node)
          s += all[static_cast<size_t>(r) * count + static_cast<size_t>(i)];
      return s * inv;
    };
    const int from = nodes > 1 ? ex.node_partners(step).recv_from : l.node;
    std::vector<float> want(count);
    for (int64_t i = 0; i < count; ++i)
      want[i] = nodes > 1 ? 0.5f * (node_avg(l.node, i) + node_avg(from, i)) : node_avg(l.node, i);
    ex.begin_step(step);
    // Ranks hand their buckets over at different times (up to 1 ms apart), so that buckets are
    // in flight in different phases at once, in another order on every rank.
    for (int b = 0; b < static_cast<int>(buckets.size()); ++b) {
      std::this_thread::sleep_for(std::chrono::microseconds(rng() % 1000));
      ex.on_bucket_ready(b);
    }
    ex.finish_step();
    double worst = 0;
    for (int64_t i = 0; i < count; ++i)
      worst = std::max(worst, static_cast<double>(std::fabs(x[i] - want[i])));
    // Step 0 sums small integers (exact in any order); later sums may round in another order.
    const double bound = step == 0 ? 0 : 1e-5;
    check(worst <= bound,
          label + ", step " + std::to_string(step) + ": off the expected mix by " +
              std::to_string(worst) + " (node " + std::to_string(l.node) + ", from node " +
              std::to_string(from) + ")",
          me);
    // Every rank of a node the same values, to the bit.
    const std::vector<float> now = gather(world, x);
    for (int r = 0; r < p; ++r)
      if (node_of[static_cast<size_t>(r)] == l.node)
        for (int64_t i = 0; i < count; ++i)
          if (now[static_cast<size_t>(r) * count + static_cast<size_t>(i)] != x[i]) {
            check(false,
                  label + ": rank " + std::to_string(r) + " of the same node differs at " +
                      std::to_string(i),
                  me);
            break;
          }
    // 1/K of the buffer on the wire per step (this rank's slices), nothing within one node.
    int64_t slice = 0;
    for (const kernels::Bucket& k : buckets)
      slice += k.size() / per + (l.local < k.size() % per ? 1 : 0);
    const int64_t sent = ex.bytes_sent() - sent_before;
    sent_before = ex.bytes_sent();
    check(sent == (nodes > 1 ? slice * 4 : 0),
          label + ": sent " + std::to_string(sent) + " bytes, want " + std::to_string(slice * 4),
          me);
  }
  if (me == 0)
    std::printf("%s: 5 steps mixed as expected, %lld bytes sent a step by rank 0\n", label.c_str(),
                static_cast<long long>(sent_before / 5));
}

}  // namespace

int main(int argc, char** argv) {
  mpi::Environment env(&argc, &argv);
  const mpi::Comm world = mpi::Comm::world();
  const int p = world.size();
  const char* per = std::getenv("GG_RANKS_PER_NODE");
  const int k = per ? std::atoi(per) : p;
  try {
    if (k > 0 && p % k != 0) {
      // Uneven nodes: refused on every rank with one line naming the sizes.
      std::vector<float> x(10, 1.f);
      std::string error;
      try {
        gossip::HierarchicalExchange ex(world, x.data(), make_layout(10),
                                        {partners::Kind::Dissemination, 0, false, 1}, 60);
      } catch (const std::invalid_argument& e) {
        error = e.what();
      }
      check(error.find("the same number of ranks on every node") != std::string::npos &&
                error.find(std::to_string(p % k) + " to " + std::to_string(k)) != std::string::npos,
            "uneven nodes: want one line naming the sizes, got '" + error + "'", world.rank());
      if (world.rank() == 0 && failures == 0)
        std::printf("uneven nodes refused: %s\n", error.c_str());
    } else {
      run(world, partners::Kind::Dissemination, false);
      run(world, partners::Kind::Dissemination, true);
      run(world, partners::Kind::Ring, false);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: FAIL: %s\n", world.rank(), e.what());
    return 1;
  }
  return failures == 0 ? 0 : 1;
}
