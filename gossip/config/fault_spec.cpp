#include "gossip/config/fault_spec.hpp"

#include <cmath>
#include <sstream>
#include <stdexcept>

#include "gossip/config/config.hpp"

namespace gg::gossip {

std::pair<int, int64_t> parse_fault_kill(const std::string& spec, const char* key) {
  const size_t colon = spec.find(':');
  try {
    size_t a = 0, b = 0;
    if (colon == std::string::npos) throw std::invalid_argument(spec);
    const int rank = std::stoi(spec.substr(0, colon), &a);
    const long long step = std::stoll(spec.substr(colon + 1), &b);
    if (a != colon || b != spec.size() - colon - 1 || rank < 0 || step < 0)
      throw std::invalid_argument(spec);
    return {rank, step};
  } catch (const std::exception&) {
    throw UsageError(std::string(key) + " = " + spec + " must be RANK:STEP (two integers >= 0)");
  }
}

std::vector<FaultEvent> parse_fault_inject(const std::string& spec) {
  const std::string error =
      "fault.inject = " + spec + " must be RANK:STEP[,RANK:STEP...] (integers >= 0)";
  std::vector<FaultEvent> events;
  std::stringstream in(spec);
  std::string item;
  while (std::getline(in, item, ',')) {
    try {
      const auto [rank, step] = parse_fault_kill(item, "fault.inject");
      events.push_back({step, rank});
    } catch (const UsageError&) {
      throw UsageError(error);
    }
  }
  if (events.empty() || spec.back() == ',') throw UsageError(error);
  return events;
}

std::vector<std::pair<int, double>> parse_emulate_slow(const std::string& spec) {
  std::vector<std::pair<int, double>> out;
  if (spec.empty()) return out;
  const std::string error =
      "emulate.slow = " + spec +
      " must be RANK:FACTOR[,RANK:FACTOR...] (rank >= 0, factor in [1, 1000])";
  std::stringstream in(spec);
  std::string item;
  while (std::getline(in, item, ',')) {
    const size_t colon = item.find(':');
    try {
      size_t a = 0, b = 0;
      if (colon == std::string::npos) throw std::invalid_argument(item);
      const int rank = std::stoi(item.substr(0, colon), &a);
      const double factor = std::stod(item.substr(colon + 1), &b);
      if (a != colon || b != item.size() - colon - 1 || rank < 0 || !std::isfinite(factor) ||
          factor < 1 || factor > 1000)
        throw std::invalid_argument(item);
      out.emplace_back(rank, factor);
    } catch (const std::exception&) {
      throw UsageError(error);
    }
  }
  if (out.empty() || spec.back() == ',') throw UsageError(error);
  return out;
}

}  // namespace gg::gossip
