// Wire codecs: how a bucket's values travel. Pure functions over spans (no MPI, no threads): the
// exchange engine packs a bucket before it sends it and unpacks the partner's before a mixing
// rule (mixing.hpp) reads it.
#pragma once

#include <cstdint>
#include <span>
#include <string>

namespace gg::gossip {

// As they are (fp32), or rounded to bfloat16 (half the bytes; the receiver mixes them in fp32).
// With error feedback, what rounding took off a value is added to it before the next rounding, so
// no part of a value is lost for good.
enum class Wire { Fp32, Bf16 };
// "fp32" | "bf16"; throws std::invalid_argument otherwise.
Wire parse_wire(const std::string& name);

// fp32 -> bf16, rounding to nearest, ties to even (NaN stays NaN), and back (exact).
uint16_t to_bf16(float f);
float from_bf16(uint16_t h);

// Floats' room a bucket of n values takes on the wire (bf16: two values in each float).
int64_t wire_floats(Wire w, int64_t n);

// x -> bf16 in out[0, x.size()) (an odd count's last half is zeroed: out has wire_floats room).
// With a residue (same size as x; empty: none), x + residue is rounded and the residue becomes
// what rounding took off it.
void pack_bf16(std::span<const float> x, std::span<float> residue, uint16_t* out);
// in[0, x.size()) -> x.
void unpack_bf16(const uint16_t* in, std::span<float> x);

}  // namespace gg::gossip
