#include "gossip/comm/rules.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

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
    : x_(buffer), buckets_(std::move(buckets)), arrived_(buckets_.size(), 0) {}

void PairAverage::begin_step(int64_t, const partners::Partners& peers) {
  links_ = peers.links();
  peers_ = peers;
  std::fill(arrived_.begin(), arrived_.end(), 0);
}

const float* PairAverage::outgoing(int b) { return x_ + buckets_[b].begin; }

void PairAverage::received(int b, int64_t, const float* partner) {
  const kernels::Bucket& k = buckets_[b];
  const std::span<const float> p(partner, static_cast<size_t>(k.size()));
  if (peers_.weighted) {  // the links arrive in link order
    const int i = arrived_[b]++;
    if (i == 0 && links_ == 1 && measuring()) add_distance(squared_distance(span_of(x_, k), p));
    if (i == 0) return mix_weighted(span_of(x_, k), peers_.own_weight(), p, peers_.weight(0));
    return add_weighted(span_of(x_, k), p, peers_.weight(i));
  }
  if (links_ == 1) {
    if (measuring()) add_distance(squared_distance(span_of(x_, k), p));
    return mix_pair(span_of(x_, k), p);
  }
  if (++arrived_[b] < links_) return add_to(span_of(x_, k), p);
  mix_last(span_of(x_, k), p, links_ + 1);
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

const float* StaleAverage::outgoing(int b) { return sent_.data() + buckets_[b].begin; }

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

const float* DelayedAverage::outgoing(int b) { return sent_.data() + buckets_[b].begin; }

void DelayedAverage::received(int b, int64_t, const float* partner) {
  const kernels::Bucket& k = buckets_[b];
  mix_correction(span_of(sent_.data(), k), {partner, static_cast<size_t>(k.size())},
                 span_of(delta_.data(), k));
  if (measuring()) add_distance(4 * squared_norm(span_of(delta_.data(), k)));
}

void DelayedAverage::apply() { apply_correction({x_, delta_.size()}, delta_); }

PublicCopies::PublicCopies(const std::vector<kernels::Bucket>& buckets)
    : count_(count_of(buckets)) {}

std::vector<float>* PublicCopies::copy_of(std::map<int, std::vector<float>>& copies, int peer) {
  std::vector<float>& c = copies[peer];
  if (c.size() != static_cast<size_t>(count_)) c.assign(static_cast<size_t>(count_), 0.f);
  return &c;
}

void PublicCopies::begin(const partners::Partners& peers) {
  mine_now_ = copy_of(mine_, peers.send_to);
  theirs_now_ = copy_of(theirs_, peers.recv_from);
}

std::span<float> PublicCopies::mine(const kernels::Bucket& k) const {
  return span_of(mine_now_->data(), k);
}
std::span<float> PublicCopies::theirs(const kernels::Bucket& k) const {
  return span_of(theirs_now_->data(), k);
}
void PublicCopies::add_mine(const kernels::Bucket& k, const float* q) {
  apply_correction(mine(k), {q, static_cast<size_t>(k.size())});
}
void PublicCopies::add_theirs(const kernels::Bucket& k, const float* q) {
  apply_correction(theirs(k), {q, static_cast<size_t>(k.size())});
}

std::vector<PublicCopy> PublicCopies::save() const {
  std::vector<PublicCopy> out;
  for (const auto& [peer, v] : mine_) out.push_back({peer, true, v});
  for (const auto& [peer, v] : theirs_) out.push_back({peer, false, v});
  return out;
}

void PublicCopies::load(std::vector<PublicCopy> copies) {
  for (const PublicCopy& c : copies)
    if (c.values.size() != static_cast<size_t>(count_))
      throw std::invalid_argument("a public copy of " + std::to_string(c.values.size()) +
                                  " values for a buffer of " + std::to_string(count_));
  mine_.clear();
  theirs_.clear();
  mine_now_ = theirs_now_ = nullptr;
  for (PublicCopy& c : copies) (c.mine ? mine_ : theirs_)[c.peer] = std::move(c.values);
}

void PublicCopies::forget(const std::vector<int>& peers) {
  for (const int peer : peers) {
    mine_.erase(peer);
    theirs_.erase(peer);
  }
  mine_now_ = theirs_now_ = nullptr;
}

StatePart copies_part(std::string kind, const std::vector<PublicCopy>& copies) {
  PartWriter w;
  w.put<uint64_t>(copies.size());
  for (const PublicCopy& c : copies) {
    w.put<int64_t>(c.peer);
    w.put<uint64_t>(c.mine ? 1 : 0);
    w.array(c.values);
  }
  return w.part(std::move(kind), kCopiesVersion);
}

std::vector<PublicCopy> read_copies(const StatePart& p) {
  PartReader r(p);
  const auto n = r.get<uint64_t>();
  if (n > r.left() / 24) r.fail();  // each copy takes at least its 24 bytes of header
  std::vector<PublicCopy> v(static_cast<size_t>(n));
  for (PublicCopy& c : v) {
    const auto peer = r.get<int64_t>();
    if (peer < 0 || peer > (int64_t{1} << 30)) r.fail();
    c.peer = static_cast<int>(peer);
    c.mine = r.get<uint64_t>() != 0;
    c.values = r.get_array<float>();
  }
  r.end();
  return v;
}

std::vector<PublicCopy> copies_in(std::span<const StatePart> parts, std::string_view kind) {
  const StatePart* p = find_part(parts, kind, kCopiesVersion);
  return p ? read_copies(*p) : std::vector<PublicCopy>();
}

std::vector<PublicCopy> saved_copies(const MixingRule& r, std::string_view kind) {
  std::vector<StatePart> parts;
  r.save_state(parts, {});
  return copies_in(parts, kind);
}

ChocoAverage::ChocoAverage(float* buffer, const std::vector<kernels::Bucket>& buckets,
                           bool sent_as_is)
    : WithPublicCopies(buckets), x_(buffer), diff_(sent_as_is ? count_of(buckets) : 0) {}

const float* ChocoAverage::outgoing(int b) {
  const kernels::Bucket& k = copy_buckets_[b];
  if (!diff_.empty()) {
    difference(span_of(x_, k), copies_.mine(k), span_of(diff_.data(), k));
    return diff_.data() + k.begin;
  }
  thread_local std::vector<float> room;
  room.resize(static_cast<size_t>(k.size()));
  difference(span_of(x_, k), copies_.mine(k), room);
  return room.data();
}

void ChocoAverage::received(int b, int64_t, const float* partner) {
  const kernels::Bucket& k = copy_buckets_[b];
  copies_.add_theirs(k, partner);
  if (measuring()) add_distance(squared_distance(copies_.mine(k), copies_.theirs(k)));
  mix_copies(span_of(x_, k), copies_.mine(k), copies_.theirs(k));
}

ChocoDelayed::ChocoDelayed(float* buffer, const std::vector<kernels::Bucket>& buckets)
    : WithPublicCopies(buckets, buffer, buckets) {}

const float* ChocoDelayed::outgoing(int b) {
  // The snapshot is not needed once its difference is taken: the difference replaces it.
  const kernels::Bucket& k = buckets_[b];
  difference(span_of(sent_.data(), k), copies_.mine(k), span_of(sent_.data(), k));
  return sent_.data() + k.begin;
}

void ChocoDelayed::received(int b, int64_t, const float* partner) {
  const kernels::Bucket& k = buckets_[b];
  copies_.add_theirs(k, partner);
  mix_correction(copies_.mine(k), copies_.theirs(k), span_of(delta_.data(), k));
  if (measuring()) add_distance(4 * squared_norm(span_of(delta_.data(), k)));
}

}  // namespace gg::gossip
