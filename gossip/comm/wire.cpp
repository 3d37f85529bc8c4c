#include "gossip/comm/wire.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>

#include "kernels/onednn/isa.hpp"
#include "shuffle/rng.hpp"

namespace gg::gossip {

Wire parse_wire(const std::string& name) { return parse_name<Wire>(name, "wire precision"); }

uint16_t to_bf16(float f) {
  uint32_t u = 0;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

float from_bf16(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f = 0;
  std::memcpy(&f, &u, 4);
  return f;
}

namespace {
size_t block_count(size_t n) { return (n + kQuantBlock - 1) / kQuantBlock; }
}  // namespace

int64_t wire_floats(Wire w, int64_t n) {
  const auto blocks = static_cast<int64_t>(block_count(static_cast<size_t>(n)));
  switch (w) {
    case Wire::Bf16:
      return (n + 1) / 2;
    case Wire::Int8:
      return blocks + (n + 3) / 4;
    case Wire::Int4:
      return blocks + (n + 7) / 8;
    case Wire::Fp32:
      break;
  }
  return n;
}

void pack_bf16(std::span<const float> x, std::span<float> residue, uint16_t* out) {
  const size_t n = x.size();
  if (!residue.empty() && residue.size() != n)
    throw std::invalid_argument("pack_bf16: the residue must have one value per value packed");
  if (residue.empty()) {
    for (size_t i = 0; i < n; ++i) out[i] = to_bf16(x[i]);
  } else {
    for (size_t i = 0; i < n; ++i) {
      const float v = x[i] + residue[i];
      out[i] = to_bf16(v);
      residue[i] = v - from_bf16(out[i]);
    }
  }
  if (n % 2) out[n] = 0;  // the last float's unused half
}

void unpack_bf16(const uint16_t* in, std::span<float> x) {
  for (size_t i = 0; i < x.size(); ++i) x[i] = from_bf16(in[i]);
}

namespace {
// The largest level of a quantized wire: int8 -127..127, int4 -7..7 (symmetric: 0 is exact).
int top_level(Wire w) { return w == Wire::Int8 ? 127 : 7; }

// One block's values v (error feedback's sum already in) -> levels q and its scale; the residue,
// when kept, becomes v - q * scale. Written for the compiler to vectorise (eight independent
// lanes, no library calls): it runs on the communication thread for every bucket sent.
// With noise (uniform in [0, 1), one per value), the level is floor(y + noise) instead.
float quantize_block(std::span<const float> v, int top, int8_t* q, float* residue,
                     const float* noise) {
  const size_t n = v.size();
  float most[8] = {}, poison[8] = {};  // a * 0 is NaN for a NaN or an infinity
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (size_t j = 0; j < 8; ++j) {
      most[j] = std::max(most[j], std::fabs(v[i + j]));
      poison[j] += v[i + j] * 0.f;
    }
  for (; i < n; ++i) {
    most[0] = std::max(most[0], std::fabs(v[i]));
    poison[0] += v[i] * 0.f;
  }
  float m = 0, bad = 0;
  for (size_t j = 0; j < 8; ++j) {
    m = std::max(m, most[j]);
    bad += poison[j];
  }
  if (std::isnan(bad)) {
    std::fill(q, q + n, int8_t{0});
    if (residue) std::fill(residue, residue + n, std::numeric_limits<float>::quiet_NaN());
    return std::numeric_limits<float>::quiet_NaN();
  }
  const auto hi = static_cast<float>(top);
  const float scale = m / hi, inv = m > 0 ? hi / m : 0.f;
  // Rounding to nearest, ties to even, as nearbyint in the default mode: |y| <= 127 < 2^22, so
  // y + 1.5 * 2^23 keeps no fraction and subtracting it again is exact.
  constexpr float kRound = 12582912.f;
  float level[kQuantBlock];
  if (noise)
    for (i = 0; i < n; ++i) {
      const float y = v[i] * inv + noise[i];
      const float t = (y + kRound) - kRound;  // nearest; one below where it rounded up: floor
      level[i] = std::min(hi, std::max(-hi, t > y ? t - 1.f : t));
    }
  else
    for (i = 0; i < n; ++i) {
      const float y = v[i] * inv;
      level[i] = std::min(hi, std::max(-hi, (y + kRound) - kRound));
    }
  for (i = 0; i < n; ++i) q[i] = static_cast<int8_t>(static_cast<int>(level[i]));
  if (residue)
    for (i = 0; i < n; ++i) residue[i] = v[i] - level[i] * scale;
  return scale;
}

}  // namespace

uint64_t wire_key(uint64_t seed, int rank, int64_t step, int stream) {
  const uint64_t key = shuffle::splitmix64(
      shuffle::splitmix64(seed ^ 0x5EED) ^
      shuffle::splitmix64(static_cast<uint64_t>(rank) << 40 ^ static_cast<uint64_t>(step)));
  return stream == 0 ? key : shuffle::splitmix64(key ^ static_cast<uint64_t>(stream) << 56);
}
uint64_t bucket_key(uint64_t key, int bucket) {
  return shuffle::splitmix64(key ^ (static_cast<uint64_t>(bucket) + 1) * 0xD1B54A32D192ED03ull);
}

namespace {
// Uniform draws in [0, 1) for values first .. first + m of a buffer rounded with `key`. Integer
// hashing, a 24-bit integer converted exactly and scaled by a power of two: the same bits on every
// instruction set, so they are built for the widest vectors here (kernels/onednn/isa.hpp). A
// scalar splitmix64 per value took about a tenth of stochastic rounding's encode; most of the
// rest was the floor's branch below (gossip/comm/CMakeLists.txt).
[[gnu::always_inline]] inline void draws_body(uint64_t key, size_t first, size_t m, float* u) {
  for (size_t i = 0; i < m; ++i) {
    const auto bits = static_cast<int32_t>(shuffle::splitmix64(key + first + i) >> 40);
    u[i] = static_cast<float>(bits) * 0x1.0p-24f;
  }
}
void draws(uint64_t key, size_t first, size_t m, float* u) {
  kernels::vectorised<draws_body>(key, first, m, u);
}
}  // namespace

void pack_quant(Wire w, std::span<const float> x, std::span<float> residue, float* out,
                std::optional<uint64_t> stochastic) {
  if (w != Wire::Int8 && w != Wire::Int4)
    throw std::invalid_argument("pack_quant: int8 or int4 only");
  const size_t n = x.size();
  if (!residue.empty() && residue.size() != n)
    throw std::invalid_argument("pack_quant: the residue must have one value per value packed");
  const int top = top_level(w);
  const size_t blocks = block_count(n);
  auto* bytes = reinterpret_cast<uint8_t*>(out + blocks);
  const auto level_floats = wire_floats(w, static_cast<int64_t>(n)) - static_cast<int64_t>(blocks);
  std::memset(bytes, 0, static_cast<size_t>(level_floats) * 4);
  float v[kQuantBlock], u[kQuantBlock];
  int8_t q[kQuantBlock];
  for (size_t k = 0; k < blocks; ++k) {
    const size_t lo = k * kQuantBlock, m = std::min<size_t>(kQuantBlock, n - lo);
    if (residue.empty())
      std::copy_n(x.data() + lo, m, v);
    else
      for (size_t i = 0; i < m; ++i) v[i] = x[lo + i] + residue[lo + i];
    if (stochastic) draws(*stochastic, lo, m, u);
    out[k] = quantize_block({v, m}, top, q, residue.empty() ? nullptr : residue.data() + lo,
                            stochastic ? u : nullptr);
    if (w == Wire::Int8) {
      std::memcpy(bytes + lo, q, m);
      continue;
    }
    // int4: the level + 8 (1..15) in a nibble, even values low, odd values high (lo is even).
    uint8_t* pair = bytes + lo / 2;
    for (size_t i = 0; i + 1 < m; i += 2)
      pair[i / 2] = static_cast<uint8_t>((q[i] + 8) | ((q[i + 1] + 8) << 4));
    if (m % 2) pair[m / 2] = static_cast<uint8_t>(q[m - 1] + 8);
  }
}

void unpack_quant(Wire w, const float* in, std::span<float> x) {
  const size_t n = x.size(), blocks = block_count(n);
  const auto* bytes = reinterpret_cast<const uint8_t*>(in + blocks);
  for (size_t k = 0; k < blocks; ++k) {
    const size_t lo = k * kQuantBlock, m = std::min<size_t>(kQuantBlock, n - lo);
    const float scale = in[k];
    float* out = x.data() + lo;
    if (w == Wire::Int8) {
      const auto* q = reinterpret_cast<const int8_t*>(bytes + lo);
      for (size_t i = 0; i < m; ++i) out[i] = static_cast<float>(q[i]) * scale;
      continue;
    }
    const uint8_t* pair = bytes + lo / 2;
    for (size_t i = 0; i < m; ++i)
      out[i] = static_cast<float>(((pair[i / 2] >> (4 * (i % 2))) & 0xf) - 8) * scale;
  }
}

WireCodec::WireCodec(Wire wire, bool error_feedback, std::vector<kernels::Bucket> buckets,
                     bool stochastic)
    : wire_(wire), stochastic_(stochastic), buckets_(std::move(buckets)) {
  if (error_feedback && wire_ == Wire::Fp32)
    throw std::invalid_argument("error feedback needs a lossy wire (bf16, int8 or int4)");
  if (stochastic && wire_ != Wire::Int8 && wire_ != Wire::Int4)
    throw std::invalid_argument("stochastic rounding needs the int8 or int4 wire");
  const int64_t count = buckets_.empty() ? 0 : buckets_.front().end;
  if (wire_ == Wire::Fp32) {
    layout_ = buckets_;
    floats_ = count;
    return;
  }
  // Bucket b travels in wire_floats(n) floats' room, laid out in the same order as the buckets
  // (bucket 0 last).
  layout_.resize(buckets_.size());
  for (size_t b = buckets_.size(); b-- > 0;) {
    layout_[b] = {floats_, floats_ + wire_floats(wire_, buckets_[b].size())};
    floats_ = layout_[b].end;
  }
  packed_.assign(static_cast<size_t>(floats_), 0.f);
  if (error_feedback) residue_.assign(static_cast<size_t>(count), 0.f);
}

const float* WireCodec::encode(int b, const float* x, uint64_t key) {
  if (wire_ == Wire::Fp32) return x;
  const kernels::Bucket& k = buckets_[static_cast<size_t>(b)];
  float* room = packed_.data() + layout_[static_cast<size_t>(b)].begin;
  const auto n = static_cast<size_t>(k.size());
  const std::span<float> residue =
      residue_.empty() ? std::span<float>() : std::span<float>(residue_.data() + k.begin, n);
  std::unique_lock<std::mutex> lock;
  if (!residue.empty()) lock = std::unique_lock(residue_mu_);
  if (wire_ == Wire::Bf16)
    pack_bf16({x, n}, residue, reinterpret_cast<uint16_t*>(room));
  else
    pack_quant(wire_, {x, n}, residue, room,
               stochastic_ ? std::optional<uint64_t>(bucket_key(key, b)) : std::nullopt);
  return room;
}

const float* WireCodec::decode(int b, const float* in) {
  if (wire_ == Wire::Fp32) return in;
  const kernels::Bucket& k = buckets_[static_cast<size_t>(b)];
  thread_local std::vector<float> room;
  room.resize(static_cast<size_t>(k.size()));
  float* x = room.data();
  const std::span<float> out(x, room.size());
  if (wire_ == Wire::Bf16)
    unpack_bf16(reinterpret_cast<const uint16_t*>(in), out);
  else
    unpack_quant(wire_, in, out);
  return x;
}

std::vector<float> WireCodec::residue() const {
  std::lock_guard lock(residue_mu_);
  return residue_;
}

void WireCodec::set_residue(const std::vector<float>& r) {
  std::lock_guard lock(residue_mu_);
  if (residue_.empty()) return;  // no error feedback here: a saved residue is dropped
  if (r.empty()) {
    std::fill(residue_.begin(), residue_.end(), 0.f);
    return;
  }
  if (r.size() != residue_.size())
    throw std::invalid_argument("a saved wire residue of " + std::to_string(r.size()) +
                                " values for a codec with " + std::to_string(residue_.size()));
  residue_ = r;
}

void WireCodec::save_state(std::vector<StatePart>& out, const StateLayout& layout) const {
  const std::vector<float> r = residue();
  if (!r.empty()) out.push_back(residue_part(layout.plain(r)));
}

void WireCodec::load_state(std::span<const StatePart> parts, const StateLayout& layout) {
  if (residue_.empty()) return;  // no error feedback here (fixed when made): nothing to restore
  const StatePart* p = find_part(parts, kResidueKind, 1);
  set_residue(p ? layout.own(read_residue(*p)) : std::vector<float>());
}

}  // namespace gg::gossip
