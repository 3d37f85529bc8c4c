#include "gossip/train/virtual_exchange.hpp"

#include <algorithm>
#include <set>
#include <stdexcept>

#include "gossip/comm/mixing.hpp"
#include "gossip/comm/tree_sum.hpp"

namespace gg::gossip {
namespace {

// A number in [0, 1) from four integers (splitmix64's finaliser over their mix).
double unit_hash(uint64_t a, uint64_t b, uint64_t c, uint64_t d) {
  uint64_t x = a * 0x9E3779B97F4A7C15ull ^ (b + 0x632BE59BD9B4E019ull) * 0xBF58476D1CE4E5B9ull ^
               (c + 0x8CB92BA72F3D8DD7ull) * 0x94D049BB133111EBull ^
               (d + 1) * 0xD6E8FEB86659FD93ull;
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 31;
  return static_cast<double>(x >> 11) * 0x1.0p-53;
}

[[noreturn]] void not_virtual(const char* what) {
  throw std::logic_error(std::string("virtual ranks do not model ") + what +
                         " (check_virtual refuses it)");
}

}  // namespace

LateModel late_model(double share, uint64_t seed, uint64_t exchange) {
  if (share <= 0) return {};
  return [=](int64_t step, int r) {
    return unit_hash(seed, exchange, static_cast<uint64_t>(step), static_cast<uint64_t>(r)) < share;
  };
}

VirtualExchange::VirtualExchange(const GossipOptions& o,
                                 const std::vector<kernels::Bucket>& buckets, LateModel late)
    : options_(o), buckets_(buckets), late_(std::move(late)), stream_(o.stream) {}

void VirtualExchange::add_rank(float* x) {
  codecs_.push_back(std::make_unique<WireCodec>(options_.wire, options_.error_feedback,
                                                wire_buckets(options_, buckets_),
                                                options_.stochastic));
  rules_.push_back(make_rule(options_, x, buckets_, static_cast<int>(rules_.size())));
  images_.emplace_back(static_cast<size_t>(codecs_.back()->floats()), 0.f);
}

// Bytes one rank sends in one exchange (the transports' payload, to each of its links).
int64_t VirtualExchange::bytes_per_rank() const {
  return codecs_[0]->floats() * static_cast<int64_t>(sizeof(float)) * links_of(options_);
}

// CHOCO's public copies (one per peer a rank sends to, one per peer it hears from), low-rank
// gossip's factors (pairs; at most a message's floats per partner): made at the first meeting.
int64_t VirtualExchange::growth_bytes(int64_t exchanges) const {
  if (!options_.public_copies && options_.low_rank == 0) return 0;
  const partners::Schedule& s = options_.schedule;
  std::set<int> to, from;
  const auto all = static_cast<size_t>(s.p - 1);
  for (int64_t t = 0; t < exchanges && (to.size() < all || from.size() < all); ++t) {
    const partners::Partners q = partners::partners(s, 0, t);  // schedules treat ranks alike
    for (int i = 0; i < q.links(); ++i) {
      to.insert(q.link(i).send_to);
      from.insert(q.link(i).recv_from);
    }
  }
  if (options_.public_copies)
    return static_cast<int64_t>(to.size() + from.size()) *
           (buckets_.empty() ? 0 : buckets_.front().end) * 4;
  return static_cast<int64_t>(to.size()) * codecs_[0]->floats() * 4;
}

void VirtualExchange::exchange(int64_t step) {
  const partners::Schedule& s = options_.schedule;
  const auto& layout = codecs_[0]->layout();
  const int buckets = static_cast<int>(buckets_.size());
  for (size_t r = 0; r < rules_.size(); ++r) {
    if (auto* d = dynamic_cast<DelayedAverage*>(rules_[r].get())) d->snapshot();
    const partners::Partners peers = partners::partners(s, static_cast<int>(r), step);
    check_weights(*rules_[r], peers);
    rules_[r]->begin_step(step, peers);
    for (int b = 0; b < buckets; ++b) {
      rules_[r]->capture(b);
      const float* image = encode_outgoing(*rules_[r], *codecs_[r], b,
                                           wire_key(s.seed, static_cast<int>(r), step, stream_));
      std::copy(image, image + layout[b].size(), images_[r].data() + layout[b].begin);
    }
  }
  for (size_t r = 0; r < rules_.size(); ++r) {
    const partners::Partners peers = partners::partners(s, static_cast<int>(r), step);
    // Late (staleness 1): the step ends first and mixes what came before; this step's buckets
    // are there for the next.
    const bool late = late_ && late_(step, static_cast<int>(r));
    if (late) rules_[r]->finish(step);
    for (int b = 0; b < buckets; ++b)
      for (int i = 0; i < peers.links(); ++i) {
        const auto from = static_cast<size_t>(peers.link(i).recv_from);
        rules_[r]->received(b, step, codecs_[r]->decode(b, images_[from].data() + layout[b].begin));
      }
    if (!late) rules_[r]->finish(step);
  }
  bytes_ += bytes_per_rank();
  pending_ = true;
}

double VirtualExchange::finish_step() {
  exchange(step_);
  pending_ = false;  // nothing delayed: the rules mixed in place
  return 0;
}

double VirtualExchange::exchange_all(int64_t step) {
  exchange(step);
  return finish_delayed();
}

double VirtualExchange::finish_delayed() {
  if (!pending_) return 0;
  for (auto& rule : rules_)
    if (auto* d = dynamic_cast<DelayedAverage*>(rule.get())) d->apply();
  pending_ = false;
  return 0;
}

std::vector<double> VirtualExchange::take_distances() {
  std::vector<double> d;
  for (auto& rule : rules_) d.push_back(rule->take_distance());
  return d;
}

Lateness VirtualExchange::lateness() const { return rules_[0]->lateness(); }

Lateness VirtualExchange::held_lateness() const {
  Lateness all;
  for (const auto& rule : rules_) {
    all.late += rule->lateness().late;
    all.unmixed += rule->lateness().unmixed;
  }
  return all;
}

void VirtualExchange::start_all(int64_t) { not_virtual("gossip.pipeline_weights"); }
double VirtualExchange::wait_bucket(int) { not_virtual("gossip.pipeline_weights"); }
std::vector<float> VirtualExchange::delayed_delta() { not_virtual("checkpoints"); }
void VirtualExchange::set_delayed_delta(const std::vector<float>&) { not_virtual("checkpoints"); }
double VirtualExchange::distance() const { not_virtual("checkpoints"); }
void VirtualExchange::restore_distance(double) { not_virtual("checkpoints"); }

double VirtualAllreduce::finish_step() {
  std::vector<float> sum(static_cast<size_t>(n_));
  tree_sum(std::vector<const float*>(x_.begin(), x_.end()), sum.size(), sum.data());
  mean_of_sum(sum, static_cast<int>(x_.size()));
  for (float* v : x_) std::copy(sum.begin(), sum.end(), v);
  return 0;
}

VirtualHierarchy::VirtualHierarchy(int64_t n, int per_node, const partners::Schedule& schedule,
                                   const std::vector<kernels::Bucket>& buckets)
    : n_(static_cast<size_t>(n)), k_(per_node), schedule_(schedule) {
  schedule_.p = schedule.p / k_;
  // What local rank 0 sends a step: its slice of every bucket over the rail (none alone).
  if (schedule_.p > 1)
    for (const kernels::Bucket& b : buckets)
      per_step_ +=
          (b.size() / k_ + (b.size() % k_ > 0 ? 1 : 0)) * static_cast<int64_t>(sizeof(float));
}

int64_t VirtualHierarchy::bytes(int ranks, int per_node) {
  return static_cast<int64_t>(ranks / per_node) * kChunk * 2 * 4 + TreeSum<float>::bytes(per_node);
}

double VirtualHierarchy::finish_step() {
  const int nodes = schedule_.p;
  std::vector<float> avg(static_cast<size_t>(nodes) * kChunk), mixed(kChunk);
  TreeSum<float> sum(k_);
  for (size_t off = 0; off < n_; off += kChunk) {
    const size_t len = std::min(kChunk, n_ - off);
    for (int node = 0; node < nodes; ++node) {
      std::vector<const float*> members;
      for (int l = 0; l < k_; ++l) members.push_back(x_[static_cast<size_t>(node * k_ + l)] + off);
      float* a = avg.data() + static_cast<size_t>(node) * kChunk;
      sum.sum(members, len, a);
      mean_of_sum({a, len}, k_);
    }
    for (int node = 0; node < nodes; ++node) {
      const float* own = avg.data() + static_cast<size_t>(node) * kChunk;
      std::copy(own, own + len, mixed.begin());
      if (nodes > 1) {
        const int from = partners::partners(schedule_, node, step_).recv_from;
        mix_pair({mixed.data(), len}, {avg.data() + static_cast<size_t>(from) * kChunk, len});
      }
      for (int l = 0; l < k_; ++l)
        std::copy(mixed.begin(), mixed.begin() + static_cast<std::ptrdiff_t>(len),
                  x_[static_cast<size_t>(node * k_ + l)] + off);
    }
  }
  bytes_ += per_step_;
  return 0;
}

}  // namespace gg::gossip
