// The grammar of the fault.* option values: "RANK:STEP" hooks, "RANK:STEP,..." injected failures
// and the recovery strategy; and of emulate.slow, "RANK:FACTOR,..." stragglers. Parsing only: the
// plan a run follows is gossip/resilience/faults.hpp.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace gg::gossip {

enum class FaultStrategy {
  Restart,   // every rank reloads the last full checkpoint (or the initial state) and redoes
  Rollback,  // the failed rank takes a live rank's state; every rank redoes the interrupted step
  Forward,   // the survivors carry on without the failed rank (lossy forward recovery)
};
inline constexpr std::pair<FaultStrategy, std::string_view> kFaultStrategyNames[] = {
    {FaultStrategy::Restart, "restart"},
    {FaultStrategy::Rollback, "rollback"},
    {FaultStrategy::Forward, "forward"}};
constexpr std::span<const std::pair<FaultStrategy, std::string_view>> enum_names(FaultStrategy) {
  return kFaultStrategyNames;
}

// Rank `rank` (of the job's original ranks) fails at the boundary before step `step`, counted
// in the steps of the job at its starting rank count: after a forward recovery, where an epoch
// has more steps, a later failure comes at the same point of the same epoch.
struct FaultEvent {
  int64_t step = 0;
  int rank = 0;
  bool operator==(const FaultEvent&) const = default;
};

// fault.kill / fault.stall "RANK:STEP" -> {rank, step}; throws UsageError naming `key`.
std::pair<int, int64_t> parse_fault_kill(const std::string& spec, const char* key = "fault.kill");

// "RANK:STEP[,RANK:STEP...]" -> events in the order given; throws UsageError naming fault.inject.
std::vector<FaultEvent> parse_fault_inject(const std::string& spec);

// emulate.slow "RANK:FACTOR[,RANK:FACTOR...]" -> {rank, factor >= 1} in the order given (empty:
// none); throws UsageError naming emulate.slow.
std::vector<std::pair<int, double>> parse_emulate_slow(const std::string& spec);

}  // namespace gg::gossip
