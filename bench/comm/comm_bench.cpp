// bench/comm: time of one gossip exchange (each transport) against MPI_Allreduce and against a
// local memcpy of the same bytes (on every rank at once, as the exchange runs), for a range of
// sizes, at the rank count it is launched with. --methods A,B,... runs a subset (across
// namespace nodes: p2p,allreduce; shm needs one node).
// Prints the machine and inputs, then CSV rows: ranks,method,bytes,median_s,min_s,runs.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "gossip/comm/exchange.hpp"
#include "gossip/comm/mpi.hpp"

using namespace gg;
using Clock = std::chrono::steady_clock;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Each run's time is the slowest rank's, as a step waits for its exchange to finish everywhere.
template <typename F>
std::vector<double> time_runs(const mpi::Comm& world, int runs, F&& f) {
  std::vector<double> out;
  for (int r = -1; r < runs; ++r) {  // run -1 warms up
    world.barrier();
    const auto t0 = Clock::now();
    f(r + 1);
    double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    world.allreduce_max(&dt, 1);
    if (r >= 0) out.push_back(dt);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  mpi::Environment env(&argc, &argv);
  const mpi::Comm world = mpi::Comm::world();
  const int rank = world.rank(), p = world.size();
  int64_t max_bytes = int64_t{128} << 20;
  int runs = 7;
  // shm: the buffer lives in the shm window and pairs average it in place, as in training;
  // shm-copy: the caller's own buffer, copied into the partner's window (the general path).
  std::vector<std::string> methods = {"memcpy", "shm", "shm-copy", "p2p", "allreduce"};
  if (p == 2) methods.insert(methods.begin() + 4, "rma");
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::string(argv[i]) == "--max-bytes") max_bytes = std::stoll(argv[i + 1]);
    if (std::string(argv[i]) == "--runs") runs = std::stoi(argv[i + 1]);
    if (std::string(argv[i]) == "--methods") {  // a comma-separated subset, in this order
      std::vector<std::string> keep;
      const std::string list = "," + std::string(argv[i + 1]) + ",";
      for (const std::string& m : methods)
        if (list.find("," + m + ",") != std::string::npos) keep.push_back(m);
      methods = keep;
    }
  }
  const int64_t bucket_floats = int64_t{1} << 20;  // 4 MiB buckets, as the trainer would send
  if (rank == 0) {
    char lib[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(lib, &len);
    std::string first_line(lib, std::find(lib, lib + len, '\n'));
    std::printf(
        "# bench/comm: ranks=%d runs=%d (median of the slowest rank per run), buckets of "
        "%lld MiB\n# MPI: %s\n",
        p, runs, static_cast<long long>(bucket_floats * 4 >> 20), first_line.c_str());
    std::printf("ranks,method,bytes,median_s,min_s,runs\n");
  }
  // 4 KiB x 4^k, plus ResNet-50's gradients (25,557,032 floats) and 128 MiB.
  std::vector<int64_t> sizes;
  for (int64_t b = 4096; b <= max_bytes && b < (int64_t{100} << 20); b *= 4) sizes.push_back(b);
  for (int64_t b : {int64_t{25557032} * 4, int64_t{128} << 20})
    if (b <= max_bytes) sizes.push_back(b);
  for (int64_t bytes : sizes) {
    const int64_t n = bytes / 4;
    std::vector<float> x(n, 1.f + rank), scratch(n);
    std::vector<kernels::Bucket> buckets;
    for (int64_t end = n; end > 0; end -= bucket_floats)
      buckets.push_back({std::max<int64_t>(0, end - bucket_floats), end});
    for (const std::string& m : methods) {
      std::vector<double> t;
      if (m == "memcpy") {
        t = time_runs(world, runs, [&](int) { std::memcpy(scratch.data(), x.data(), bytes); });
      } else if (m == "allreduce") {
        t = time_runs(world, runs, [&](int) { world.allreduce_sum(x.data(), n); });
      } else {
        gossip::GossipOptions o;
        o.schedule = {partners::Kind::Dissemination, p, true, 1};
        o.transport = gossip::parse_transport(m == "shm-copy" ? "shm" : m);
        const bool home = m == "shm";
        gossip::GossipExchange ex(world, home ? nullptr : x.data(), buckets, o);
        if (home) std::copy(x.begin(), x.end(), ex.buffer());
        t = time_runs(world, runs, [&](int step) { ex.exchange_all(step); });
      }
      if (rank == 0)
        std::printf("%d,%s,%lld,%.6g,%.6g,%d\n", p, m.c_str(), static_cast<long long>(bytes),
                    median(t), *std::min_element(t.begin(), t.end()), runs);
      std::fflush(stdout);
    }
  }
  return 0;
}
