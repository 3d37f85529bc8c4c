#include "gossip/resilience/emergency.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "gossip/resilience/full_checkpoint.hpp"
#include "kernels/durable_file.hpp"

namespace gg::gossip {
namespace fs = std::filesystem;

EmergencyScan scan_emergency_states(const std::string& folder, int ranks) {
  EmergencyScan scan;
  bool first = true;
  for (int r = 0; r < ranks; ++r) {
    const std::string path = (fs::path(folder) / rank_file_name(r)).string();
    struct stat st = {};
    if (::stat(path.c_str(), &st) != 0) {
      scan.lost.push_back(r);
      continue;
    }
    try {
      const std::vector<uint8_t> bytes = read_file(path);
      const RankState s = decode_state(bytes.data(), bytes.size(), path);
      if (s.rank != r || s.ranks != ranks)
        throw std::runtime_error(path + ": written by rank " + std::to_string(s.rank) + " of " +
                                 std::to_string(s.ranks) + ", expected rank " + std::to_string(r) +
                                 " of " + std::to_string(ranks));
      scan.min_step = first ? s.step : std::min(scan.min_step, s.step);
      scan.max_step = first ? s.step : std::max(scan.max_step, s.step);
      const double t = static_cast<double>(st.st_mtim.tv_sec) + 1e-9 * st.st_mtim.tv_nsec;
      scan.first_written_unix = first ? t : std::min(scan.first_written_unix, t);
      first = false;
      scan.survivors.push_back(r);
    } catch (const std::exception& e) {
      if (scan.corrupt.empty()) scan.corrupt = e.what();
    }
  }
  return scan;
}

void write_recovery_plan(const std::string& folder, const RecoveryPlan& p) {
  const nlohmann::json j = {{"format", "gossipgrad-recovery-plan"},
                            {"survivors", p.survivors},
                            {"lost", p.lost},
                            {"ranks_before", p.ranks_before},
                            {"step", p.step},
                            {"steps_redone", p.steps_redone},
                            {"failed_unix", p.failed_unix}};
  kernels::write_file_durably((fs::path(folder) / kRecoveryPlanFile).string(), j.dump() + "\n");
}

RecoveryPlan read_recovery_plan(const std::string& folder) {
  const std::string path = (fs::path(folder) / kRecoveryPlanFile).string();
  std::ifstream f(path);
  if (!f) throw std::runtime_error(path + " is missing");
  RecoveryPlan p;
  try {
    const nlohmann::json j = nlohmann::json::parse(f);
    if (j.value("format", "") != "gossipgrad-recovery-plan")
      throw std::runtime_error("not a recovery plan");
    p.survivors = j.at("survivors").get<std::vector<int>>();
    p.lost = j.at("lost").get<std::vector<int>>();
    p.ranks_before = j.at("ranks_before").get<int>();
    p.step = j.at("step").get<int64_t>();
    p.steps_redone = j.at("steps_redone").get<int64_t>();
    p.failed_unix = j.at("failed_unix").get<double>();
    if (p.survivors.empty() || p.step < 0 || p.ranks_before < 1)
      throw std::runtime_error("survivors, step or ranks_before out of range");
    for (int r : p.survivors)
      if (r < 0 || r >= p.ranks_before) throw std::runtime_error("a survivor out of range");
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(path + ": malformed (" + std::string(e.what()) + ")");
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(path + ": " + e.what());
  }
  return p;
}

}  // namespace gg::gossip
