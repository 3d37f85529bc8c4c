// Metrics as JSON Lines: one object per event ({"event":"step",...}, "eval", "summary"),
// flushed as written so a run that dies still leaves its history.
#pragma once

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

namespace gg::gossip {

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
