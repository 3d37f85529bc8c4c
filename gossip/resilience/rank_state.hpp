// Everything one rank needs to continue training exactly where it stood: the unit of a full
// checkpoint (one file per rank) and of the NaN guard's in-memory snapshots.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "gossip/comm/state_part.hpp"

namespace gg::gossip {

// The exchanges a rank's state parts belong to: the trainer's three buffers.
inline constexpr std::string_view kGradientExchange = "gradients";
inline constexpr std::string_view kWeightExchange = "weights";
inline constexpr std::string_view kMomentumExchange = "momentum";

struct RankState {
  int64_t step = 0;             // optimizer steps done: the next step to run
  int64_t steps_per_epoch = 0;  // of the run that wrote it (another rank count changes it)
  int rank = 0, ranks = 1;
  double lr_scale = 1;  // the NaN guard's learning-rate scale
  int nan_restores = 0;
  uint64_t dropout_step = 0;  // the executor's dropout-mask counter
  bool sgd_started = false;   // the momentum buffer has been seeded
  std::vector<float> params, buffers, velocity;
  // The overlapped weight exchange's correction, computed but not applied yet (empty: none).
  std::vector<float> delayed_delta;
  std::vector<uint8_t> shuffle;  // DistributedShuffle::save (empty with data.shuffle = off)
  // gossip.consensus_bound: ||w - w_partner||^2 measured by the weight exchange and not taken by
  // a check yet (an exchange completed by an evaluation or a global average between steps).
  double consensus_distance = 0;
  // What the exchanges' rules and codecs keep from step to step, each part tagged with its
  // exchange and read back only by its owner (gossip/comm/state_part.hpp; empty: none).
  std::vector<StatePart> parts;
};

// The state as bytes (little-endian, the host's float format) and back. decode_state throws
// std::runtime_error naming `what` for anything malformed or truncated.
std::vector<uint8_t> encode_state(const RankState& s);
// The same bytes written at dst (which has room for them); with dst null, only their count.
size_t encode_state_into(const RankState& s, uint8_t* dst);
RankState decode_state(const uint8_t* data, size_t size, const std::string& what);

}  // namespace gg::gossip
