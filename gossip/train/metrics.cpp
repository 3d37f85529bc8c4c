#include "gossip/train/metrics.hpp"

#include <filesystem>
#include <stdexcept>

namespace gg::gossip {

MetricsWriter::MetricsWriter(const std::string& path, bool overwrite, bool append) : path_(path) {
  namespace fs = std::filesystem;
  const fs::path p(path);
  if (fs::exists(p) && !overwrite && !append)
    throw std::runtime_error("metrics file " + path + " already exists; refusing to overwrite it");
  if (p.has_parent_path()) fs::create_directories(p.parent_path());
  out_.open(p, append ? std::ios::app : std::ios::trunc);
  if (!out_) throw std::runtime_error("cannot write the metrics file " + path);
}

void MetricsWriter::write(const nlohmann::json& event) {
  if (!out_.is_open()) return;
  if (tags_.empty()) {
    out_ << event.dump() << '\n';
  } else {
    nlohmann::json tagged = event;
    tagged.update(tags_);
    out_ << tagged.dump() << '\n';
  }
  out_.flush();
  // A full disk must not lose the run's history silently.
  if (!out_) throw std::runtime_error("cannot write the metrics file " + path_ + " (disk full?)");
}

}  // namespace gg::gossip
