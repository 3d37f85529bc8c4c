#include "gossip/resilience.hpp"

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

#include "gossip/data.hpp"
#include "gossip/trainer.hpp"
#include "shuffle/loader.hpp"

namespace gg::gossip {
namespace {

namespace fs = std::filesystem;

constexpr char kRankMagic[8] = {'G', 'G', 'R', 'A', 'N', 'K', '0', '1'};
constexpr const char* kConfigFile = "config.ini";

void put_bytes(std::vector<uint8_t>& out, const void* data, size_t n) {
  const size_t at = out.size();
  out.resize(at + n);
  if (n > 0) std::memcpy(out.data() + at, data, n);
}

template <typename T>
void put(std::vector<uint8_t>& out, const T& v) {
  put_bytes(out, &v, sizeof v);
}

template <typename T>
void put_array(std::vector<uint8_t>& out, const std::vector<T>& v) {
  put<uint64_t>(out, v.size());
  put_bytes(out, v.data(), v.size() * sizeof(T));
}

// Bounds-checked reading of an encoded RankState.
struct Cursor {
  const uint8_t* p;
  size_t left;
  const std::string& what;
  void need(size_t n) const {
    if (n > left) throw std::runtime_error(what + ": truncated or corrupt rank state");
  }
  template <typename T>
  T get() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, p, sizeof v);
    p += sizeof v;
    left -= sizeof v;
    return v;
  }
  template <typename T>
  std::vector<T> get_array() {
    const auto n = get<uint64_t>();
    if (n > left / sizeof(T)) throw std::runtime_error(what + ": truncated or corrupt rank state");
    std::vector<T> v(static_cast<size_t>(n));
    std::memcpy(v.data(), p, n * sizeof(T));
    p += n * sizeof(T);
    left -= n * sizeof(T);
    return v;
  }
};

void fsync_path(const fs::path& path, bool directory) {
  const int fd = ::open(path.c_str(), directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

std::string hex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

std::vector<uint8_t> read_all(const fs::path& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error(path.string() + ": cannot be read");
  std::vector<uint8_t> out((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return out;
}

// One line per failing rank is too many: the first failing rank's message is every rank's error.
// `usage` (the verdict of rank `first`) chooses UsageError.
void agree(const mpi::Comm& world, const std::string& error, bool usage) {
  double lowest = -(error.empty() ? world.size() : world.rank());
  world.allreduce_max(&lowest, 1);
  const int first = static_cast<int>(-lowest);
  if (first >= world.size()) return;
  std::string msg = (usage ? "U" : "R") + error;
  world.broadcast(msg, first);
  if (msg[0] == 'U') throw UsageError(msg.substr(1));
  throw std::runtime_error(msg.substr(1));
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

std::vector<uint8_t> encode_state(const RankState& s) {
  std::vector<uint8_t> out;
  out.reserve(
      128 + 4 * (s.params.size() + s.buffers.size() + s.velocity.size() + s.delayed_delta.size()) +
      s.shuffle.size());
  put_bytes(out, kRankMagic, sizeof kRankMagic);
  put<int64_t>(out, s.step);
  put<int64_t>(out, s.steps_per_epoch);
  put<int64_t>(out, s.rank);
  put<int64_t>(out, s.ranks);
  put<double>(out, s.lr_scale);
  put<int64_t>(out, s.nan_restores);
  put<uint64_t>(out, s.dropout_step);
  put<uint64_t>(out, s.sgd_started ? 1 : 0);
  put_array(out, s.params);
  put_array(out, s.buffers);
  put_array(out, s.velocity);
  put_array(out, s.delayed_delta);
  put_array(out, s.shuffle);
  put<uint64_t>(out, checksum(out.data(), out.size()));  // the file checks itself too
  return out;
}

RankState decode_state(const uint8_t* data, size_t size, const std::string& what) {
  if (size < sizeof kRankMagic + 8 || std::memcmp(data, kRankMagic, sizeof kRankMagic) != 0)
    throw std::runtime_error(what + ": not a gossipgrad rank state");
  uint64_t stored;
  std::memcpy(&stored, data + size - 8, 8);
  if (stored != checksum(data, size - 8))
    throw std::runtime_error(what + ": checksum mismatch (corrupt or truncated)");
  Cursor c{data + sizeof kRankMagic, size - 8 - sizeof kRankMagic, what};
  RankState s;
  s.step = c.get<int64_t>();
  s.steps_per_epoch = c.get<int64_t>();
  s.rank = static_cast<int>(c.get<int64_t>());
  s.ranks = static_cast<int>(c.get<int64_t>());
  s.lr_scale = c.get<double>();
  s.nan_restores = static_cast<int>(c.get<int64_t>());
  s.dropout_step = c.get<uint64_t>();
  s.sgd_started = c.get<uint64_t>() != 0;
  s.params = c.get_array<float>();
  s.buffers = c.get_array<float>();
  s.velocity = c.get_array<float>();
  s.delayed_delta = c.get_array<float>();
  s.shuffle = c.get_array<uint8_t>();
  if (c.left != 0) throw std::runtime_error(what + ": trailing bytes in the rank state");
  if (s.step < 0 || s.steps_per_epoch < 1 || s.ranks < 1 || s.rank < 0 || s.rank >= s.ranks ||
      !(s.lr_scale > 0 && s.lr_scale <= 1) || s.velocity.size() != s.params.size() ||
      (!s.delayed_delta.empty() && s.delayed_delta.size() != s.params.size()))
    throw std::runtime_error(what + ": inconsistent rank state");
  return s;
}

uint64_t checksum(const void* data, size_t size) { return XXH3_64bits(data, size); }

FileDigest write_file_durably(const std::string& path, const void* data, size_t size) {
  const fs::path target(path);
  const fs::path tmp = target.string() + ".tmp-" + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw std::runtime_error("cannot write " + path + ": " + std::strerror(errno));
  const auto* p = static_cast<const uint8_t*>(data);
  size_t left = size;
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string why = std::strerror(errno);
      ::close(fd);
      ::unlink(tmp.c_str());
      throw std::runtime_error("cannot write " + path + ": " + why);
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    ::unlink(tmp.c_str());
    throw std::runtime_error("cannot write " + path + ": fsync failed");
  }
  if (::rename(tmp.c_str(), target.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    ::unlink(tmp.c_str());
    throw std::runtime_error("cannot write " + path + ": " + why);
  }
  fsync_path(target.has_parent_path() ? target.parent_path() : fs::path("."), true);
  return {size, checksum(data, size)};
}

std::string checkpoint_folder_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "ckpt-%012lld", static_cast<long long>(step));
  return buf;
}

std::string rank_file_name(int rank) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "rank-%05d.bin", rank);
  return buf;
}

void write_manifest(const std::string& folder, const Manifest& m) {
  nlohmann::json files = nlohmann::json::object();
  for (const auto& [name, d] : m.files) files[name] = {{"size", d.size}, {"xxh3", hex(d.hash)}};
  const nlohmann::json j = {{"format", "gossipgrad-full-checkpoint"},
                            {"version", 1},
                            {"step", m.step},
                            {"epoch", m.epoch},
                            {"ranks", m.ranks},
                            {"steps_per_epoch", m.steps_per_epoch},
                            {"model",
                             {{"name", m.model.name},
                              {"input", m.model.input},
                              {"classes", m.model.classes},
                              {"width", m.model.width},
                              {"batch_norm", m.model.batch_norm}}},
                            {"files", files}};
  const std::string text = j.dump(2) + "\n";
  write_file_durably((fs::path(folder) / kManifest).string(), text.data(), text.size());
}

Manifest read_manifest(const std::string& folder) {
  const fs::path path = fs::path(folder) / kManifest;
  std::ifstream f(path);
  if (!f) throw std::runtime_error(path.string() + " is missing (an incomplete checkpoint)");
  Manifest m;
  try {
    const nlohmann::json j = nlohmann::json::parse(f);
    if (j.value("format", "") != "gossipgrad-full-checkpoint" || j.at("version").get<int>() != 1)
      throw std::runtime_error("not a version-1 gossipgrad full checkpoint");
    m.step = j.at("step").get<int64_t>();
    m.epoch = j.at("epoch").get<int64_t>();
    m.ranks = j.at("ranks").get<int>();
    m.steps_per_epoch = j.at("steps_per_epoch").get<int64_t>();
    const auto& model = j.at("model");
    m.model.name = model.at("name").get<std::string>();
    m.model.input = model.at("input").get<kernels::Dims>();
    m.model.classes = model.at("classes").get<int64_t>();
    m.model.width = model.at("width").get<int64_t>();
    m.model.batch_norm = model.at("batch_norm").get<bool>();
    for (const auto& [name, d] : j.at("files").items()) {
      if (name.find('/') != std::string::npos || name == ".." || name.empty())
        throw std::runtime_error("bad file name '" + name + "'");
      m.files[name] = {d.at("size").get<uint64_t>(),
                       std::stoull(d.at("xxh3").get<std::string>(), nullptr, 16)};
    }
    if (m.step < 0 || m.ranks < 1 || m.ranks > (1 << 20) || m.steps_per_epoch < 1)
      throw std::runtime_error("step, ranks or steps_per_epoch out of range");
    for (int r = 0; r < m.ranks; ++r)
      if (!m.files.count(rank_file_name(r)))
        throw std::runtime_error("lists no " + rank_file_name(r));
  } catch (const nlohmann::json::exception& e) {
    std::string what = e.what();
    std::replace(what.begin(), what.end(), '\n', ' ');
    throw std::runtime_error(path.string() + ": " + what);
  } catch (const std::logic_error& e) {  // stoull
    throw std::runtime_error(path.string() + ": malformed checksum");
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(path.string() + ": " + e.what());
  }
  return m;
}

std::string verify_checkpoint(const std::string& folder) {
  try {
    const Manifest m = read_manifest(folder);
    for (const auto& [name, want] : m.files) {
      const fs::path p = fs::path(folder) / name;
      std::error_code ec;
      const auto size = fs::file_size(p, ec);
      if (ec) return p.string() + " is missing";
      if (size != want.size)
        return p.string() + " has " + std::to_string(size) + " bytes, the manifest says " +
               std::to_string(want.size);
      const std::vector<uint8_t> bytes = read_all(p);
      if (checksum(bytes.data(), bytes.size()) != want.hash)
        return p.string() + ": checksum mismatch (corrupt)";
    }
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& root) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.size() != 17 || name.rfind("ckpt-", 0) != 0 || !entry.is_directory()) continue;
    if (!std::all_of(name.begin() + 5, name.end(), [](char ch) { return ch >= '0' && ch <= '9'; }))
      continue;
    out.emplace_back(std::stoll(name.substr(5)), entry.path().string());
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return out;
}

std::optional<std::string> find_latest_valid(const std::string& where,
                                             std::vector<std::string>& rejected) {
  std::vector<std::pair<int64_t, std::string>> candidates;
  if (fs::exists(fs::path(where) / kManifest) ||
      fs::path(where).filename().string().rfind("ckpt-", 0) == 0)
    candidates.emplace_back(0, where);
  else
    candidates = list_checkpoints(where);
  for (const auto& [step, folder] : candidates) {
    const std::string why = verify_checkpoint(folder);
    if (why.empty()) return folder;
    rejected.push_back("skipping checkpoint " + folder + ": " + why);
  }
  return std::nullopt;
}

void prune_checkpoints(const std::string& root, int64_t keep) {
  int64_t complete = 0;
  int64_t oldest_kept = -1;
  bool any_complete = false;
  for (const auto& [step, folder] : list_checkpoints(root)) {
    std::error_code ec;
    const bool has_manifest = fs::exists(fs::path(folder) / kManifest, ec);
    if (has_manifest) any_complete = true;
    if (!any_complete) continue;  // newer than every complete one: may be being written
    if (has_manifest && complete < keep) {
      ++complete;
      oldest_kept = step;
      continue;
    }
    if (!has_manifest && step > oldest_kept) continue;
    fs::remove_all(folder, ec);
  }
}

Resilience::Resilience(const Config& c, const mpi::Comm& world, Trainer& trainer,
                       TrainingData& data, kernels::ModelSpec model)
    : c_(c), world_(world), trainer_(trainer), data_(data), model_(std::move(model)) {
  start_ = now_seconds();
  // A restart by gossipgrad supervise (attempt > 0) never injects failures again.
  const char* attempt = std::getenv("GG_SUPERVISE_ATTEMPT");
  faults_armed_ = attempt == nullptr || std::string(attempt) == "0";
}

RankState Resilience::capture() {
  RankState s;
  trainer_.capture_state(s);
  s.rank = world_.rank();
  s.ranks = world_.size();
  s.steps_per_epoch = data_.steps_per_epoch();
  s.nan_restores = nan_restores_;
  return s;
}

int64_t Resilience::resume() {
  if (c_.checkpoint.resume.empty()) return 0;
  const std::string where =
      c_.checkpoint.resume == "auto" ? c_.checkpoint.dir : c_.checkpoint.resume;
  // Rank 0 chooses (reading every file of the candidates); every rank takes its verdict.
  std::string chosen, error;
  if (world_.rank() == 0) {
    std::vector<std::string> rejected;
    const auto found = find_latest_valid(where, rejected);
    for (const std::string& r : rejected) std::fprintf(stderr, "gossipgrad: %s\n", r.c_str());
    if (found) {
      chosen = "+" + *found;
    } else if (!rejected.empty() || c_.checkpoint.resume != "auto") {
      error = "checkpoint.resume: no valid checkpoint in " + where +
              (rejected.empty() ? "" : " (every one is corrupt or incomplete)");
    }
  }
  agree(world_, error, false);
  world_.broadcast(chosen, 0);
  if (chosen.empty()) {
    if (world_.rank() == 0)
      std::printf("gossipgrad: no checkpoint in %s yet: starting from step 0\n", where.c_str());
    return 0;
  }
  const std::string folder = chosen.substr(1);

  Manifest m;
  error.clear();
  bool usage = false;
  try {
    m = read_manifest(folder);
    const kernels::ModelSpec& a = m.model;
    if (a.name != model_.name || a.input != model_.input || a.classes != model_.classes ||
        a.width != model_.width || a.batch_norm != model_.batch_norm) {
      usage = true;
      throw std::runtime_error(
          folder + " holds a " + a.name + " (width " + std::to_string(a.width) + ", " +
          std::to_string(a.classes) + " classes); this run builds a " + model_.name + " (width " +
          std::to_string(model_.width) + ", " + std::to_string(model_.classes) + " classes)");
    }
  } catch (const std::exception& e) {
    error = std::string("checkpoint.resume: ") + e.what();
  }
  agree(world_, error, usage);

  const bool same_ranks = m.ranks == world_.size();
  RankState s;
  error.clear();
  try {
    if (same_ranks) {
      const std::string name = rank_file_name(world_.rank());
      const fs::path p = fs::path(folder) / name;
      const std::vector<uint8_t> bytes = read_all(p);
      if (FileDigest{bytes.size(), checksum(bytes.data(), bytes.size())} != m.files.at(name))
        throw std::runtime_error(p.string() + " changed since it was checked");
      s = decode_state(bytes.data(), bytes.size(), p.string());
      if (s.rank != world_.rank() || s.ranks != m.ranks || s.step != m.step)
        throw std::runtime_error(p.string() + ": rank, ranks or step differ from the manifest");
    } else if (world_.rank() == 0) {
      // Another rank count: the ranks' average model (a pending weight correction applied
      // first); the samples are reassigned afresh.
      for (int r = 0; r < m.ranks; ++r) {
        const fs::path p = fs::path(folder) / rank_file_name(r);
        const std::vector<uint8_t> bytes = read_all(p);
        RankState one = decode_state(bytes.data(), bytes.size(), p.string());
        if (!one.delayed_delta.empty())
          for (size_t i = 0; i < one.params.size(); ++i) one.params[i] += one.delayed_delta[i];
        if (r == 0) {
          s = std::move(one);
          s.delayed_delta.clear();
          s.shuffle.clear();
          continue;
        }
        if (one.params.size() != s.params.size() || one.buffers.size() != s.buffers.size())
          throw std::runtime_error(p.string() + ": sizes differ from rank 0's");
        for (size_t i = 0; i < s.params.size(); ++i) s.params[i] += one.params[i];
        for (size_t i = 0; i < s.buffers.size(); ++i) s.buffers[i] += one.buffers[i];
        for (size_t i = 0; i < s.velocity.size(); ++i) s.velocity[i] += one.velocity[i];
      }
      const float inv = 1.f / static_cast<float>(m.ranks);
      for (auto* v : {&s.params, &s.buffers, &s.velocity})
        for (float& x : *v) x *= inv;
      s.ranks = m.ranks;
    }
    if (same_ranks && s.shuffle.empty() != !data_.shuffles()) {
      usage = true;
      throw std::runtime_error(folder + " was written with data.shuffle " +
                               (s.shuffle.empty() ? "off" : "on") + ", this run has it " +
                               (data_.shuffles() ? "on" : "off"));
    }
  } catch (const std::exception& e) {
    error = std::string("checkpoint.resume: ") + e.what();
  }
  agree(world_, error, usage);
  if (!same_ranks) {
    std::vector<uint8_t> bytes = world_.rank() == 0 ? encode_state(s) : std::vector<uint8_t>{};
    std::string wire(bytes.begin(), bytes.end());
    world_.broadcast(wire, 0);
    s = decode_state(reinterpret_cast<const uint8_t*>(wire.data()), wire.size(), "broadcast");
  }
  try {
    trainer_.restore_model(s);
  } catch (const std::invalid_argument& e) {
    throw UsageError("checkpoint.resume: " + folder + ": " + e.what());
  }

  int64_t step = s.step;
  if (same_ranks) {
    if (data_.shuffles()) data_.restore_shuffle(s.shuffle);
  } else {
    // The same point of the same epoch, in this run's steps.
    const int64_t epoch = s.step / s.steps_per_epoch;
    const int64_t within = s.step % s.steps_per_epoch;
    const int64_t per_epoch = data_.steps_per_epoch();
    step = epoch * per_epoch + std::min(per_epoch - 1, within * per_epoch / s.steps_per_epoch);
    if (within == 0) step = epoch * per_epoch;
    data_.shuffle_start_at(step);
  }
  trainer_.resume_at(step, s.dropout_step);
  lr_scale_ = s.lr_scale;
  nan_restores_ = s.nan_restores;
  trainer_.set_lr_scale(lr_scale_);
  resumed_ = true;
  faults_armed_ = false;
  last_written_ = step;
  if (world_.rank() == 0) {
    if (same_ranks)
      std::printf("gossipgrad: resumed from %s at step %lld\n", folder.c_str(),
                  static_cast<long long>(step));
    else
      std::printf(
          "gossipgrad: resumed from %s (%d ranks, step %lld) at %d ranks: the ranks' average "
          "model, samples reassigned, continuing at step %lld\n",
          folder.c_str(), m.ranks, static_cast<long long>(s.step), world_.size(),
          static_cast<long long>(step));
    std::fflush(stdout);
  }
  return step;
}

void Resilience::before_step(int64_t s, shuffle::Batch& batch) {
  (void)batch;
  if (c_.guard.nan_retries > 0 && (!snapshot_ || s % c_.guard.snapshot_every == 0)) {
    RankState snap;
    trainer_.capture_state(snap);
    snap.step = s;
    // Weights that became non-finite without a NaN loss yet are no state to go back to.
    bool finite = true;
    for (float v : snap.params) finite &= std::isfinite(v);
    double bad = finite ? 0 : 1;
    world_.allreduce_max(&bad, 1);
    if (bad == 0) snapshot_ = std::move(snap);
  }
  if (!faults_armed_) return;
  for (const auto& [spec, sig] : {std::pair{c_.fault.kill, SIGKILL}, {c_.fault.stall, SIGSTOP}}) {
    if (spec.empty()) continue;
    const auto [rank, step] = parse_fault_kill(spec);
    if (rank != world_.rank() || step != s) continue;
    std::fprintf(stderr, "gossipgrad: rank %d: fault hook: %s at step %lld\n", rank,
                 sig == SIGKILL ? "SIGKILL" : "SIGSTOP", static_cast<long long>(s));
    std::fflush(stderr);
    std::fflush(stdout);
    std::raise(sig);
  }
  // Weights that blew up: every logit, hence the loss, becomes NaN (a NaN input would not do:
  // ReLU maps NaN to 0).
  if (c_.fault.nan == s && world_.rank() == 0)
    std::fill(trainer_.store().params.begin(), trainer_.store().params.end(),
              std::numeric_limits<float>::quiet_NaN());
}

bool Resilience::after_step(int64_t s, double loss, MetricsWriter& metrics) {
  // Every rank decides alike (a partner's NaN reaches this rank only a step later).
  double bad = std::isfinite(loss) ? 0 : 1;
  world_.allreduce_max(&bad, 1);
  if (bad == 0) return false;
  if (c_.guard.nan_retries == 0 || nan_restores_ >= c_.guard.nan_retries || !snapshot_) {
    std::string msg = "the loss became non-finite at step " + std::to_string(s);
    if (c_.guard.nan_retries > 0)
      msg += " after " + std::to_string(nan_restores_) + " restores (guard.nan_retries)";
    throw std::runtime_error(msg + "; lower train.lr");
  }
  ++nan_restores_;
  lr_scale_ *= c_.guard.lr_factor;
  trainer_.restore_model(*snapshot_);
  trainer_.set_lr_scale(lr_scale_);
  if (world_.rank() == 0) {
    std::printf(
        "gossipgrad: non-finite loss at step %lld: restored the state of step %lld on every "
        "rank, learning rate scaled by %g (restore %d of at most %d)\n",
        static_cast<long long>(s), static_cast<long long>(snapshot_->step), lr_scale_,
        nan_restores_, c_.guard.nan_retries);
    std::fflush(stdout);
    metrics.write({{"event", "guard"},
                   {"step", s},
                   {"restored_step", snapshot_->step},
                   {"lr_scale", lr_scale_},
                   {"restores", nan_restores_}});
  }
  return true;
}

bool Resilience::time_due() {
  if (c_.checkpoint.every_minutes <= 0) return false;
  float due = now_seconds() - start_ - last_write_time_ >= 60 * c_.checkpoint.every_minutes;
  world_.broadcast(&due, 1, 0);  // rank 0's clock decides for everyone
  return due != 0;
}

bool Resilience::after_step_done(int64_t s, int64_t epoch, bool last, MetricsWriter& metrics) {
  const int64_t done = s + 1;
  const bool stop = c_.train.stop_at > 0 && done >= c_.train.stop_at && !last;
  bool due = c_.checkpoint.every > 0 && done % c_.checkpoint.every == 0;
  due = time_due() || due || stop || last;
  if (due && last_written_ != done && !c_.checkpoint.dir.empty()) {
    const double t0 = now_seconds();
    write_checkpoint(done, epoch);
    if (world_.rank() == 0)
      metrics.write(
          {{"event", "full_checkpoint"},
           {"step", done},
           {"seconds", now_seconds() - t0},
           {"dir", (fs::path(c_.checkpoint.dir) / checkpoint_folder_name(done)).string()}});
  }
  if (stop && world_.rank() == 0) {
    std::printf(
        "gossipgrad: stopped after step %lld (train.stop_at); resume with "
        "--checkpoint.resume auto\n",
        static_cast<long long>(done));
    std::fflush(stdout);
  }
  return stop;
}

void Resilience::write_checkpoint(int64_t steps, int64_t epoch) {
  const fs::path root(c_.checkpoint.dir);
  const fs::path folder = root / checkpoint_folder_name(steps);
  std::string error;
  if (world_.rank() == 0) {
    try {
      std::error_code ec;
      fs::create_directories(root, ec);
      // A fresh run (log.overwrite) replaces the full checkpoints of an earlier run.
      if (!wrote_any_ && !resumed_)
        for (const auto& [step, old] : list_checkpoints(root.string())) fs::remove_all(old, ec);
      // A folder of this step left by an earlier attempt is set aside, never overwritten.
      if (fs::exists(folder))
        fs::rename(folder, folder.string() + ".old-" + std::to_string(std::time(nullptr)));
      fs::create_directories(folder);
    } catch (const std::exception& e) {
      error = "checkpoint: cannot create " + folder.string() + ": " + e.what();
    }
  }
  agree(world_, error, false);

  const RankState s = [&] {
    RankState st = capture();
    st.shuffle = data_.save_shuffle();
    return st;
  }();
  const std::vector<uint8_t> bytes = encode_state(s);
  std::vector<int64_t> digests(2 * world_.size(), 0);
  try {
    const FileDigest d = write_file_durably((folder / rank_file_name(world_.rank())).string(),
                                            bytes.data(), bytes.size());
    digests[2 * world_.rank()] = static_cast<int64_t>(d.size);
    std::memcpy(&digests[2 * world_.rank() + 1], &d.hash, 8);
  } catch (const std::exception& e) {
    error = std::string("checkpoint: ") + e.what();
  }
  agree(world_, error, false);
  world_.allreduce_sum(digests.data(), static_cast<int64_t>(digests.size()));

  if (world_.rank() == 0) {
    try {
      Manifest m;
      m.step = steps;
      m.epoch = epoch;
      m.ranks = world_.size();
      m.steps_per_epoch = data_.steps_per_epoch();
      m.model = model_;
      for (int r = 0; r < world_.size(); ++r) {
        FileDigest d;
        d.size = static_cast<uint64_t>(digests[2 * r]);
        std::memcpy(&d.hash, &digests[2 * r + 1], 8);
        m.files[rank_file_name(r)] = d;
      }
      const std::string ini = to_ini(c_);
      m.files[kConfigFile] =
          write_file_durably((folder / kConfigFile).string(), ini.data(), ini.size());
      write_manifest(folder.string(), m);  // last: from here on the checkpoint counts
      prune_checkpoints(root.string(), c_.checkpoint.keep);
    } catch (const std::exception& e) {
      error = std::string("checkpoint: ") + e.what();
    }
  }
  agree(world_, error, false);
  wrote_any_ = true;
  last_written_ = steps;
  last_write_time_ = now_seconds() - start_;
}

}  // namespace gg::gossip
