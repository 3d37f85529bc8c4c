// Push-sum (Kempe, Dobra, Gehrke 2003), the rule of Stochastic Gradient Push (Assran et al.,
// ICML 2019): each rank keeps, per bucket, a numerator x and a weight w, and its buffer holds the
// de-biased values z = x / w that forward, backward and the update read. A step with k links
// keeps 1 / (k + 1) of (x, w) and pushes the same share to every peer, the weight travelling
// as one more float behind each bucket's values; what arrives is added, and the buffer becomes
// z = x / w. The shares a rank gives away add up to 1 whatever its peers' count, so nothing
// needs the mixing to be doubly stochastic: on the project's schedules (every link a
// permutation, every rank the same k) every w stays 1 and z is the uniform average, rounded
// differently (one link: the pair average, bit for bit). The update applies to z: with w != 1
// that is SGP's step scaled by w.
//
// A part of the registry of rules (exchange_options.hpp names it gossip.rule = push-sum,
// exchange.cpp's table makes it): the weights are its state (a part of kind "push-sum", one float
// per bucket). It needs the fp32 wire (the weight must arrive as sent) and runs alone: staleness
// 0, no overlap, no public copies, no low rank (gossip/config refuses those in one line).
#pragma once

#include <algorithm>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "gossip/comm/exchange_options.hpp"
#include "gossip/comm/rules.hpp"

namespace gg::gossip {

class PushSum final : public MixingRule {
 public:
  PushSum(float* buffer, std::vector<kernels::Bucket> buckets)
      : z_(buffer),
        buckets_(std::move(buckets)),
        messages_(messages(buckets_)),
        weight_(buckets_.size(), 1.f),
        sum_(buckets_.size(), 0.f),
        arrived_(buckets_.size(), 0),
        out_(static_cast<size_t>(messages_.empty() ? 0 : messages_.front().end)) {}

  // Bucket b's message: its values, then its weight; in the buckets' order (bucket 0 last).
  static std::vector<kernels::Bucket> messages(const std::vector<kernels::Bucket>& buckets) {
    std::vector<kernels::Bucket> out = buckets;
    for (kernels::Bucket& m : out) {
      const int64_t before =
          std::count_if(buckets.begin(), buckets.end(),
                        [&](const kernels::Bucket& k) { return k.begin < m.begin; });
      m.end += before + 1;
      m.begin += before;
    }
    return out;
  }

  void begin_step(int64_t, const partners::Partners& peers) override {
    share_ = 1.f / static_cast<float>(peers.links() + 1);
    links_ = peers.links();
    std::fill(arrived_.begin(), arrived_.end(), 0);
  }
  // This rank's share of (x, w) = (z w, w): what it keeps and what each peer gets.
  const float* outgoing(int b) override {
    const kernels::Bucket& k = buckets_[b];
    float* m = out_.data() + messages_[b].begin;
    const float w = weight_[b] * share_;
    for (int64_t i = 0; i < k.size(); ++i) m[i] = z_[k.begin + i] * w;
    m[k.size()] = w;
    return m;
  }
  void received(int b, int64_t, const float* partner) override {
    const kernels::Bucket& k = buckets_[b];
    float* z = z_ + k.begin;
    const int64_t n = k.size();
    if (arrived_[b]++ == 0) {  // the numerator starts from this rank's own share
      const float* mine = out_.data() + messages_[b].begin;
      for (int64_t i = 0; i < n; ++i) z[i] = mine[i] + partner[i];
      sum_[b] = mine[n] + partner[n];
    } else {
      for (int64_t i = 0; i < n; ++i) z[i] += partner[i];
      sum_[b] += partner[n];
    }
    if (arrived_[b] < links_) return;
    for (int64_t i = 0; i < n; ++i) z[i] /= sum_[b];
    weight_[b] = sum_[b];
  }

  const std::vector<float>& weights() const { return weight_; }
  void save_state(std::vector<StatePart>& out, const StateLayout&) const override {
    out.push_back(floats_part(std::string(kKind), kVersion, weight_));
  }
  void load_state(std::span<const StatePart> parts, const StateLayout&) override {
    const StatePart* p = find_part(parts, kKind, kVersion);
    if (!p) return std::fill(weight_.begin(), weight_.end(), 1.f);
    std::vector<float> w = read_floats(*p);
    if (w.size() != weight_.size())
      throw std::invalid_argument("push-sum weights for " + std::to_string(w.size()) +
                                  " buckets, the buffer has " + std::to_string(weight_.size()));
    weight_ = std::move(w);
  }

  static constexpr std::string_view kKind = "push-sum";
  static constexpr uint32_t kVersion = 1;

 private:
  float* z_;
  std::vector<kernels::Bucket> buckets_, messages_;
  std::vector<float> weight_, sum_;
  std::vector<int> arrived_;
  std::vector<float> out_;  // this step's shares, in the messages' layout
  float share_ = 0.5f;
  int links_ = 1;
};

inline std::unique_ptr<MixingRule> make_push_sum(const GossipOptions& o, float* buffer,
                                                 const std::vector<kernels::Bucket>& buckets, int) {
  if (lossy(o.wire))
    throw std::invalid_argument(
        "gossip.rule = push-sum sends its weight beside the values: set "
        "the wire of what it mixes (gossip.wire, gossip.model_wire) to "
        "fp32");
  return std::make_unique<PushSum>(buffer, buckets);
}

inline std::vector<kernels::Bucket> push_sum_messages(const GossipOptions&,
                                                      const std::vector<kernels::Bucket>& buckets) {
  return PushSum::messages(buckets);
}

}  // namespace gg::gossip
