// Wire codecs: how a bucket's values travel. Pure functions over spans (no MPI, no threads): the
// exchange engine packs a bucket before it sends it and unpacks the partner's before a mixing
// rule (mixing.hpp) reads it.
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gossip/comm/names.hpp"
#include "gossip/comm/state_part.hpp"
#include "kernels/graph.hpp"

namespace gg::gossip {

// As they are (fp32), rounded to bfloat16 (half the bytes), or quantized in blocks of kQuantBlock
// values, each block with its own fp32 scale (its largest magnitude over 127 or 7): int8 (a
// byte a value, 0.27x fp32's bytes) or int4 (levels -7..7, two values a byte, 0.14x); rounding
// to nearest, ties to even. The receiver mixes the values in fp32. With error feedback, what
// rounding took off a value is added to it before the next rounding, so no part of a value is
// lost for good.
enum class Wire { Fp32, Bf16, Int8, Int4 };
inline constexpr std::pair<Wire, std::string_view> kWireNames[] = {
    {Wire::Fp32, "fp32"}, {Wire::Bf16, "bf16"}, {Wire::Int8, "int8"}, {Wire::Int4, "int4"}};
constexpr std::span<const std::pair<Wire, std::string_view>> enum_names(Wire) { return kWireNames; }
inline constexpr int64_t kQuantBlock = 64;
// A name of the table; throws std::invalid_argument otherwise.
Wire parse_wire(const std::string& name);
// Whether values lose bits on this wire (all but fp32): what error feedback, stochastic rounding
// and CHOCO's public copies act on.
constexpr bool lossy(Wire w) { return w != Wire::Fp32; }
// Whether the wire quantizes in blocks (int8, int4): what stochastic rounding acts on.
constexpr bool quantized(Wire w) { return w == Wire::Int8 || w == Wire::Int4; }

// fp32 -> bf16, rounding to nearest, ties to even (NaN stays NaN), and back (exact).
uint16_t to_bf16(float f);
float from_bf16(uint16_t h);

// Floats' room a bucket of n values takes on the wire (bf16: two values in each float; int8 and
// int4: a scale per block, then four or eight values in each float).
int64_t wire_floats(Wire w, int64_t n);

// x -> bf16 in out[0, x.size()) (an odd count's last half is zeroed: out has wire_floats room).
// With a residue (same size as x; empty: none), x + residue is rounded and the residue becomes
// what rounding took off it.
void pack_bf16(std::span<const float> x, std::span<float> residue, uint16_t* out);
// in[0, x.size()) -> x.
void unpack_bf16(const uint16_t* in, std::span<float> x);

// Int8 / Int4: x -> out[0, wire_floats(w, x.size())): the blocks' scales, then the packed
// levels (a last float's unused bytes zeroed). Each value is within half its block's step (scale)
// of what unpack_quant gives back; a block with a NaN or an infinity comes back all NaN. With a
// residue as pack_bf16's.
// With a stochastic key, each value is rounded down or up at random instead of to nearest, up
// with the probability of its distance to the level below (unbiased: the expected level is the
// value; each value within one step of what comes back), drawn from a hash of (key, index): the
// same key gives the same bytes.
void pack_quant(Wire w, std::span<const float> x, std::span<float> residue, float* out,
                std::optional<uint64_t> stochastic = std::nullopt);
void unpack_quant(Wire w, const float* in, std::span<float> x);

// The stochastic rounding key of what `rank` sends in exchange `step` of buffer `stream` (0 the
// gradients, 1 the weights, 2 the momentum: each buffer's draws of a step are its own) of a run
// seeded `seed`, and of its bucket b: a function of these alone, so that a resumed run, a replay
// and virtual ranks round alike.
uint64_t wire_key(uint64_t seed, int rank, int64_t step, int stream = 0);
uint64_t bucket_key(uint64_t key, int bucket);

// The residue as a state part (plain values), and back (std::runtime_error: malformed).
inline constexpr std::string_view kResidueKind = "wire-residue";
inline StatePart residue_part(const std::vector<float>& plain) {
  return floats_part(std::string(kResidueKind), 1, plain);
}
inline std::vector<float> read_residue(const StatePart& p) { return read_floats(p); }

// One flat buffer's buckets on a wire: where each bucket lies in the transport's layout, and the
// rooms that hold this rank's packed buckets and the error-feedback residue (error_feedback: a
// lossy wire's). fp32 passes values through untouched. No MPI, no threads: bucket b is encoded
// and decoded by one thread at a time.
class WireCodec {
 public:
  // stochastic: int8 / int4 with stochastic rounding (encode's key then picks the draws).
  WireCodec(Wire wire, bool error_feedback, std::vector<kernels::Bucket> buckets,
            bool stochastic = false);
  Wire wire() const { return wire_; }
  // The buckets in the transport's layout (bf16: ceil(n / 2) floats each, bucket 0 last) and that
  // layout's size in floats.
  const std::vector<kernels::Bucket>& layout() const { return layout_; }
  int64_t floats() const { return floats_; }
  // Bucket b's values x as they go on the wire: x itself (fp32), or its packed image.
  const float* encode(int b, const float* x, uint64_t key = 0);
  // The partner's bucket b as it came off the wire, as fp32 values (fp32: `in` itself). A lossy
  // wire's values lie in a room of the calling thread, valid until its next decode by any codec:
  // they are mixed at once, so no model-sized room is kept.
  const float* decode(int b, const float* in);
  // The error-feedback residue (empty without): a rank's state, saved with its checkpoints. Safe
  // while another thread encodes (staleness 1 leaves buckets in flight at a step's end).
  std::vector<float> residue() const;
  // A saved residue back (the same size; empty: zeroes). Throws std::invalid_argument otherwise.
  // A codec without error feedback keeps none: it drops what it is given.
  void set_residue(const std::vector<float>& r);
  // The residue as a rank's state holds it (state_part.hpp, plain layout; nothing without error
  // feedback), and back: none among `parts` gives zeroes.
  void save_state(std::vector<StatePart>& out, const StateLayout& layout) const;
  void load_state(std::span<const StatePart> parts, const StateLayout& layout);

 private:
  Wire wire_;
  bool stochastic_ = false;
  std::vector<kernels::Bucket> buckets_, layout_;
  int64_t floats_ = 0;
  std::vector<float> packed_, residue_;
  mutable std::mutex residue_mu_;  // residue_ (error feedback only)
};

}  // namespace gg::gossip
