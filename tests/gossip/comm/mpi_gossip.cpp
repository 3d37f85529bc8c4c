// Run under mpirun with P ranks: every transport and threading mode delivers exactly the
// partner's bytes, the mixed values follow the simulator's prediction step by step, and random
// delays on the ranks cause no deadlock. With GG_RANKS_PER_NODE=N (simulated nodes of N ranks)
// the cases that need every rank on one node (shm) are left out and auto mixes shm and rma.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gossip/comm/exchange.hpp"
#include "gossip/comm/mpi.hpp"
#include "partners/simulator.hpp"
#include "tests/gossip/mpi_check.hpp"

using namespace gg;

namespace {

using test::check;
using test::failures;

// Which world ranks share this rank's node (real or simulated).
std::vector<bool> same_node(const mpi::Comm& world) {
  const mpi::Comm node = world.split_shared();
  std::vector<int> members(node.size());
  const int me = world.rank();
  MPI_Allgather(&me, 1, MPI_INT, members.data(), 1, MPI_INT, node.get());
  std::vector<bool> on(world.size(), false);
  for (int r : members) on[r] = true;
  return on;
}

bool one_node(const mpi::Comm& world) { return world.split_shared().size() == world.size(); }

// Buckets of uneven sizes, the last element of the buffer in bucket 0 (as backward makes them).
std::vector<kernels::Bucket> make_layout(int64_t count) {
  std::vector<kernels::Bucket> b;
  int64_t end = count, size = 1;
  while (end > 0) {
    const int64_t begin = std::max<int64_t>(0, end - size);
    b.push_back({begin, end});
    end = begin;
    size = size * 3 + 5;
  }
  return b;
}

float initial(int rank, int64_t i) { return static_cast<float>((rank * 7 + i * 3) % 64); }

std::vector<float> initial_values(int rank, int64_t count) {
  std::vector<float> x(count);
  for (int64_t i = 0; i < count; ++i) x[i] = initial(rank, i);
  return x;
}

// Every rank's values against the simulator's prediction after `steps` steps from the start
// values, element by element (every `stride`-th element); reports and checks the worst error.
void check_against_simulator(const mpi::Comm& world, const std::vector<float>& x,
                             const partners::Schedule& schedule, int steps, int64_t stride,
                             const std::string& name) {
  const int rank = world.rank(), p = world.size();
  const int64_t count = static_cast<int64_t>(x.size());
  std::vector<float> all(static_cast<size_t>(count) * p, 0.f);
  std::copy(x.begin(), x.end(), all.begin() + rank * count);
  world.allreduce_sum(all.data(), static_cast<int64_t>(all.size()));
  double worst = 0;
  for (int64_t i = 0; i < count; i += stride) {
    std::vector<double> start(p);
    for (int v = 0; v < p; ++v) start[v] = initial(v, i);
    const std::vector<double> want = partners::mix(schedule, start, 0, steps);
    for (int v = 0; v < p; ++v) worst = std::max(worst, std::fabs(all[v * count + i] - want[v]));
  }
  check(worst < 1e-4, name + ": matches the simulator (max error " + std::to_string(worst) + ")",
        rank);
  if (rank == 0) std::printf("%-48s max |engine - simulator| = %.2g\n", name.c_str(), worst);
}

// home: the exchange provides the buffer (in shared memory for shm/auto), and partners that pair
// up average it in place; the test checks such steps happened where the schedule pairs ranks.
void run_case(const mpi::Comm& world, const std::string& transport, const std::string& threading,
              partners::Kind kind, bool rotate, bool delays, bool home = false) {
  if (transport == "shm" && !one_node(world)) return;
  const int rank = world.rank(), p = world.size();
  const int64_t count = 1000;
  const int steps = 7;
  const std::vector<bool> local = same_node(world);
  const auto buckets = make_layout(count);
  std::vector<float> x = initial_values(rank, count);
  gossip::GossipOptions o;
  o.schedule = {kind, p, rotate, 42};
  o.transport = transport;
  o.threading = gossip::parse_threading(threading);
  o.comm_threads = 3;
  const std::string name = transport + "/" + threading + "/" + partners::kind_name(kind) +
                           (rotate ? "+rotate" : "") + (delays ? "+delays" : "") +
                           (home ? "+home" : "");
  if (rank == 0 && std::getenv("GG_TRACE")) std::fprintf(stderr, "start %s\n", name.c_str());
  std::mt19937 rng(1000 + rank);
  {
    gossip::GossipExchange ex(world, home ? nullptr : x.data(), buckets, o);
    float* buf = ex.buffer();
    if (home) std::copy(x.begin(), x.end(), buf);
    int paired = 0, pair_steps = 0;
    for (int s = 0; s < steps; ++s) {
      const partners::Partners peers = ex.partners_at(s);
      pair_steps += peers.send_to == peers.recv_from && local[peers.send_to];
      paired += ex.in_place(peers);
      ex.begin_step(s);
      for (int b = 0; b < static_cast<int>(buckets.size()); ++b) {
        if (delays) std::this_thread::sleep_for(std::chrono::microseconds(rng() % 2000));
        ex.on_bucket_ready(b);
      }
      ex.finish_step();
      if (s == 0) {
        // Exactly the partner's bytes: the values are small integers, so (a + b) / 2 is exact.
        const int from = ex.partners_at(0).recv_from;
        bool exact = true;
        for (int64_t i = 0; i < count; ++i)
          exact &= buf[i] == 0.5f * (initial(rank, i) + initial(from, i));
        check(exact, name + ": step 0 holds exactly (mine + partner's) / 2", rank);
      }
    }
    const bool shared = home && transport != "p2p" && transport != "rma";
    check(paired == (shared ? pair_steps : 0),
          name + ": " + std::to_string(paired) + " steps averaged in place, expected " +
              std::to_string(shared ? pair_steps : 0),
          rank);
    if (home) std::copy(buf, buf + count, x.begin());
  }
  check_against_simulator(world, x, o.schedule, steps, 37, name);
}

// Staleness 1 never waits for the partner: values stay convex combinations of the start
// values (within their range), and nothing deadlocks under random delays.
void run_stale(const mpi::Comm& world, const std::string& transport) {
  if (transport == "shm" && !one_node(world)) return;
  const int rank = world.rank(), p = world.size();
  const int64_t count = 500;
  const auto buckets = make_layout(count);
  std::vector<float> x = initial_values(rank, count);
  gossip::GossipOptions o;
  o.schedule = {partners::Kind::Dissemination, p, true, 7};
  o.transport = transport;
  o.staleness = 1;
  std::mt19937 rng(77 + rank);
  {
    gossip::GossipExchange ex(world, x.data(), buckets, o);
    for (int s = 0; s < 12; ++s) {
      ex.begin_step(s);
      for (int b = 0; b < static_cast<int>(buckets.size()); ++b) {
        std::this_thread::sleep_for(std::chrono::microseconds(rng() % 1500));
        ex.on_bucket_ready(b);
      }
      ex.finish_step();
    }
  }
  bool ok = true;
  for (float v : x) ok &= std::isfinite(v) && v >= 0.f && v <= 63.f;
  check(ok, transport + "/staleness 1: values stay within the start range", rank);
  if (rank == 0) std::printf("%-48s ok\n", (transport + "/funneled/staleness 1+delays").c_str());
}

// Delayed (overlapped) averaging applied right away equals in-place averaging: the values are
// dyadic, so x + (y - x) / 2 and (x + y) / 2 round alike, and must match the simulator exactly.
void run_delayed(const mpi::Comm& world, const std::string& transport) {
  if (transport == "shm" && !one_node(world)) return;
  const int rank = world.rank(), p = world.size();
  const int64_t count = 300;
  const auto buckets = make_layout(count);
  std::vector<float> x = initial_values(rank, count);
  gossip::GossipOptions o;
  o.schedule = {partners::Kind::Dissemination, p, true, 5};
  o.transport = transport;
  o.delayed = true;
  const int steps = 5;
  {
    gossip::GossipExchange ex(world, x.data(), buckets, o);
    for (int s = 0; s < steps; ++s) {
      ex.start_delayed(s);
      ex.finish_delayed();
    }
  }
  check_against_simulator(world, x, o.schedule, steps, 13, transport + "/delayed");
}

}  // namespace

int main(int argc, char** argv) {
  mpi::Environment env(&argc, &argv);
  const mpi::Comm world = mpi::Comm::world();
  const int p = world.size();
  const bool pow2 = (p & (p - 1)) == 0;
  try {
    for (const char* transport : {"p2p", "rma", "shm", "auto"})
      for (const char* threading : {"funneled", "concurrent", "chained"})
        run_case(world, transport, threading, partners::Kind::Dissemination, true, false);
    for (const char* transport : {"p2p", "rma", "shm"})
      run_case(world, transport, "funneled", partners::Kind::Dissemination, true, true);
    run_case(world, "rma", "concurrent", partners::Kind::Random, false, true);
    run_case(world, "shm", "concurrent", partners::Kind::Random, false, true);
    // Zero-copy pairs: at p = 2 every step pairs, at p = 4 and 8 every other / third step.
    for (const char* threading : {"funneled", "concurrent", "chained"})
      run_case(world, "shm", threading, partners::Kind::Dissemination, true, true, true);
    run_case(world, "auto", "funneled", partners::Kind::Random, false, false, true);
    run_case(world, "p2p", "funneled", partners::Kind::Dissemination, true, false, true);
    run_case(world, "rma", "funneled", partners::Kind::Ring, false, false);
    run_delayed(world, "shm");
    run_delayed(world, "p2p");
    run_delayed(world, "rma");
    run_stale(world, "shm");
    run_stale(world, "p2p");
    run_stale(world, "rma");
    run_stale(world, "auto");
    run_delayed(world, "auto");
    run_case(world, "auto", "concurrent", partners::Kind::Dissemination, true, true, true);
    if (pow2) run_case(world, "auto", "funneled", partners::Kind::Hypercube, true, true);
    if (pow2) run_case(world, "shm", "funneled", partners::Kind::Hypercube, true, false, true);
    if (pow2) run_case(world, "rma", "chained", partners::Kind::Hypercube, true, true);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: error: %s\n", world.rank(), e.what());
    ++failures;
  }
  int bad = failures;
  MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (world.rank() == 0) std::printf("gossip exchange on %d ranks: %s\n", p, bad ? "FAIL" : "PASS");
  return bad ? 1 : 0;
}
