#include "gossip/train/metrics.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <stdexcept>

namespace gg::gossip {

namespace fs = std::filesystem;

namespace {

std::string utc_stamp(std::time_t t) {
  std::tm tm = {};
  ::gmtime_r(&t, &tm);
  char text[32];
  std::strftime(text, sizeof text, "%Y%m%d-%H%M%S", &tm);
  return text;
}

// base/stamp, or base/stamp-N for the first N that is free, created (mkdir is the arbiter
// between runs starting in the same second).
fs::path make_fresh_folder(const fs::path& base, const std::string& stamp) {
  for (int n = 0;; ++n) {
    const fs::path dir = base / (n == 0 ? stamp : stamp + "-" + std::to_string(n));
    if (::mkdir(dir.c_str(), 0777) == 0) return dir;
    if (errno != EEXIST || n > 1000)
      throw std::runtime_error("log.metrics: cannot create the run folder " + dir.string() + ": " +
                               std::strerror(errno));
  }
}

}  // namespace

bool names_run_folder(const std::string& metrics_path) {
  const fs::path p(metrics_path);
  return p.has_filename() && p.parent_path().filename() == "latest";
}

std::string rank_log_path(const std::string& path, int rank) {
  const std::string file = path + "." + std::to_string(rank);
  std::error_code ec;
  if (const auto folder = fs::path(file).parent_path(); !folder.empty())
    fs::create_directories(folder, ec);
  return file;
}

std::string loss_line(int64_t step, double loss) {
  char line[64];
  std::snprintf(line, sizeof line, "%lld %a\n", static_cast<long long>(step), loss);
  return line;
}

std::string start_run_folder(const std::string& metrics_path, std::string* moved) {
  const fs::path path(metrics_path), latest = path.parent_path();
  const fs::path base = latest.parent_path().empty() ? fs::path(".") : latest.parent_path();
  std::error_code ec;
  fs::create_directories(base, ec);
  if (ec)
    throw std::runtime_error("log.metrics = " + metrics_path + ": cannot create " + base.string() +
                             ": " + ec.message());
  const fs::file_status st = fs::symlink_status(latest, ec);
  if (fs::is_directory(st)) {
    // An older gossipgrad wrote into a real folder here: kept, under the time it was last written.
    const auto written = fs::last_write_time(latest, ec);
    const auto t = std::chrono::system_clock::to_time_t(std::chrono::file_clock::to_sys(written));
    const fs::path aside = make_fresh_folder(base, utc_stamp(ec ? std::time(nullptr) : t));
    fs::rename(latest, aside, ec);  // over the empty folder just made: one rename
    if (ec)
      throw std::runtime_error("log.metrics: cannot move the folder " + latest.string() +
                               " aside to " + aside.string() + ": " + ec.message());
    if (moved) *moved = latest.string() + " (a folder) moved to " + aside.string();
  } else if (fs::exists(st) && !fs::is_symlink(st)) {
    throw std::runtime_error("log.metrics = " + metrics_path + ": " + latest.string() +
                             " is a file, not the link to the latest run: move it away");
  }
  const fs::path dir = make_fresh_folder(base, utc_stamp(std::time(nullptr)));
  // latest -> dir: a new link beside it, renamed over the old one (never a moment without one).
  const fs::path link = base / (".latest-" + std::to_string(::getpid()));
  fs::remove(link, ec);
  fs::create_symlink(dir.filename(), link, ec);
  if (!ec) fs::rename(link, latest, ec);
  if (ec) {
    fs::remove(link);
    throw std::runtime_error("log.metrics: cannot point " + latest.string() + " at " +
                             dir.string() + ": " + ec.message());
  }
  return (dir / path.filename()).string();
}

MetricsWriter::MetricsWriter(const std::string& path, bool overwrite, bool append) : path_(path) {
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
