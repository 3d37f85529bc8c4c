// The CUDA IPC exchanges (gossip/comm/cuda_ipc_exchange.hpp) under mpirun, every rank on this
// node (one GPU may be shared): each rank's device buffer starts from values every rank can
// compute, and after each step every rank's buffer must hold, bit for bit, what the host's pair
// average (gossip/comm/mixing.hpp) gives when every rank mixes with its schedule's partner: as
// the weights' exchange (exchange_all) and as the gradients' (begin_step, each bucket announced
// as it becomes final, in backward's order, after a kernel still writing it, finish_step).
// Prints SKIPPED and exits 77 on every rank where no GPU is present.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

#include "gossip/comm/cuda_ipc_exchange.hpp"
#include "gossip/comm/mixing.hpp"
#include "gossip/comm/mpi.hpp"
#include "kernels/cuda/cuda_executor.hpp"
#include "partners/schedule.hpp"

namespace {

using gg::kernels::Bucket;

// Rank r's starting values: distinct, with fractions, so that every average rounds.
std::vector<float> start(int r, int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    v[static_cast<size_t>(i)] = std::sin(0.37f * static_cast<float>(i) + static_cast<float>(r)) *
                                    (1.f + static_cast<float>(r)) +
                                0.1f * static_cast<float>(i % 7);
  return v;
}

// Every rank's values after one step of pair averages.
void host_step(std::vector<std::vector<float>>& all, const gg::partners::Schedule& s,
               int64_t step) {
  const std::vector<std::vector<float>> before = all;
  for (size_t r = 0; r < all.size(); ++r) {
    const gg::partners::Partners p = gg::partners::partners(s, static_cast<int>(r), step);
    gg::gossip::mix_pair(all[r], before[static_cast<size_t>(p.recv_from)]);
  }
}

bool check(const char* what, int64_t step, const std::vector<float>& want, const float* dev,
           int rank) {
  std::vector<float> got(want.size());
  if (cudaMemcpy(got.data(), dev, got.size() * sizeof(float), cudaMemcpyDeviceToHost) !=
      cudaSuccess)
    throw std::runtime_error("cudaMemcpy failed");
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != want[i]) {
      std::printf("FAILED: rank %d, %s, step %lld, element %zu: %a, the host's %a\n", rank, what,
                  static_cast<long long>(step), i, got[i], want[i]);
      return false;
    }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  gg::mpi::Environment env(&argc, &argv);
  const gg::mpi::Comm world = gg::mpi::Comm::world();
  const int rank = world.rank(), p = world.size();
  std::string why;
  if (gg::kernels::cuda_device_count(&why) == 0) {
    if (rank == 0) std::printf("SKIPPED: no CUDA device (%s)\n", why.c_str());
    return 77;
  }
  try {
    gg::kernels::select_cuda_device(world.split_shared().rank());
    const int64_t n = 10007;  // eleven buckets, the last one short
    std::vector<Bucket> buckets;
    for (int64_t b = 0; b < n; b += 1000) buckets.push_back({b, std::min(n, b + 1000)});
    gg::partners::Schedule s;
    s.kind = gg::partners::Kind::Dissemination;
    s.p = p;
    s.rotate = true;
    s.seed = 7;
    cudaStream_t stream = nullptr;
    if (cudaStreamCreate(&stream) != cudaSuccess) throw std::runtime_error("cudaStreamCreate");
    void* memory = nullptr;
    if (cudaMalloc(&memory, n * sizeof(float)) != cudaSuccess)
      throw std::runtime_error("cudaMalloc");
    float* x = static_cast<float*>(memory);
    std::vector<std::vector<float>> all;
    for (int r = 0; r < p; ++r) all.push_back(start(r, n));
    bool ok = true;
    {
      auto e = gg::gossip::make_cuda_ipc_exchange(world, x, buckets, s, stream);
      // The weights' exchange: steps 0-5.
      cudaMemcpy(x, all[static_cast<size_t>(rank)].data(), n * sizeof(float),
                 cudaMemcpyHostToDevice);
      for (int64_t step = 0; step < 6 && ok; ++step) {
        e->exchange_all(step);
        host_step(all, s, step);
        cudaStreamSynchronize(stream);
        ok = check("exchange_all", step, all[static_cast<size_t>(rank)], x, rank);
      }
      // The gradients' exchange: steps 6-11, each step's buffer rewritten on the stream (a
      // backward) bucket by bucket in reverse order, each announced right after its write.
      for (int64_t step = 6; step < 12 && ok; ++step) {
        for (int r = 0; r < p; ++r) all[static_cast<size_t>(r)] = start(r + 100 * int(step), n);
        const std::vector<float>& mine = all[static_cast<size_t>(rank)];
        e->begin_step(step);
        for (int b = static_cast<int>(buckets.size()) - 1; b >= 0; --b) {
          const Bucket& k = buckets[static_cast<size_t>(b)];
          cudaMemcpyAsync(x + k.begin, mine.data() + k.begin, k.size() * sizeof(float),
                          cudaMemcpyHostToDevice, stream);
          e->on_bucket_ready(b);
        }
        e->finish_step();
        host_step(all, s, step);
        cudaStreamSynchronize(stream);
        ok = check("gradient steps", step, all[static_cast<size_t>(rank)], x, rank);
      }
      if (e->bytes_sent() != 12 * n * static_cast<int64_t>(sizeof(float))) {
        std::printf("FAILED: rank %d: %lld bytes sent, not %lld\n", rank,
                    static_cast<long long>(e->bytes_sent()),
                    static_cast<long long>(12 * n * sizeof(float)));
        ok = false;
      }
    }  // the destructor settles what partners still owe each other: it must not hang
    double bad = ok ? 0 : 1;
    world.allreduce_max(&bad, 1);
    if (rank == 0)
      std::printf(
          "%s: %d ranks, 12 steps of CUDA IPC pair averages (6 all at once, 6 bucket by "
          "bucket) against the host's bits\n",
          bad == 0 ? "ok" : "FAILED", p);
    cudaFree(x);
    cudaStreamDestroy(stream);
    return bad == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::printf("FAILED: rank %d: %s\n", rank, e.what());
    return 1;
  }
}
