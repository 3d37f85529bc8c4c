#include "gossip/comm/rules.hpp"

#include <algorithm>

#include "gossip/comm/mixing.hpp"

namespace gg::gossip {
namespace {
int64_t count_of(const std::vector<kernels::Bucket>& buckets) {
  return buckets.empty() ? 0 : buckets.front().end;  // bucket 0 ends the buffer
}
std::span<float> span_of(float* base, const kernels::Bucket& k) {
  return {base + k.begin, static_cast<size_t>(k.size())};
}
}  // namespace

PairAverage::PairAverage(float* buffer, std::vector<kernels::Bucket> buckets)
    : x_(buffer), buckets_(std::move(buckets)) {}

const float* PairAverage::outgoing(int b) const { return x_ + buckets_[b].begin; }

void PairAverage::received(int b, int64_t, const float* partner) {
  const kernels::Bucket& k = buckets_[b];
  const std::span<const float> p(partner, static_cast<size_t>(k.size()));
  if (measuring()) add_distance(squared_distance(span_of(x_, k), p));
  mix_pair(span_of(x_, k), p);
}

StaleAverage::StaleAverage(float* buffer, std::vector<kernels::Bucket> buckets, bool skip_late)
    : x_(buffer),
      buckets_(std::move(buckets)),
      skip_late_(skip_late),
      sent_(count_of(buckets_)),
      latest_(count_of(buckets_)),
      latest_step_(buckets_.size(), -1) {}

void StaleAverage::capture(int b) {
  const kernels::Bucket& k = buckets_[b];
  std::copy(x_ + k.begin, x_ + k.end, sent_.begin() + k.begin);
}

const float* StaleAverage::outgoing(int b) const { return sent_.data() + buckets_[b].begin; }

void StaleAverage::received(int b, int64_t step, const float* partner) {
  std::lock_guard lock(mu_);
  std::copy(partner, partner + buckets_[b].size(), latest_.begin() + buckets_[b].begin);
  latest_step_[b] = step;
}

void StaleAverage::finish(int64_t step) {
  std::lock_guard lock(mu_);
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const Freshness f = freshness(latest_step_[b], step, skip_late_);
    if (f == Freshness::Unmixed) {
      ++lateness_.unmixed;
      continue;
    }
    if (f == Freshness::Late) ++lateness_.late;
    if (measuring())
      add_distance(
          squared_distance(span_of(x_, buckets_[b]), span_of(latest_.data(), buckets_[b])));
    mix_pair(span_of(x_, buckets_[b]), span_of(latest_.data(), buckets_[b]));
  }
}

Lateness StaleAverage::lateness() const {
  std::lock_guard lock(mu_);
  return lateness_;
}

DelayedAverage::DelayedAverage(float* buffer, std::vector<kernels::Bucket> buckets)
    : x_(buffer),
      buckets_(std::move(buckets)),
      sent_(count_of(buckets_)),
      delta_(count_of(buckets_)) {}

void DelayedAverage::snapshot() { std::copy(x_, x_ + sent_.size(), sent_.begin()); }

const float* DelayedAverage::outgoing(int b) const { return sent_.data() + buckets_[b].begin; }

void DelayedAverage::received(int b, int64_t, const float* partner) {
  const kernels::Bucket& k = buckets_[b];
  mix_correction(span_of(sent_.data(), k), {partner, static_cast<size_t>(k.size())},
                 span_of(delta_.data(), k));
  if (measuring()) add_distance(4 * squared_norm(span_of(delta_.data(), k)));
}

void DelayedAverage::apply() { apply_correction({x_, delta_.size()}, delta_); }

}  // namespace gg::gossip
