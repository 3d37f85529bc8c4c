#include "gossip/comm/wire.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>

namespace gg::gossip {

Wire parse_wire(const std::string& name) {
  if (name == "fp32") return Wire::Fp32;
  if (name == "bf16") return Wire::Bf16;
  if (name == "int8") return Wire::Int8;
  if (name == "int4") return Wire::Int4;
  throw std::invalid_argument("unknown wire precision '" + name +
                              "' (expected fp32, bf16, int8 or int4)");
}

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

int64_t wire_floats(Wire w, int64_t n) {
  const int64_t blocks = (n + kQuantBlock - 1) / kQuantBlock;
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
// when kept, becomes v - q * scale.
float quantize_block(std::span<const float> v, int top, int8_t* q, float* residue) {
  float m = 0;
  for (float a : v) m = std::max(m, std::fabs(a));
  bool finite = std::isfinite(m);
  for (float a : v) finite = finite && !std::isnan(a);  // std::max drops NaNs
  if (!finite) {
    std::fill(q, q + v.size(), int8_t{0});
    if (residue) std::fill(residue, residue + v.size(), std::numeric_limits<float>::quiet_NaN());
    return std::numeric_limits<float>::quiet_NaN();
  }
  const float scale = m / static_cast<float>(top);
  const float inv = m > 0 ? static_cast<float>(top) / m : 0.f;
  for (size_t i = 0; i < v.size(); ++i) {
    const float level =
        std::clamp(std::nearbyint(v[i] * inv), static_cast<float>(-top), static_cast<float>(top));
    q[i] = static_cast<int8_t>(level);
    if (residue) residue[i] = v[i] - level * scale;
  }
  return scale;
}
}  // namespace

void pack_quant(Wire w, std::span<const float> x, std::span<float> residue, float* out) {
  if (w != Wire::Int8 && w != Wire::Int4)
    throw std::invalid_argument("pack_quant: int8 or int4 only");
  const size_t n = x.size();
  if (!residue.empty() && residue.size() != n)
    throw std::invalid_argument("pack_quant: the residue must have one value per value packed");
  const int top = top_level(w);
  const auto blocks =
      static_cast<size_t>((static_cast<int64_t>(n) + kQuantBlock - 1) / kQuantBlock);
  auto* bytes = reinterpret_cast<uint8_t*>(out + blocks);
  const size_t level_bytes =
      static_cast<size_t>(wire_floats(w, static_cast<int64_t>(n)) - static_cast<int64_t>(blocks)) *
      4;
  std::memset(bytes, 0, level_bytes);
  float v[kQuantBlock];
  int8_t q[kQuantBlock];
  for (size_t k = 0; k < blocks; ++k) {
    const size_t lo = k * kQuantBlock, m = std::min<size_t>(kQuantBlock, n - lo);
    for (size_t i = 0; i < m; ++i) v[i] = x[lo + i] + (residue.empty() ? 0.f : residue[lo + i]);
    out[k] = quantize_block({v, m}, top, q, residue.empty() ? nullptr : residue.data() + lo);
    for (size_t i = 0; i < m; ++i) {
      if (w == Wire::Int8) {
        bytes[lo + i] = static_cast<uint8_t>(q[i]);
      } else {  // the level + 8 (1..15) in a nibble: even values low, odd values high
        const auto nibble = static_cast<uint8_t>(q[i] + 8);
        bytes[(lo + i) / 2] |= static_cast<uint8_t>((lo + i) % 2 ? nibble << 4 : nibble);
      }
    }
  }
}

void unpack_quant(Wire w, const float* in, std::span<float> x) {
  const size_t n = x.size();
  const auto blocks =
      static_cast<size_t>((static_cast<int64_t>(n) + kQuantBlock - 1) / kQuantBlock);
  const auto* bytes = reinterpret_cast<const uint8_t*>(in + blocks);
  for (size_t i = 0; i < n; ++i) {
    const int level = w == Wire::Int8 ? static_cast<int8_t>(bytes[i])
                                      : ((bytes[i / 2] >> (i % 2 ? 4 : 0)) & 0xf) - 8;
    x[i] = static_cast<float>(level) * in[i / kQuantBlock];
  }
}

WireCodec::WireCodec(Wire wire, bool error_feedback, std::vector<kernels::Bucket> buckets)
    : wire_(wire), buckets_(std::move(buckets)) {
  if (error_feedback && wire_ == Wire::Fp32)
    throw std::invalid_argument("error feedback needs a lossy wire (bf16, int8 or int4)");
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
  unpacked_.assign(static_cast<size_t>(count), 0.f);
  if (error_feedback) residue_.assign(static_cast<size_t>(count), 0.f);
}

const float* WireCodec::encode(int b, const float* x) {
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
    pack_quant(wire_, {x, n}, residue, room);
  return room;
}

const float* WireCodec::decode(int b, const float* in) {
  if (wire_ == Wire::Fp32) return in;
  const kernels::Bucket& k = buckets_[static_cast<size_t>(b)];
  float* x = unpacked_.data() + k.begin;
  const std::span<float> out(x, static_cast<size_t>(k.size()));
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
  if (r.empty()) {
    std::fill(residue_.begin(), residue_.end(), 0.f);
    return;
  }
  if (r.size() != residue_.size())
    throw std::invalid_argument("a saved wire residue of " + std::to_string(r.size()) +
                                " values for a codec with " + std::to_string(residue_.size()));
  residue_ = r;
}

}  // namespace gg::gossip
