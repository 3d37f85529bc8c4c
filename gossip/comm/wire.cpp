#include "gossip/comm/wire.hpp"

#include <cstring>
#include <stdexcept>

namespace gg::gossip {

Wire parse_wire(const std::string& name) {
  if (name == "fp32") return Wire::Fp32;
  if (name == "bf16") return Wire::Bf16;
  throw std::invalid_argument("unknown wire precision '" + name + "' (expected fp32 or bf16)");
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

int64_t wire_floats(Wire w, int64_t n) { return w == Wire::Bf16 ? (n + 1) / 2 : n; }

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

WireCodec::WireCodec(Wire wire, bool error_feedback, std::vector<kernels::Bucket> buckets)
    : wire_(wire), buckets_(std::move(buckets)) {
  if (error_feedback && wire_ != Wire::Bf16)
    throw std::invalid_argument("error feedback needs the bf16 wire");
  const int64_t count = buckets_.empty() ? 0 : buckets_.front().end;
  if (wire_ == Wire::Fp32) {
    layout_ = buckets_;
    floats_ = count;
    return;
  }
  // Bucket b travels as ceil(n / 2) floats' room, two bf16 values in each, laid out in the same
  // order as the buckets (bucket 0 last).
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
  pack_bf16({x, n},
            residue_.empty() ? std::span<float>() : std::span<float>(residue_.data() + k.begin, n),
            reinterpret_cast<uint16_t*>(room));
  return room;
}

const float* WireCodec::decode(int b, const float* in) {
  if (wire_ == Wire::Fp32) return in;
  const kernels::Bucket& k = buckets_[static_cast<size_t>(b)];
  float* x = unpacked_.data() + k.begin;
  unpack_bf16(reinterpret_cast<const uint16_t*>(in), {x, static_cast<size_t>(k.size())});
  return x;
}

}  // namespace gg::gossip
