#include "gossip/comm/timeline.hpp"

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "gossip/comm/wait_watch.hpp"
#include "kernels/durable_file.hpp"

namespace gg::gossip {

int Timeline::thread_index() {
  static std::atomic<int> next{0};
  thread_local const int id = next++;
  return id;
}

void Timeline::record(std::string name, const char* cat, Clock::time_point begin,
                      Clock::time_point end, std::string args) {
  if (!enabled_) return;
  using std::chrono::duration_cast;
  using us = std::chrono::microseconds;
  // Both ends on the same microsecond grid, so that nested spans stay nested after rounding.
  const int64_t ts = duration_cast<us>(begin - origin_).count();
  const int64_t te = duration_cast<us>(end - origin_).count();
  Event e{std::move(name), cat, ts, std::max<int64_t>(0, te - ts), thread_index(), std::move(args)};
  std::lock_guard lock(mu_);
  events_.push_back(std::move(e));
}

void Timeline::name_thread(const std::string& name) {
  if (!enabled_) return;
  const int tid = thread_index();
  std::lock_guard lock(mu_);
  thread_names_.emplace_back(tid, name);
}

std::string Timeline::events_json(int pid) const {
  std::lock_guard lock(mu_);
  std::string out;
  auto add = [&](const nlohmann::json& j) {
    if (!out.empty()) out += ",\n";
    out += j.dump();
  };
  add({{"ph", "M"},
       {"name", "process_name"},
       {"pid", pid},
       {"tid", 0},
       {"args", {{"name", "rank " + std::to_string(pid)}}}});
  for (const auto& [tid, name] : thread_names_)
    add({{"ph", "M"},
         {"name", "thread_name"},
         {"pid", pid},
         {"tid", tid},
         {"args", {{"name", name}}}});
  for (const Event& e : events_) {
    nlohmann::json j = {{"ph", "X"},       {"name", e.name}, {"cat", e.cat}, {"ts", e.ts_us},
                        {"dur", e.dur_us}, {"pid", pid},     {"tid", e.tid}};
    if (!e.args.empty()) j["args"] = nlohmann::json::parse(e.args);
    add(j);
  }
  return out;
}

void Timeline::write(const mpi::Comm& world, const std::string& path) const {
  const std::string mine = events_json(world.rank());
  int n = static_cast<int>(mine.size());
  std::vector<int> sizes(world.size()), offsets(world.size());
  GG_MPI_CHECK(MPI_Gather(&n, 1, MPI_INT, sizes.data(), 1, MPI_INT, 0, world.get()));
  std::string all;
  if (world.rank() == 0) {
    int64_t total = 0;
    for (int r = 0; r < world.size(); ++r) {
      offsets[r] = static_cast<int>(total);
      total += sizes[r];
    }
    if (total > INT32_MAX) throw std::runtime_error("timeline larger than 2 GB");
    all.resize(total);
  }
  const mpi::WatchedWait wait("MPI_Gatherv");
  GG_MPI_CHECK(MPI_Gatherv(mine.data(), n, MPI_CHAR, all.data(), sizes.data(), offsets.data(),
                           MPI_CHAR, 0, world.get()));
  if (world.rank() != 0) return;
  std::string text = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  text.reserve(text.size() + all.size() + 2 * world.size() + 4);
  bool first = true;
  for (int r = 0; r < world.size(); ++r) {
    if (sizes[r] == 0) continue;
    if (!first) text += ",\n";
    text.append(all.data() + offsets[r], sizes[r]);
    first = false;
  }
  text += "\n]}\n";
  kernels::write_file_durably(path, text);
}

}  // namespace gg::gossip
