// Low-rank gossip (PowerGossip, Vogels, Karimireddy and Jaggi 2020): a pair of partners mixes a
// rank-r approximation of the difference of their weight matrices instead of the weights. Both
// ends hold the same factor F per matrix and partner (warm-started across their meetings); a
// meeting sends X F (F = Q, cols x r) or X^T F (F = P, rows x r), which gives both ends the
// difference's projection D = M F or M^T F (M = X_low - X_high, the lower rank's weights minus
// the higher's); each end moves half of it: X_low -= D Q^T / 2, X_high += D Q^T / 2 (or P D^T
// / 2), the pair average within F's span, and the next meeting's factor is D, orthonormalised:
// one half of a power iteration per meeting, so that meetings alternate between the two sides
// (the phase is the meeting's parity, a function of the step). A rank-r difference is gone after
// two meetings; vectors (biases, batch norm) and matrices too small to gain are sent whole and
// averaged. No MPI, no threads of its own: tests/gossip/comm/test_low_rank.cpp.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "gossip/comm/exchange_options.hpp"
#include "gossip/comm/rules.hpp"
#include "kernels/graph.hpp"
#include "kernels/param_layout.hpp"

namespace gg::gossip {

// The graph's parameters as matrices where rank r gains (r * (rows + cols) < rows * cols), as
// vectors otherwise, in the store's layout.
std::vector<MatrixView> matrix_views(const kernels::Graph& g, const kernels::ParamLayout& layout,
                                     int rank);
// The largest rank at which some matrix of the graph gains (0: none at any rank).
int largest_gaining_rank(const kernels::Graph& g);
// gossip.low_rank = r above it (every matrix of `model` would travel whole, as with 0):
// std::invalid_argument naming the largest r that gains.
void check_gains(int r, const kernels::Graph& g, const std::string& model);

class LowRankMix {
 public:
  // period: steps between two meetings of the same pair (the hypercube's log2 p).
  LowRankMix(std::vector<MatrixView> views, const std::vector<kernels::Bucket>& buckets, int rank,
             int self, int period);
  // The buckets' messages: each matrix takes r * max(rows, cols) floats (the smaller side's
  // meetings leave the rest zero), each vector its size; bucket 0 last, as the buffer's.
  const std::vector<kernels::Bucket>& message_buckets() const { return message_buckets_; }
  int64_t message_floats() const {
    return message_buckets_.empty() ? 0 : message_buckets_.front().end;
  }
  // This step's partner (a pair: it sends to and receives from this rank).
  void begin(int64_t step, int peer);
  // Bucket b's message from the values x (the flat buffer or a copy of it) into out (the
  // message layout, whole).
  void message(int b, const float* x, float* out) const;
  // Adds bucket b's half of the pair's difference, from both ends' decoded messages of bucket b
  // (own and theirs point at its start), to y (the flat layout: the buffer, or a correction
  // applied later), and renews b's factors.
  void mix(int b, const float* own, const float* theirs, float* y);
  // The factors, one entry per partner met (PublicCopy::mine set; values: every matrix's factor),
  // and saved ones back: an entry of another size (another rank r or model) is dropped and that
  // partner starts again from a fresh factor.
  std::vector<PublicCopy> save() const;
  void load(std::vector<PublicCopy> saved);
  void forget(const std::vector<int>& peers);  // drops the factors shared with these partners

 private:
  struct Item {
    MatrixView v;
    int64_t message = 0;  // offset in the message layout
    int64_t factor = -1;  // offset in a partner's factors (-1: a vector)
  };
  void fresh_factor(const Item& it, float* f, uint64_t salt) const;
  void orthonormalise(float* f, int64_t len, uint64_t salt) const;

  std::vector<Item> items_;
  std::vector<std::vector<int>> in_bucket_;  // items of each bucket
  std::vector<kernels::Bucket> message_buckets_;
  int rank_, self_, period_;
  int64_t factor_floats_ = 0;
  std::map<int, std::vector<float>> factors_;  // by partner
  std::vector<float>* now_ = nullptr;
  int peer_ = -1;
  int64_t step_ = 0;
  bool right_ = true;  // this meeting sends X Q (else X^T P)
};

// Throws std::logic_error unless the step's partners are a pair (send_to == recv_from).
void check_pair(const partners::Partners& peers);

inline constexpr std::string_view kLowRankKind = "low-rank-factors";

// What both low-rank rules do alike, over a Base rule: the step's pair, each bucket's message
// from given values and its echo (what the partner decodes), the partner's message mixed into a
// flat buffer, and the factors as a rank's state.
template <class Base>
class WithLowRank : public Base {
 public:
  template <class... BaseArgs>
  explicit WithLowRank(LowRankMix mix, BaseArgs&&... base)
      : Base(std::forward<BaseArgs>(base)...),
        mix_(std::move(mix)),
        out_(static_cast<size_t>(mix_.message_floats()), 0.f),
        own_(out_) {}
  void begin_step(int64_t step, const partners::Partners& peers) override {
    check_pair(peers);
    mix_.begin(step, peers.send_to);
  }
  bool echoes() const override { return true; }
  void sent(int b, const float* decoded) override {
    const kernels::Bucket& k = message_bucket(b);
    std::copy(decoded, decoded + k.size(), own_.begin() + k.begin);
  }
  // The factors as they are (tests), and as a rank's state holds them: a matrix's factors do not
  // depend on the buffer's layout, so they are saved as they are.
  std::vector<PublicCopy> low_rank_factors() const { return mix_.save(); }
  void set_low_rank_factors(std::vector<PublicCopy> f) { mix_.load(std::move(f)); }
  void save_state(std::vector<StatePart>& out, const StateLayout&) const override {
    out.push_back(copies_part(std::string(kLowRankKind), mix_.save()));
  }
  void load_state(std::span<const StatePart> parts, const StateLayout&) override {
    const StatePart* p = find_part(parts, kLowRankKind, kCopiesVersion);
    mix_.load(p ? read_copies(*p) : std::vector<PublicCopy>());
  }
  void forget_peers(const std::vector<int>& lost) override { mix_.forget(lost); }

 protected:
  const kernels::Bucket& message_bucket(int b) const {
    return mix_.message_buckets()[static_cast<size_t>(b)];
  }
  // Bucket b's message from the values x.
  const float* message(int b, const float* x) {
    mix_.message(b, x, out_.data());
    return out_.data() + message_bucket(b).begin;
  }
  // The partner's message of bucket b, with this rank's echo, mixed into y.
  void mix_into(int b, const float* partner, float* y) {
    mix_.mix(b, own_.data() + message_bucket(b).begin, partner, y);
  }

 private:
  LowRankMix mix_;
  std::vector<float> out_, own_;  // message layout: what goes out, as the partner decodes it
};

// The low-rank rule with staleness 0: the partner's message mixes the buffer on arrival.
class LowRankAverage final : public WithLowRank<MixingRule> {
 public:
  LowRankAverage(float* buffer, const std::vector<kernels::Bucket>& buckets,
                 std::vector<MatrixView> views, int rank, int self, int period);
  const float* outgoing(int b) override { return message(b, x_); }
  void received(int, int64_t, const float* partner) override;

 private:
  float* x_;
};

// Overlapped: the snapshot's message goes out; the half difference becomes the correction.
class LowRankDelayed final : public WithLowRank<DelayedAverage> {
 public:
  LowRankDelayed(float* buffer, const std::vector<kernels::Bucket>& buckets,
                 std::vector<MatrixView> views, int rank, int self, int period);
  const float* outgoing(int b) override { return message(b, sent_.data()); }
  void received(int b, int64_t step, const float* partner) override;
};

}  // namespace gg::gossip
