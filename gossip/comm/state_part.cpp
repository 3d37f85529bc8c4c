#include "gossip/comm/state_part.hpp"

namespace gg::gossip {

const StatePart* find_part(std::span<const StatePart> parts, std::string_view kind,
                           uint32_t newest) {
  for (const StatePart& p : parts) {
    if (p.kind != kind) continue;
    if (p.version > newest)
      throw std::runtime_error("the rank state's " + p.kind + " (exchange " + p.exchange +
                               ") is of format " + std::to_string(p.version) +
                               ", newer than this gossipgrad reads (" + std::to_string(newest) +
                               "): resume it with the gossipgrad that wrote it");
    return &p;
  }
  return nullptr;
}

StatePart floats_part(std::string kind, uint32_t version, const std::vector<float>& values) {
  PartWriter w;
  w.array(values);
  return w.part(std::move(kind), version);
}

std::vector<float> read_floats(const StatePart& p) {
  PartReader r(p);
  std::vector<float> v = r.get_array<float>();
  r.end();
  return v;
}

void PartReader::fail() const {
  throw std::runtime_error("the rank state's " + p_.kind + " (exchange " + p_.exchange +
                           ") is truncated or corrupt");
}

}  // namespace gg::gossip
