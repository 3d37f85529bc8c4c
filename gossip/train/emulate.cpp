#include "gossip/train/emulate.hpp"

#include <chrono>
#include <cmath>
#include <random>
#include <thread>

namespace gg::gossip {
namespace {

using Clock = std::chrono::steady_clock;

constexpr double kZ99 = 2.3263478740408408;  // the standard normal's 99th percentile

Clock::time_point after(Clock::time_point t0, double seconds) {
  return t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

void wait_for(double seconds) {
  if (seconds > 0) std::this_thread::sleep_until(after(Clock::now(), seconds));
}

}  // namespace

EmulatedCompute::EmulatedCompute(const Config& c, int rank,
                                 const std::vector<kernels::Bucket>& buckets)
    : forward_s_(c.emulate.forward_ms * 1e-3),
      backward_s_(c.emulate.backward_ms * 1e-3),
      update_s_(c.emulate.update_ms * 1e-3),
      sigma_(std::log(c.emulate.jitter_p99) / kZ99),
      seed_(static_cast<uint64_t>(c.train.seed)),
      rank_(rank) {
  for (const auto& [r, f] : parse_emulate_slow(c.emulate.slow))
    if (r == rank) slow_ = f;
  double total = 0;
  for (const kernels::Bucket& b : buckets) total += static_cast<double>(b.size());
  double done = 0;
  for (const kernels::Bucket& b : buckets) {
    done += static_cast<double>(b.size());
    ready_share_.push_back(total > 0 ? done / total : 1.0);
  }
}

double EmulatedCompute::factor(int64_t step) const {
  if (sigma_ == 0) return slow_;
  // One generator per (seed, rank, step): the draw does not depend on what ran before (resumes,
  // evaluation), and ranks draw independently.
  std::seed_seq seq{static_cast<uint32_t>(seed_),
                    static_cast<uint32_t>(seed_ >> 32),
                    static_cast<uint32_t>(rank_),
                    static_cast<uint32_t>(step),
                    static_cast<uint32_t>(static_cast<uint64_t>(step) >> 32),
                    0x656d75u};
  std::mt19937_64 rng(seq);
  std::normal_distribution<double> normal(0.0, sigma_);
  return slow_ * std::exp(normal(rng));
}

void EmulatedCompute::forward(double factor, const std::function<void(int)>& gate) const {
  const double span = forward_s_ * factor;
  if (!gate || ready_share_.empty()) return wait_for(span);
  for (size_t b = ready_share_.size(); b-- > 0;) {
    gate(static_cast<int>(b));
    wait_for(span * (ready_share_[b] - (b > 0 ? ready_share_[b - 1] : 0.0)));
  }
}

void EmulatedCompute::backward(double factor, const std::function<void(int)>& ready) const {
  const auto t0 = Clock::now();
  const double span = backward_s_ * factor;
  for (size_t b = 0; b < ready_share_.size(); ++b) {
    std::this_thread::sleep_until(after(t0, span * ready_share_[b]));
    if (ready) ready(static_cast<int>(b));
  }
  std::this_thread::sleep_until(after(t0, span));
}

void EmulatedCompute::update(double factor) const { wait_for(update_s_ * factor); }

EmulatedExecutor::EmulatedExecutor(const Config& c, int rank,
                                   const std::vector<kernels::Bucket>& buckets, const int64_t& step)
    : kernels::Executor(c.train.batch), compute_(c, rank, buckets), step_(step) {}

const float* EmulatedExecutor::forward(const float*, bool) {
  compute_.forward(compute_.factor(step_), gate_);
  return nullptr;
}

void EmulatedExecutor::backward(const float*, const kernels::BucketReady& ready) {
  compute_.backward(compute_.factor(step_), ready);
}

void EmulatedExecutor::update() const { compute_.update(compute_.factor(step_)); }

}  // namespace gg::gossip
