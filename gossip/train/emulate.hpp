// Emulated compute ([emulate] in the config): a training step that waits where forward, backward
// and the optimizer would compute, and hands each gradient bucket to the exchange at the moment
// backward would complete it. The buffers, buckets, exchange engine and MPI traffic are the real
// ones; only the FLOPs are gone, so that 16-32 ranks fit on a few cores of a testbed whose links,
// not its CPU, are the subject (bench/cluster).
#pragma once

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "gossip/config/config.hpp"
#include "kernels/executor.hpp"
#include "kernels/graph.hpp"

namespace gg::gossip {

class EmulatedCompute {
 public:
  // `buckets` in the order backward completes them (kernels::make_buckets' order).
  EmulatedCompute(const Config& c, int rank, const std::vector<kernels::Bucket>& buckets);

  // This rank's factor at `step`: its straggler factor (emulate.slow) times a lognormal draw with
  // median 1 and 99th percentile emulate.jitter_p99, a pure function of (train.seed, rank, step).
  double factor(int64_t step) const;

  // Waits forward_ms * factor in all; with a gate, in one share per bucket (its bytes over all
  // bytes), from the last bucket to the first (the order forward reads them), calling gate(b)
  // before bucket b's share, whose wait starts when the gate returns.
  void forward(double factor, const std::function<void(int)>& gate = {}) const;
  // Waits backward_ms * factor in all, calling ready(b) for bucket b once (bytes of buckets
  // 0..b) / (all bytes) of it has passed.
  void backward(double factor, const std::function<void(int)>& ready) const;
  void update(double factor) const;

  // The bucket boundaries as shares of backward, for tests: ready_share()[b] in (0, 1].
  const std::vector<double>& ready_share() const { return ready_share_; }

 private:
  double forward_s_, backward_s_, update_s_;
  double sigma_;  // of log(factor): ln(p99) / z_0.99
  double slow_ = 1;
  uint64_t seed_;
  int rank_;
  std::vector<double> ready_share_;
};

// Emulated compute as the trainer's executor: forward and backward wait (with the factor of the
// trainer's current step, read from `step`) and return no logits; update() is the optimizer's
// wait. Nothing is computed, so no parameter changes.
class EmulatedExecutor final : public kernels::Executor {
 public:
  EmulatedExecutor(const Config& c, int rank, const std::vector<kernels::Bucket>& buckets,
                   const int64_t& step);
  const float* forward(const float* x, bool train) override;
  void backward(const float* dlogits, const kernels::BucketReady& ready) override;
  void update() const;

 private:
  EmulatedCompute compute_;
  const int64_t& step_;
};

}  // namespace gg::gossip
