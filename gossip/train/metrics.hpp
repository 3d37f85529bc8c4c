// Metrics as JSON Lines: one object per event ({"event":"step",...}, "eval", "summary"),
// flushed as written so a run that dies still leaves its history.
#pragma once

#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

namespace gg::gossip {

// log.metrics in a folder named `latest` (the default, runs/latest/metrics.jsonl) asks for a
// fresh run folder per run: runs/<UTC time>/metrics.jsonl, with runs/latest a symlink to it (as
// Hydra and Lightning keep their runs), so that a second run never meets the first one's file.
bool names_run_folder(const std::string& metrics_path);

// Creates runs/<YYYYmmdd-HHMMSS>[-N]/ beside `latest` and points `latest` at it (replacing the
// link in one rename); returns the metrics path inside the new folder. A `latest` that is a real
// folder (written by an older gossipgrad) is first renamed to its own time, and `moved` says so;
// one that is a file is refused. Throws std::runtime_error naming the path.
std::string start_run_folder(const std::string& metrics_path, std::string* moved = nullptr);

// PATH.<rank>, the file of one rank's debug log (log.samples, log.losses), with its folder made
// (preflight checked that it can be).
std::string rank_log_path(const std::string& path, int rank);
// One line of log.losses: "step loss\n", the loss in C's exact hexadecimal (%a), so that two
// runs compare bit for bit.
std::string loss_line(int64_t step, double loss);

class MetricsWriter {
 public:
  MetricsWriter() = default;  // disabled: write() does nothing (ranks other than 0)
  // `append`: add to an existing file (a resumed run) instead of refusing or replacing it.
  MetricsWriter(const std::string& path, bool overwrite, bool append = false);
  // Throws std::runtime_error when the line cannot be written.
  void write(const nlohmann::json& event);
  // Adds key: value to every event written from now on (e.g. "emulated": true).
  void tag(const std::string& key, nlohmann::json value) { tags_[key] = std::move(value); }
  bool enabled() const { return out_.is_open(); }

 private:
  std::string path_;
  std::ofstream out_;
  nlohmann::json tags_ = nlohmann::json::object();
};

}  // namespace gg::gossip
