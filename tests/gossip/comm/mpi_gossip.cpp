// Run under mpirun with P ranks: every transport and threading mode delivers exactly the
// partner's bytes, the mixed values follow the simulator's prediction step by step, and random
// delays on the ranks cause no deadlock. With GG_RANKS_PER_NODE=N (simulated nodes of N ranks)
// the cases that need every rank on one node (shm) are left out and auto mixes shm and p2p.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "gossip/comm/exchange.hpp"
#include "gossip/comm/low_rank.hpp"
#include "gossip/comm/mpi.hpp"
#include "partners/simulator.hpp"
#include "tests/gossip/bucket_layout.hpp"
#include "tests/gossip/mpi_check.hpp"

using namespace gg;

namespace {

// The copies (or factors) of `kind` an exchange saves into a rank's state, as its rule holds them.
std::vector<gossip::PublicCopy> saved_parts(const gossip::GossipExchange& ex,
                                            std::string_view kind) {
  std::vector<gossip::StatePart> parts;
  ex.save_state(parts, {});
  return gossip::copies_in(parts, kind);
}

using test::check;
using test::failures;
using test::make_layout;

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
  bool bits = true;  // the float simulator rounds as the engine does
  for (int64_t i = 0; i < count; i += stride) {
    std::vector<double> start(p);
    std::vector<float> start_f(p);
    for (int v = 0; v < p; ++v) start_f[v] = static_cast<float>(start[v] = initial(v, i));
    const std::vector<double> want = partners::mix(schedule, start, 0, steps);
    const std::vector<float> want_f = partners::mix(schedule, start_f, 0, steps);
    for (int v = 0; v < p; ++v) {
      worst = std::max(worst, std::fabs(all[v * count + i] - want[v]));
      bits &= all[v * count + i] == want_f[v];
    }
  }
  check(worst < 1e-4, name + ": matches the simulator (max error " + std::to_string(worst) + ")",
        rank);
  check(bits, name + ": matches the float simulator bit for bit", rank);
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
  o.transport = gossip::parse_transport(transport);
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
        // Exactly the partners' bytes: the values are small integers, so (a + b) / 2 is exact;
        // with two links the sum is, and the engine divides it once.
        const partners::Partners q = ex.partners_at(0);
        bool exact = true;
        for (int64_t i = 0; i < count; ++i) {
          float sum = initial(rank, i);
          for (int l = 0; l < q.links(); ++l) sum += initial(q.link(l).recv_from, i);
          exact &=
              buf[i] == (q.links() == 1 ? 0.5f * sum : sum / static_cast<float>(q.links() + 1));
        }
        check(exact, name + ": step 0 holds exactly the mean of mine and the partners'", rank);
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
// values (within their range), and nothing deadlocks under random delays. Rank 0 also holds
// its buckets back for 100 ms at step 5, so its receiver finds them late: with skip_late no
// rank ever mixes a bucket from the step before.
// Staleness 1 with random delays; `first` > 0: an exchange made after step 0 (a resume, a
// supervise restore, a rebuild after a failure or apoptosis), whose first step has no previous
// exchange to wait for (issue 31: it waited forever). A timeout fails a regression instead of
// hanging the test.
void run_stale(const mpi::Comm& world, const std::string& transport, bool skip, int64_t first = 0) {
  if (transport == "shm" && !one_node(world)) return;
  const int rank = world.rank(), p = world.size();
  const int64_t count = 500;
  const auto buckets = make_layout(count);
  std::vector<float> x = initial_values(rank, count);
  gossip::GossipOptions o;
  o.schedule = {partners::Kind::Dissemination, p, true, 7};
  o.transport = gossip::parse_transport(transport);
  o.staleness = 1;
  o.skip_late = skip;
  o.timeout_s = 20;
  std::mt19937 rng(77 + rank);
  gossip::BucketExchange::Lateness late;
  const int steps = 12;
  {
    gossip::GossipExchange ex(world, x.data(), buckets, o);
    ex.set_first_step(first);
    for (int64_t s = first; s < first + steps; ++s) {
      ex.begin_step(s);
      if (rank == 0 && s == first + 5) std::this_thread::sleep_for(std::chrono::milliseconds(100));
      for (int b = 0; b < static_cast<int>(buckets.size()); ++b) {
        std::this_thread::sleep_for(std::chrono::microseconds(rng() % 1500));
        ex.on_bucket_ready(b);
      }
      ex.finish_step();
    }
    late = ex.lateness();
  }
  const std::string name = transport + "/funneled/staleness 1" + (skip ? "+skip" : "") + "+delays" +
                           (first > 0 ? " from step " + std::to_string(first) : "");
  bool ok = true;
  for (float v : x) ok &= std::isfinite(v) && v >= 0.f && v <= 63.f;
  check(ok, name + ": values stay within the start range", rank);
  if (skip) check(late.late == 0, name + ": no bucket mixed from the step before", rank);
  // Without skip a bucket is mixed at the latest one step late: an exchange that never mixes
  // anything fails (with skip, a slow link may legitimately leave every bucket late).
  const int64_t n = static_cast<int64_t>(buckets.size());
  if (!skip) check(late.unmixed < steps * n, name + ": partners' buckets were mixed", rank);
  int64_t counts[2] = {late.late, late.unmixed};
  world.allreduce_sum(counts, 2);
  if (rank == 0)
    std::printf("%-48s ok (late %lld, unmixed %lld)\n", name.c_str(),
                static_cast<long long>(counts[0]), static_cast<long long>(counts[1]));
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
  o.transport = gossip::parse_transport(transport);
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

// The lossy wires: every rank's values equal, bit for bit, a replay of the whole job in which
// x_v <- (x_v + wire(x_from + r_from)) / 2 and, with error feedback, r_v <- (x_v + r_v) -
// wire(x_v + r_v) before the mix, bucket by bucket (int8 / int4 blocks start at each bucket);
// the bytes sent are what the wire takes (bf16: half of fp32, odd buckets padded; int8 / int4:
// a scale per block of 64 and a byte or half a byte a value, padded to whole floats).
std::vector<float> replay_wire(gossip::Wire w, std::span<const float> x, std::span<float> r,
                               std::optional<uint64_t> stochastic = std::nullopt) {
  std::vector<float> room(static_cast<size_t>(gossip::wire_floats(w, std::ssize(x)))),
      back(x.size());
  if (w == gossip::Wire::Bf16) {
    gossip::pack_bf16(x, r, reinterpret_cast<uint16_t*>(room.data()));
    gossip::unpack_bf16(reinterpret_cast<const uint16_t*>(room.data()), back);
  } else {
    gossip::pack_quant(w, x, r, room.data(), stochastic);
    gossip::unpack_quant(w, room.data(), back);
  }
  return back;
}
int64_t wire_bytes(gossip::Wire w, int64_t n) {
  const int64_t blocks = (n + 63) / 64;
  return 4 * (w == gossip::Wire::Fp32   ? n
              : w == gossip::Wire::Bf16 ? (n + 1) / 2
              : w == gossip::Wire::Int8 ? blocks + (n + 3) / 4
                                        : blocks + (n + 7) / 8);
}

// A lossy wire's exchange on `transport`: dissemination with rotation (seed), p ranks.
gossip::GossipOptions wire_options(int p, const std::string& transport,
                                   const std::string& threading, gossip::Wire w, uint64_t seed) {
  gossip::GossipOptions o;
  o.schedule = {partners::Kind::Dissemination, p, true, seed};
  o.transport = gossip::parse_transport(transport);
  o.threading = gossip::parse_threading(threading);
  o.wire = w;
  return o;
}
const char* wire_name(gossip::Wire w) {
  return w == gossip::Wire::Fp32   ? "fp32"
         : w == gossip::Wire::Bf16 ? "bf16"
         : w == gossip::Wire::Int8 ? "int8"
                                   : "int4";
}
// The exchange sent exactly the wire's bytes of every bucket in every step.
void check_wire_bytes(const std::string& name, int64_t sent,
                      const std::vector<kernels::Bucket>& buckets, gossip::Wire w, int steps,
                      int rank) {
  int64_t bytes = 0;
  for (const kernels::Bucket& b : buckets) bytes += wire_bytes(w, b.size());
  check(
      sent == bytes * steps,
      name + ": sent " + std::to_string(sent) + " bytes, expected " + std::to_string(bytes * steps),
      rank);
  if (rank == 0)
    std::printf("%-48s exact, %lld bytes sent\n", name.c_str(), static_cast<long long>(sent));
}

// stochastic: int8 / int4 rounded stochastically, each rank's draws keyed by (seed, rank, step,
// bucket) as wire_key and bucket_key say.
void run_wire(const mpi::Comm& world, const std::string& transport, gossip::Wire w, bool feedback,
              const std::string& threading = "funneled", bool stochastic = false) {
  if (transport == "shm" && !one_node(world)) return;
  const int rank = world.rank(), p = world.size();
  const int64_t count = 500;
  const int steps = 6;
  const auto buckets = make_layout(count);
  gossip::GossipOptions o = wire_options(p, transport, threading, w, 9);
  o.error_feedback = feedback;
  o.stochastic = stochastic;
  // Start values that no lossy wire holds exactly: every send rounds.
  auto start = [](int v, int64_t i) {
    return 1.0f + static_cast<float>((v * 131 + i * 17) % 997) / 997;
  };
  std::vector<float> x(count);
  for (int64_t i = 0; i < count; ++i) x[i] = start(rank, i);
  int64_t sent = 0;
  {
    gossip::GossipExchange ex(world, x.data(), buckets, o);
    for (int s = 0; s < steps; ++s) {
      ex.begin_step(s);
      for (int b = 0; b < static_cast<int>(buckets.size()); ++b) ex.on_bucket_ready(b);
      ex.finish_step();
    }
    sent = ex.bytes_sent();
  }
  // The replay: every rank's values and residues, step by step.
  std::vector<std::vector<float>> all(p, std::vector<float>(count)),
      res(p, std::vector<float>(count, 0.f));
  for (int v = 0; v < p; ++v)
    for (int64_t i = 0; i < count; ++i) all[v][i] = start(v, i);
  for (int s = 0; s < steps; ++s) {
    std::vector<std::vector<float>> wire(p, std::vector<float>(count));
    for (int v = 0; v < p; ++v)
      for (size_t b = 0; b < buckets.size(); ++b) {
        const kernels::Bucket& k = buckets[b];
        const auto n = static_cast<size_t>(k.size());
        const std::optional<uint64_t> key =
            stochastic ? std::optional<uint64_t>(gossip::bucket_key(
                             gossip::wire_key(o.schedule.seed, v, s), static_cast<int>(b)))
                       : std::nullopt;
        const std::vector<float> back = replay_wire(
            w, {all[v].data() + k.begin, n},
            feedback ? std::span<float>(res[v].data() + k.begin, n) : std::span<float>(), key);
        std::copy(back.begin(), back.end(), wire[v].begin() + k.begin);
      }
    for (int v = 0; v < p; ++v) {
      const int from = partners::partners(o.schedule, v, s).recv_from;
      for (int64_t i = 0; i < count; ++i) all[v][i] = 0.5f * (all[v][i] + wire[from][i]);
    }
  }
  bool exact = true;
  for (int64_t i = 0; i < count; ++i) exact &= x[i] == all[rank][i];
  const std::string name = transport + "/" + threading + "/" + wire_name(w) +
                           (feedback ? "+feedback" : "") + (stochastic ? "+stochastic" : "");
  check(exact, name + ": equals the replay bit for bit", rank);
  check_wire_bytes(name, sent, buckets, w, steps, rank);
}

// The weights' exchange of `steps` steps as the trainer drives it: x moves by update(s) before
// each exchange (delayed: the exchange runs behind update(s + 100) and its correction follows).
// Returns the bytes the exchange sent; keep(ex) reads what it holds before it is destroyed.
template <class Update, class Keep>
int64_t drive_weights(const mpi::Comm& world, std::vector<float>& x,
                      const std::vector<kernels::Bucket>& buckets, const gossip::GossipOptions& o,
                      int64_t steps, Update update, Keep keep) {
  gossip::GossipExchange ex(world, x.data(), buckets, o);
  for (int64_t s = 0; s < steps; ++s) {
    update(s);
    if (!o.delayed) {
      ex.exchange_all(s);
      continue;
    }
    ex.start_delayed(s);
    update(s + 100);
    ex.finish_delayed();
  }
  keep(ex);
  return ex.bytes_sent();
}

// CHOCO's public copies on a transport: x moves between steps (an update), the weights' exchange
// sends the difference to the copy the partner holds (delayed: of the snapshot, the correction
// applied after the update). Every rank's values and copies equal a replay of the arithmetic
// written out here, bit for bit, with the bytes of the wire.
void run_choco(const mpi::Comm& world, const std::string& transport, gossip::Wire w, bool delayed,
               const std::string& threading = "funneled") {
  if (transport == "shm" && !one_node(world)) return;
  const int rank = world.rank(), p = world.size();
  const int64_t count = 300;
  const int steps = 8;
  const auto buckets = make_layout(count);
  gossip::GossipOptions o = wire_options(p, transport, threading, w, 5);
  o.public_copies = true;
  o.delayed = delayed;
  auto start = [](int v, int64_t i) { return std::sin(0.1f * static_cast<float>(i) + v); };
  auto update = [](std::vector<float>& x, int v, int s) {
    for (size_t i = 0; i < x.size(); ++i) x[i] -= 0.01f * std::cos(0.3f * i + v * s);
  };
  std::vector<float> x(count);
  for (int64_t i = 0; i < count; ++i) x[i] = start(rank, i);
  std::vector<gossip::PublicCopy> copies;
  const int64_t sent = drive_weights(
      world, x, buckets, o, steps, [&](int64_t s) { update(x, rank, static_cast<int>(s)); },
      [&](gossip::GossipExchange& ex) { copies = saved_parts(ex, gossip::kPublicCopiesKind); });
  // The replay: copies[v][peer] (mine: true / false), every rank's values.
  std::vector<std::vector<float>> all(p, std::vector<float>(count));
  std::vector<std::map<std::pair<int, bool>, std::vector<float>>> copy(p);
  auto copy_of = [&](int v, int peer, bool mine) -> std::vector<float>& {
    std::vector<float>& c = copy[v][{peer, mine}];
    c.resize(static_cast<size_t>(count), 0.f);
    return c;
  };
  for (int v = 0; v < p; ++v)
    for (int64_t i = 0; i < count; ++i) all[v][i] = start(v, i);
  for (int s = 0; s < steps; ++s) {
    std::vector<std::vector<float>> q(p, std::vector<float>(count));
    for (int v = 0; v < p; ++v) {
      update(all[v], v, s);
      std::vector<float>& mine = copy_of(v, partners::partners(o.schedule, v, s).send_to, true);
      std::vector<float> d(count);
      for (int64_t i = 0; i < count; ++i) d[i] = all[v][i] - mine[i];
      for (const kernels::Bucket& k : buckets) {
        const auto n = static_cast<size_t>(k.size());
        const std::vector<float> back = replay_wire(w, {d.data() + k.begin, n}, {});
        std::copy(back.begin(), back.end(), q[v].begin() + k.begin);
      }
      for (int64_t i = 0; i < count; ++i) mine[i] += q[v][i];
    }
    for (int v = 0; v < p; ++v) {
      const partners::Partners peers = partners::partners(o.schedule, v, s);
      std::vector<float>& theirs = copy_of(v, peers.recv_from, false);
      const std::vector<float>& mine = copy_of(v, peers.send_to, true);
      for (int64_t i = 0; i < count; ++i) theirs[i] += q[peers.recv_from][i];
      std::vector<float> delta(count);
      for (int64_t i = 0; i < count; ++i) delta[i] = 0.5f * (theirs[i] - mine[i]);
      if (delayed) update(all[v], v, s + 100);
      for (int64_t i = 0; i < count; ++i) all[v][i] += delta[i];
    }
  }
  bool exact = true;
  for (int64_t i = 0; i < count; ++i) exact &= x[i] == all[rank][i];
  exact &= copies.size() == copy[rank].size();
  for (const gossip::PublicCopy& c : copies)
    exact &= copy[rank].count({c.peer, c.mine}) && copy[rank][{c.peer, c.mine}] == c.values;
  const std::string name =
      transport + "/" + threading + "/" + wire_name(w) + "+choco" + (delayed ? "+delayed" : "");
  check(exact, name + ": values and public copies equal the replay bit for bit", rank);
  check_wire_bytes(name, sent, buckets, w, steps, rank);
}

// Low-rank gossip (PowerGossip) on a transport, pairs of the hypercube: x moves between steps
// as in run_choco. Every rank's values and factors equal, bit for bit, a replay of the job in
// one process through the same rules (make_rule) and codecs, where every message is handed over
// by hand (tests/gossip/comm/test_low_rank.cpp checks the rule's arithmetic itself); the bytes
// sent are the messages' on the wire.
void run_low_rank(const mpi::Comm& world, const std::string& transport, gossip::Wire w,
                  bool delayed, const std::string& threading = "funneled") {
  if (transport == "shm" && !one_node(world)) return;
  const int rank = world.rank(), p = world.size();
  const int64_t count = 240, steps = 8;
  // A 6 x 5 matrix and a vector in bucket 1; an 8 x 24 matrix and a vector in bucket 0.
  const std::vector<kernels::Bucket> buckets = {{40, 240}, {0, 40}};
  gossip::GossipOptions o = wire_options(p, transport, threading, w, 5);
  o.schedule = {partners::Kind::Hypercube, p};
  o.low_rank = 2;
  o.matrices = {{0, 30, 6, 5}, {30, 10}, {40, 192, 8, 24}, {232, 8}};
  o.delayed = delayed;
  auto start = [](int v, int64_t i) { return std::sin(0.1f * static_cast<float>(i * i) + v); };
  auto update = [](float* x, int v, int64_t s) {
    for (int64_t i = 0; i < 240; ++i) x[i] -= 0.01f * std::cos(0.3f * i + v * s);
  };
  std::vector<float> x(count);
  for (int64_t i = 0; i < count; ++i) x[i] = start(rank, i);
  std::vector<gossip::PublicCopy> factors;
  const int64_t sent = drive_weights(
      world, x, buckets, o, steps, [&](int64_t s) { update(x.data(), rank, s); },
      [&](gossip::GossipExchange& ex) { factors = saved_parts(ex, gossip::kLowRankKind); });
  // The replay: p rules in this process.
  std::vector<std::vector<float>> all(p, std::vector<float>(count));
  std::vector<std::unique_ptr<gossip::MixingRule>> rules;
  std::vector<std::unique_ptr<gossip::WireCodec>> codecs;
  const std::vector<kernels::Bucket> wire = gossip::wire_buckets(o, buckets);
  for (int v = 0; v < p; ++v) {
    for (int64_t i = 0; i < count; ++i) all[v][i] = start(v, i);
    rules.push_back(gossip::make_rule(o, all[v].data(), buckets, v));
    codecs.push_back(std::make_unique<gossip::WireCodec>(w, false, wire));
  }
  const auto& layout = codecs[0]->layout();
  for (int64_t s = 0; s < steps; ++s) {
    std::vector<std::vector<float>> out(p, std::vector<float>(codecs[0]->floats()));
    for (int v = 0; v < p; ++v) {
      update(all[v].data(), v, s);
      if (delayed) dynamic_cast<gossip::DelayedAverage&>(*rules[v]).snapshot();
      rules[v]->begin_step(s, partners::partners(o.schedule, v, s));
      for (int b = 0; b < 2; ++b) {
        const float* image = gossip::encode_outgoing(*rules[v], *codecs[v], b);
        std::copy(image, image + layout[b].size(), out[v].begin() + layout[b].begin);
      }
    }
    for (int v = 0; v < p; ++v) {
      const int from = partners::partners(o.schedule, v, s).recv_from;
      for (int b = 0; b < 2; ++b)
        rules[v]->received(b, s, codecs[v]->decode(b, out[from].data() + layout[b].begin));
      if (!delayed) continue;
      update(all[v].data(), v, s + 100);
      dynamic_cast<gossip::DelayedAverage&>(*rules[v]).apply();
    }
  }
  bool exact = all[rank] == x;
  const std::vector<gossip::PublicCopy> replayed =
      gossip::saved_copies(*rules[rank], gossip::kLowRankKind);
  exact &= replayed.size() == factors.size() && !factors.empty();
  for (size_t i = 0; exact && i < factors.size(); ++i)
    exact &= factors[i].peer == replayed[i].peer && factors[i].values == replayed[i].values;
  const std::string name =
      transport + "/" + threading + "/" + wire_name(w) + "+low-rank" + (delayed ? "+delayed" : "");
  check(exact, name + ": values and factors equal the replay bit for bit", rank);
  check_wire_bytes(name, sent, wire, w, static_cast<int>(steps), rank);
}

// The transport's own counters say who carried what: after a few steps every peer's buckets and
// bytes, sent and received, equal what the schedule predicts, all of them on the transport that
// should carry that peer (auto: shm within this rank's node, p2p across) and none on another.
void run_counters(const mpi::Comm& world, const std::string& transport, bool home) {
  if (transport == "shm" && !one_node(world)) return;
  const int rank = world.rank(), p = world.size();
  const int64_t count = 700;
  const auto buckets = make_layout(count);
  const int64_t nb = static_cast<int64_t>(buckets.size());
  const std::vector<bool> local = same_node(world);
  std::vector<float> x = initial_values(rank, count);
  gossip::GossipOptions o;
  o.schedule = {partners::Kind::Dissemination, p, true, 11};
  o.transport = gossip::parse_transport(transport);
  const std::string name = transport + "/counters" + (home ? "+home" : "");
  const auto carrier = [&](int peer) -> std::string {
    if (transport != "auto") return transport;
    return local[peer] ? "shm" : "p2p";
  };
  std::vector<gossip::PeerTraffic> want(p);
  std::vector<gossip::TransportTraffic> got;
  {
    gossip::GossipExchange ex(world, home ? nullptr : x.data(), buckets, o);
    if (home) std::copy(x.begin(), x.end(), ex.buffer());
    for (int s = 0; s < 9; ++s) {
      const partners::Partners peers = ex.partners_at(s);
      want[peers.send_to].buckets_sent += nb;
      want[peers.send_to].bytes_sent += count * 4;
      want[peers.recv_from].buckets_received += nb;
      want[peers.recv_from].bytes_received += count * 4;
      if (ex.in_place(peers)) want[peers.send_to].buckets_in_place += nb;
      ex.exchange_all(s);
    }
    got = ex.transport_counters();
  }
  bool ok = true;
  std::string why;
  const auto same = [](const gossip::PeerTraffic& a, const gossip::PeerTraffic& b) {
    return a.buckets_sent == b.buckets_sent && a.bytes_sent == b.bytes_sent &&
           a.buckets_received == b.buckets_received && a.bytes_received == b.bytes_received &&
           a.buckets_in_place == b.buckets_in_place;
  };
  for (int r = 0; r < p; ++r) {
    int carried = 0;
    for (const gossip::TransportTraffic& t : got) {
      if (static_cast<int>(t.peers.size()) != p) {
        ok = false;
        why = t.transport + " counts " + std::to_string(t.peers.size()) + " peers";
        continue;
      }
      const gossip::PeerTraffic& c = t.peers[r];
      if (t.transport == carrier(r)) {
        ++carried;
        if (!same(c, want[r])) {
          ok = false;
          why = t.transport + " to rank " + std::to_string(r) + ": sent " +
                std::to_string(c.buckets_sent) + " buckets / " + std::to_string(c.bytes_sent) +
                " B, received " + std::to_string(c.buckets_received) + " / " +
                std::to_string(c.bytes_received) + " B, in place " +
                std::to_string(c.buckets_in_place) + "; expected " +
                std::to_string(want[r].buckets_sent) + " / " + std::to_string(want[r].bytes_sent) +
                ", " + std::to_string(want[r].buckets_received) + " / " +
                std::to_string(want[r].bytes_received) + ", " +
                std::to_string(want[r].buckets_in_place);
        }
      } else if (!same(c, gossip::PeerTraffic{})) {
        ok = false;
        why = t.transport + " carried traffic with rank " + std::to_string(r) + ", which " +
              carrier(r) + " should carry";
      }
    }
    const bool any = want[r].buckets_sent + want[r].buckets_received > 0;
    if (any && carried != 1) {
      ok = false;
      why = std::to_string(carried) + " counters named " + carrier(r) + " for rank " +
            std::to_string(r);
    }
  }
  check(ok, name + ": " + why, rank);
  // Totals over the job, by transport name, for the log (and the cluster test's grep).
  std::vector<double> sums(3, 0.0);  // shm, rma, p2p buckets sent
  for (const gossip::TransportTraffic& t : got)
    for (const gossip::PeerTraffic& c : t.peers)
      sums[t.transport == "shm"   ? 0
           : t.transport == "rma" ? 1
                                  : 2] += static_cast<double>(c.buckets_sent);
  world.allreduce_sum(sums.data(), 3);
  if (rank == 0)
    std::printf("%-48s buckets sent: shm %.0f, rma %.0f, p2p %.0f\n", name.c_str(), sums[0],
                sums[1], sums[2]);
}

// A pipelined exchange sends what backward hands over while it waits for a partner: rank p-1
// holds its buckets back (ring: it is rank 0's sender); rank 0 hands over bucket 0, then bucket
// 1 while its communication thread waits for p-1's bucket 0. Bucket 1 must go on the wire before
// p-1 sends anything (before, it waited behind bucket 0's completion).
void run_pipelined_sends_while_waiting(const mpi::Comm& world, const std::string& transport) {
  if (transport == "shm" && !one_node(world)) return;
  const int rank = world.rank(), p = world.size();
  if (p < 2) return;
  const int64_t count = 1000;
  const auto buckets = make_layout(count);
  std::vector<float> x = initial_values(rank, count);
  gossip::GossipOptions o;
  o.schedule = {partners::Kind::Ring, p, false, 42};
  o.transport = gossip::parse_transport(transport);
  o.pipelined = true;
  o.timeout_s = 30;
  const std::string name = transport + "/pipelined: sends while waiting for a partner";
  const bool held = rank == p - 1;
  {
    gossip::GossipExchange ex(world, x.data(), buckets, o);
    ex.begin_step(0);
    if (held) MPI_Barrier(MPI_COMM_WORLD);
    ex.on_bucket_ready(0);
    if (!held) std::this_thread::sleep_for(std::chrono::milliseconds(200));
    ex.on_bucket_ready(1);
    if (rank == 0) {
      const int64_t want = 4 * (buckets[0].size() + buckets[1].size());
      const auto t0 = std::chrono::steady_clock::now();
      while (ex.bytes_sent() < want &&
             std::chrono::steady_clock::now() - t0 < std::chrono::seconds(3))
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      check(ex.bytes_sent() >= want,
            name + ": " + std::to_string(ex.bytes_sent()) + " bytes sent, expected " +
                std::to_string(want),
            rank);
    }
    if (!held) MPI_Barrier(MPI_COMM_WORLD);
    for (int b = 2; b < static_cast<int>(buckets.size()); ++b) ex.on_bucket_ready(b);
    ex.finish_step();
  }
  const int from = (rank + p - 1) % p;
  bool exact = true;
  for (int64_t i = 0; i < count; ++i) exact &= x[i] == 0.5f * (initial(rank, i) + initial(from, i));
  check(exact, name + ": the step holds exactly (mine + partner's) / 2", rank);
}

// Push-sum over p2p, two peers a step: the weight travels behind each bucket and stays 1 (the
// schedule's links are permutations), the values are the uniform average (rounded another way
// than the average rule's: within 1e-4 of the simulator).
void run_push_sum(const mpi::Comm& world) {
  const int rank = world.rank(), p = world.size();
  if (p < 3) return;
  const int64_t count = 1000;
  const int steps = 7;
  const auto buckets = make_layout(count);
  std::vector<float> x = initial_values(rank, count);
  gossip::GossipOptions o;
  o.schedule = {partners::Kind::Exponential2, p, true, 42};
  o.transport = gossip::TransportKind::P2p;
  o.rule = gossip::RuleKind::PushSum;
  std::vector<gossip::StatePart> parts;
  int64_t sent = 0;
  {
    gossip::GossipExchange ex(world, x.data(), buckets, o);
    for (int s = 0; s < steps; ++s) ex.exchange_all(s);
    ex.save_state(parts, {});
    sent = ex.bytes_sent();
  }
  const std::vector<float> w =
      parts.size() == 1 ? gossip::read_floats(parts[0]) : std::vector<float>();
  check(w == std::vector<float>(buckets.size(), 1.f), "push-sum: every weight is still 1", rank);
  const int64_t want = steps * 2 * 4 * (count + static_cast<int64_t>(buckets.size()));
  check(sent == want,
        "push-sum: " + std::to_string(sent) + " bytes sent, expected " + std::to_string(want) +
            " (each bucket and its weight to two peers a step)",
        rank);
  const int64_t stride = 37;
  std::vector<float> all(static_cast<size_t>(count) * p, 0.f);
  std::copy(x.begin(), x.end(), all.begin() + rank * count);
  world.allreduce_sum(all.data(), static_cast<int64_t>(all.size()));
  double worst = 0;
  for (int64_t i = 0; i < count; i += stride) {
    std::vector<double> start(p);
    for (int v = 0; v < p; ++v) start[v] = initial(v, i);
    const std::vector<double> want_x = partners::mix(o.schedule, start, 0, steps);
    for (int v = 0; v < p; ++v) worst = std::max(worst, std::fabs(all[v * count + i] - want_x[v]));
  }
  check(worst < 1e-4, "push-sum: matches the simulator (max error " + std::to_string(worst) + ")",
        rank);
  if (rank == 0)
    std::printf("%-48s max |engine - simulator| = %.2g\n", "p2p/push-sum/exponential2", worst);
}

// Transports that carry one peer a step refuse a schedule with two, on every rank, in one line.
void run_links_refused(const mpi::Comm& world) {
  if (world.size() < 3) return;
  const int rank = world.rank();
  const std::vector<kernels::Bucket> buckets = make_layout(100);
  std::vector<float> x(100, 0.f);
  for (const char* transport : {"shm", "rma", "auto"}) {
    if (std::string(transport) == "shm" && !one_node(world)) continue;
    gossip::GossipOptions o;
    o.schedule = {partners::Kind::Exponential2, world.size(), true, 1};
    o.transport = gossip::parse_transport(transport);
    std::string what;
    try {
      gossip::GossipExchange ex(world, x.data(), buckets, o);
    } catch (const std::invalid_argument& e) {
      what = e.what();
    }
    check(what == std::string("gossip.transport ") + transport +
                      " carries one peer a step, and the schedule gives 2: set gossip.transport "
                      "= p2p",
          std::string(transport) + " with two peers a step: refused with '" + what + "'", rank);
  }
}

// Across nodes the shm transport is refused on every rank, with one line that names the way out.
void run_shm_refused(const mpi::Comm& world) {
  if (one_node(world)) return;
  const int rank = world.rank();
  const std::vector<kernels::Bucket> buckets = make_layout(100);
  std::vector<float> x(100, 0.f);
  gossip::GossipOptions o;
  o.schedule = {partners::Kind::Dissemination, world.size(), true, 1};
  o.transport = gossip::TransportKind::Shm;
  std::string what;
  try {
    gossip::GossipExchange ex(world, x.data(), buckets, o);
  } catch (const std::invalid_argument& e) {
    what = e.what();
  }
  check(!what.empty(), "shm across nodes: not refused", rank);
  check(what.find('\n') == std::string::npos && what.find("shm") != std::string::npos &&
            what.find("one node") != std::string::npos,
        "shm across nodes: refused with '" + what + "'", rank);
  if (rank == 0) std::printf("%-48s refused: %s\n", "shm across nodes", what.c_str());
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
    for (bool skip : {false, true}) {
      run_stale(world, "shm", skip);
      run_stale(world, "p2p", skip);
      run_stale(world, "rma", skip);
      run_stale(world, "auto", skip);
    }
    run_delayed(world, "auto");
    for (const char* transport : {"shm", "p2p", "rma", "auto"})
      run_stale(world, transport, false, 40);
    run_case(world, "auto", "concurrent", partners::Kind::Dissemination, true, true, true);
    if (pow2) run_case(world, "auto", "funneled", partners::Kind::Hypercube, true, true);
    if (pow2) run_case(world, "shm", "funneled", partners::Kind::Hypercube, true, false, true);
    if (pow2) run_case(world, "rma", "chained", partners::Kind::Hypercube, true, true);
    for (const char* transport : {"p2p", "rma", "shm", "auto"})
      run_counters(world, transport, false);
    run_counters(world, "auto", true);
    run_counters(world, "shm", true);
    run_shm_refused(world);
    // Two peers a step, over p2p: every threading, rotated, with delays.
    if (p >= 3) {
      for (const char* threading : {"funneled", "concurrent", "chained"})
        run_case(world, "p2p", threading, partners::Kind::Exponential2, true, true);
      run_case(world, "p2p", "funneled", partners::Kind::Exponential2, false, false, true);
    }
    run_links_refused(world);
    run_push_sum(world);
    for (const char* transport : {"p2p", "rma", "shm", "auto"})
      run_pipelined_sends_while_waiting(world, transport);
    for (const char* transport : {"p2p", "rma", "shm", "auto"}) {
      run_wire(world, transport, gossip::Wire::Bf16, false);
      run_wire(world, transport, gossip::Wire::Int8, true);
      run_wire(world, transport, gossip::Wire::Int4, false);
    }
    for (const char* transport : {"p2p", "rma", "shm", "auto"}) {
      run_choco(world, transport, gossip::Wire::Int4, false);
      run_choco(world, transport, gossip::Wire::Int8, true);
    }
    run_choco(world, "auto", gossip::Wire::Bf16, false, "concurrent");
    run_choco(world, "p2p", gossip::Wire::Int4, true, "chained");
    if (pow2 && p > 1) {
      for (const char* transport : {"p2p", "rma", "shm", "auto"}) {
        run_low_rank(world, transport, gossip::Wire::Fp32, false);
        run_low_rank(world, transport, gossip::Wire::Bf16, true);
      }
      run_low_rank(world, "auto", gossip::Wire::Fp32, true, "concurrent");
      run_low_rank(world, "p2p", gossip::Wire::Int8, false, "chained");
    }
    run_wire(world, "auto", gossip::Wire::Bf16, true, "concurrent");
    run_wire(world, "auto", gossip::Wire::Int4, true, "concurrent");
    run_wire(world, "p2p", gossip::Wire::Bf16, true, "chained");
    run_wire(world, "rma", gossip::Wire::Int8, false, "chained");
    for (const char* transport : {"p2p", "shm"}) {
      run_wire(world, transport, gossip::Wire::Int4, true, "funneled", true);
      run_wire(world, transport, gossip::Wire::Int8, false, "concurrent", true);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: error: %s\n", world.rank(), e.what());
    ++failures;
  }
  int bad = failures;
  MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  // Nodes as the transports see them: one node communicator leader per node.
  int nodes = world.split_shared().rank() == 0;
  MPI_Allreduce(MPI_IN_PLACE, &nodes, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (world.rank() == 0)
    std::printf("gossip exchange on %d ranks, %d nodes: %s\n", p, nodes, bad ? "FAIL" : "PASS");
  return bad ? 1 : 0;
}
