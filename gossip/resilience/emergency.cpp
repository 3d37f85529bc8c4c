#include "gossip/resilience/emergency.hpp"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "gossip/resilience/full_checkpoint.hpp"
#include "kernels/durable_file.hpp"

namespace gg::gossip {
namespace fs = std::filesystem;

namespace {

constexpr char kGoneCode = 'g';

// "rank-00000.EXT": the files a rank's saver leaves beside its state.
std::string rank_file(int rank, const char* ext) {
  char name[48];
  std::snprintf(name, sizeof name, "rank-%05d.%s", rank, ext);
  return name;
}

// A saver's "<unix seconds> <code>" file (emergency_when_name); code 0: none, or unreadable.
struct SaverEnd {
  double unix = 0;
  char code = 0;
};
SaverEnd read_saver_end(const fs::path& path) {
  std::ifstream f(path);
  SaverEnd e;
  if (!(f >> e.unix >> e.code)) return {};
  return e;
}

double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

std::string saving_mark_name(int rank) { return rank_file(rank, "saving"); }

int run_emergency_saver(const std::string& folder, int rank) {
  // Nothing the rank had open but the pipe and the shared memory (hydra's sockets among them).
  std::vector<int> open_fds;
  for (const auto& entry : fs::directory_iterator("/proc/self/fd"))
    open_fds.push_back(std::atoi(entry.path().filename().c_str()));
  for (int fd : open_fds)
    if (fd > kSaverMemFd) ::close(fd);
  std::ofstream(fs::path(folder) / emergency_started_name(rank)).put('\n');
  char why = 0;
  ssize_t got;
  do {
    got = ::read(kSaverPipeFd, &why, 1);
  } while (got < 0 && errno == EINTR);
  struct stat st = {};
  void* p = MAP_FAILED;
  if (::fstat(kSaverMemFd, &st) == 0 && static_cast<uint64_t>(st.st_size) >= kEmergencySlotsAt)
    p = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_SHARED, kSaverMemFd, 0);
  const auto* header = p == MAP_FAILED ? nullptr : static_cast<const EmergencyHeader*>(p);
  if (got != 1 && header != nullptr && header->ended.load()) return 0;  // a clean end: no save
  {  // when and how this rank's end was seen: the supervisor names the first rank process gone
    char when[64];
    std::snprintf(when, sizeof when, "%.6f %c\n", wall_seconds(), got != 1 ? kGoneCode : why);
    std::ofstream(fs::path(folder) / emergency_when_name(rank)) << when;
  }
  const fs::path mark = fs::path(folder) / saving_mark_name(rank);
  std::ofstream(mark).put('\n');
  std::string what;
  try {
    if (header == nullptr) throw std::runtime_error("cannot map the shared memory");
    const size_t total = static_cast<size_t>(st.st_size);
    const uint32_t active = header->active.load(std::memory_order_acquire);
    if (active == kNoState) {
      what = "no step boundary reached yet: nothing saved";
    } else {
      const uint64_t size = header->size[active];
      const uint64_t at = kEmergencySlotsAt + active * header->capacity;
      if (active > 1 || size > header->capacity || at + size > total)
        throw std::runtime_error("the shared memory is inconsistent");
      const auto* bytes = static_cast<const uint8_t*>(p) + at;
      const std::string path = (fs::path(folder) / rank_file_name(rank)).string();
      const RankState s = decode_state(bytes, size, path);  // checks it before it goes to disk
      write_file_durably(path, bytes, size);
      what = "emergency state after step " + std::to_string(s.step) + " written to " + path;
    }
  } catch (const std::exception& e) {
    what = std::string("emergency state not written: ") + e.what();
  }
  const char* reason = got != 1             ? "the rank's process is gone (killed or crashed)"
                       : why == kNoticeByte ? "a peer process died (SIGUSR1 from the launcher)"
                                            : "a partner timed out (no notice came: a lost link?)";
  std::ofstream(fs::path(folder) / emergency_log_name(rank))
      << "gossipgrad: rank " << rank << ": " << reason << ": " << what << "\n";
  std::error_code ec;
  fs::remove(mark, ec);
  // Saved for a timeout: whether the launcher's notice still reaches this rank (the supervisor
  // sends one to all ranks) tells the supervisor whether its node can be reached at all.
  if (got == 1 && why == kTimeoutByte) {
    char byte = 0;
    ssize_t more;
    do {
      more = ::read(kSaverPipeFd, &byte, 1);
    } while (more < 0 && errno == EINTR);
    if (more == 1 && byte == kNoticeByte)
      std::ofstream(fs::path(folder) / emergency_reached_name(rank)).put('\n');
  }
  return 0;
}

std::string emergency_when_name(int rank) { return rank_file(rank, "when"); }

std::string emergency_started_name(int rank) { return rank_file(rank, "started"); }

std::string emergency_reached_name(int rank) { return rank_file(rank, "reached"); }

std::string emergency_log_name(int rank) { return rank_file(rank, "log"); }

std::vector<std::string> emergency_logs(const std::string& folder, int ranks) {
  std::vector<std::string> out;
  for (int r = 0; r < ranks; ++r) {
    std::ifstream f(fs::path(folder) / emergency_log_name(r));
    for (std::string line; std::getline(f, line);) out.push_back(line);
  }
  return out;
}

EmergencyActivity emergency_activity(const std::string& folder) {
  EmergencyActivity a;
  std::error_code ec;
  for (fs::directory_iterator it(folder, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind("rank-", 0) != 0) continue;
    if (name.ends_with(".saving")) ++a.saving;
    if (name.ends_with(".bin")) ++a.states;
    if (name.ends_with(".started")) ++a.started;
    if (name.ends_with(".when") && read_saver_end(it->path()).code == kTimeoutByte) ++a.timeouts;
  }
  return a;
}

EmergencyScan scan_emergency_states(const std::string& folder, int ranks, double ended_unix) {
  EmergencyScan scan;
  // When every save was for a partner timeout (no process died: a link did), the ranks that the
  // supervisor's notice reached afterwards are the connected ones; the others' nodes are cut off.
  std::vector<SaverEnd> ends(static_cast<size_t>(ranks));
  std::vector<char> code(static_cast<size_t>(ranks), 0);
  std::vector<bool> reached(static_cast<size_t>(ranks), false);
  for (int r = 0; r < ranks; ++r) {
    const SaverEnd e = ends[static_cast<size_t>(r)] =
        read_saver_end(fs::path(folder) / emergency_when_name(r));
    if (e.code == 0) continue;
    if (ended_unix > 0 && e.unix >= ended_unix) continue;  // ended by the supervisor: says nothing
    const char c = code[static_cast<size_t>(r)] = e.code;
    reached[static_cast<size_t>(r)] =
        c == kNoticeByte || fs::exists(fs::path(folder) / emergency_reached_name(r));
  }
  const bool timeouts_only =
      std::all_of(code.begin(), code.end(), [](char c) { return c == 0 || c == kTimeoutByte; }) &&
      std::any_of(code.begin(), code.end(), [](char c) { return c == kTimeoutByte; });
  const bool any_reached = std::any_of(reached.begin(), reached.end(), [](bool b) { return b; });
  bool first = true;
  for (int r = 0; r < ranks; ++r) {
    const std::string path = (fs::path(folder) / rank_file_name(r)).string();
    struct stat st = {};
    if (::stat(path.c_str(), &st) != 0) {
      scan.lost.push_back(r);
      continue;
    }
    if (timeouts_only && any_reached && !reached[static_cast<size_t>(r)]) {
      scan.lost.push_back(r);
      scan.unreachable.push_back(r);
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
      double t = static_cast<double>(st.st_mtim.tv_sec) + 1e-9 * st.st_mtim.tv_nsec;
      const SaverEnd& e = ends[static_cast<size_t>(r)];
      if (e.code != 0) {
        t = e.unix;
        if (e.code == kGoneCode && (scan.first_gone < 0 || e.unix < scan.first_gone_unix)) {
          scan.first_gone = r;
          scan.first_gone_unix = e.unix;
        }
      }
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
                            {"first_gone", p.first_gone},
                            {"ranks_before", p.ranks_before},
                            {"step", p.step},
                            {"steps_redone", p.steps_redone},
                            {"failed_unix", p.failed_unix},
                            {"replace", p.replace}};
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
    p.first_gone = j.at("first_gone").get<int>();
    p.ranks_before = j.at("ranks_before").get<int>();
    p.step = j.at("step").get<int64_t>();
    p.steps_redone = j.at("steps_redone").get<int64_t>();
    p.failed_unix = j.at("failed_unix").get<double>();
    p.replace = j.value("replace", false);
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
