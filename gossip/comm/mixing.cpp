#include "gossip/comm/mixing.hpp"

#include <stdexcept>
#include <string>

namespace gg::gossip {
namespace {
void same_size(size_t a, size_t b, const char* what) {
  if (a != b) throw std::invalid_argument(std::string(what) + ": spans of different sizes");
}
}  // namespace

void mix_pair(std::span<float> x, std::span<const float> partner) {
  same_size(x.size(), partner.size(), "mix_pair");
  for (size_t i = 0; i < x.size(); ++i) x[i] = 0.5f * (x[i] + partner[i]);
}

void add_to(std::span<float> x, std::span<const float> partner) {
  same_size(x.size(), partner.size(), "add_to");
  for (size_t i = 0; i < x.size(); ++i) x[i] += partner[i];
}

void mix_last(std::span<float> x, std::span<const float> partner, int ranks) {
  same_size(x.size(), partner.size(), "mix_last");
  if (ranks < 2) throw std::invalid_argument("mix_last: ranks must be >= 2");
  const auto n = static_cast<float>(ranks);
  for (size_t i = 0; i < x.size(); ++i) x[i] = (x[i] + partner[i]) / n;
}

void mix_weighted(std::span<float> x, float own, std::span<const float> partner, float w) {
  same_size(x.size(), partner.size(), "mix_weighted");
  for (size_t i = 0; i < x.size(); ++i) x[i] = own * x[i] + w * partner[i];
}

void add_weighted(std::span<float> x, std::span<const float> partner, float w) {
  same_size(x.size(), partner.size(), "add_weighted");
  for (size_t i = 0; i < x.size(); ++i) x[i] += w * partner[i];
}

void mix_correction(std::span<const float> sent, std::span<const float> partner,
                    std::span<float> delta) {
  same_size(sent.size(), partner.size(), "mix_correction");
  same_size(sent.size(), delta.size(), "mix_correction");
  for (size_t i = 0; i < sent.size(); ++i) delta[i] = 0.5f * (partner[i] - sent[i]);
}

void apply_correction(std::span<float> x, std::span<const float> delta) {
  same_size(x.size(), delta.size(), "apply_correction");
  for (size_t i = 0; i < x.size(); ++i) x[i] += delta[i];
}

void difference(std::span<const float> x, std::span<const float> copy, std::span<float> d) {
  same_size(x.size(), copy.size(), "difference");
  same_size(x.size(), d.size(), "difference");
  for (size_t i = 0; i < x.size(); ++i) d[i] = x[i] - copy[i];
}

void mix_copies(std::span<float> x, std::span<const float> mine, std::span<const float> theirs) {
  same_size(x.size(), mine.size(), "mix_copies");
  same_size(x.size(), theirs.size(), "mix_copies");
  for (size_t i = 0; i < x.size(); ++i) x[i] += 0.5f * (theirs[i] - mine[i]);
}

double squared_distance(std::span<const float> a, std::span<const float> b) {
  same_size(a.size(), b.size(), "squared_distance");
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double diff = static_cast<double>(a[i]) - static_cast<double>(b[i]);
    d += diff * diff;
  }
  return d;
}

double squared_norm(std::span<const float> a) {
  double d = 0;
  for (float v : a) d += static_cast<double>(v) * static_cast<double>(v);
  return d;
}

void mean_of_sum(std::span<float> x, int ranks) {
  if (ranks < 1) throw std::invalid_argument("mean_of_sum: ranks must be >= 1");
  const float inv = 1.f / static_cast<float>(ranks);
  for (float& v : x) v *= inv;
}

Freshness freshness(int64_t latest, int64_t step, bool skip_late) {
  if (latest < 0 || latest < step - 1) return Freshness::Unmixed;
  if (latest >= step) return Freshness::Fresh;
  return skip_late ? Freshness::Unmixed : Freshness::Late;
}

}  // namespace gg::gossip
