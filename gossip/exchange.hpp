// The exchange engine seam: the trainer announces each bucket as backward completes it and
// waits for the mixed gradients before the optimizer step. Transports implement this interface;
// the gossip transports plug in here next to the allreduce baseline.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "gossip/mpi.hpp"
#include "kernels/graph.hpp"

namespace gg::gossip {

class GradientExchange {
 public:
  virtual ~GradientExchange() = default;
  virtual const char* name() const = 0;
  // Called before backward of step `step`.
  virtual void begin_step(int64_t step) = 0;
  // Called from backward (the compute thread) when bucket b's gradients are final.
  virtual void on_bucket_ready(int bucket) = 0;
  // Blocks until every bucket of this step is mixed; returns the seconds it blocked (the exposed
  // communication time).
  virtual double finish_step() = 0;
};

// The allreduce baseline: every bucket is averaged over all ranks with MPI_Allreduce on a
// communication thread that owns its own communicator, so it overlaps the rest of backward.
class AllreduceExchange final : public GradientExchange {
 public:
  AllreduceExchange(const mpi::Comm& world, float* grads, std::vector<kernels::Bucket> buckets);
  ~AllreduceExchange() override;
  const char* name() const override { return "allreduce"; }
  void begin_step(int64_t step) override;
  void on_bucket_ready(int bucket) override;
  double finish_step() override;

 private:
  void loop();

  mpi::Comm comm_;
  float* grads_;
  std::vector<kernels::Bucket> buckets_;
  float scale_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<int> queue_;
  size_t done_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread worker_;
};

}  // namespace gg::gossip
