#include "gossip/resilience/full_checkpoint.hpp"

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "gossip/comm/low_rank.hpp"
#include "gossip/comm/rules.hpp"
#include "gossip/comm/wire.hpp"
#include "kernels/durable_file.hpp"

namespace gg::gossip {
namespace {

namespace fs = std::filesystem;

// Format 2 keeps the exchanges' state as tagged parts; format 1 (before 2026-11-29) named each
// algorithm's state, and is read into parts.
constexpr char kRankMagic[8] = {'G', 'G', 'R', 'A', 'N', 'K', '0', '2'};
constexpr char kRankMagicV1[8] = {'G', 'G', 'R', 'A', 'N', 'K', '0', '1'};
constexpr uint64_t kMostPartText = 256;  // bytes of an exchange's or a kind's name

// Writes bytes at dst (or only counts them where dst is null).
struct Out {
  uint8_t* dst;
  size_t n = 0;
  void bytes(const void* data, size_t k) {
    if (dst != nullptr && k > 0) std::memcpy(dst + n, data, k);
    n += k;
  }
  template <typename T>
  void put(const T& v) {
    bytes(&v, sizeof v);
  }
  template <typename T>
  void array(const std::vector<T>& v) {
    put<uint64_t>(v.size());
    bytes(v.data(), v.size() * sizeof(T));
  }
  void text(const std::string& t) {
    put<uint64_t>(t.size());
    bytes(t.data(), t.size());
  }
  void parts(const std::vector<StatePart>& v) {
    put<uint64_t>(v.size());
    for (const StatePart& p : v) {
      text(p.exchange);
      text(p.kind);
      put<uint32_t>(p.version);
      array(p.bytes);
    }
  }
};

// Bounds-checked reading of an encoded RankState.
struct Cursor : ByteReader {
  Cursor(const uint8_t* p, size_t n, const std::string& what) : ByteReader(p, n), what(what) {}
  const std::string& what;
  [[noreturn]] void fail() const override {
    throw std::runtime_error(what + ": truncated or corrupt rank state");
  }
  std::string text() {
    const auto n = get<uint64_t>();
    if (n > kMostPartText) throw std::runtime_error(what + ": corrupt rank state (a part's name)");
    const auto* t = reinterpret_cast<const char*>(take(static_cast<size_t>(n)));
    return std::string(t, static_cast<size_t>(n));
  }
  std::vector<StatePart> parts() {
    const auto n = get<uint64_t>();
    if (n > left() / 28) throw std::runtime_error(what + ": truncated or corrupt rank state");
    std::vector<StatePart> v(static_cast<size_t>(n));
    for (StatePart& s : v) {
      s.exchange = text();
      s.kind = text();
      s.version = get<uint32_t>();
      s.bytes = get_array<uint8_t>();
      if (s.exchange.empty() || s.kind.empty())
        throw std::runtime_error(what + ": corrupt rank state (a part without a name)");
    }
    return v;
  }
  // Format 1's per-algorithm fields (a residue, copies or factors for each exchange, empty where
  // none) as the parts their owners now write.
  void legacy_residue(std::vector<StatePart>& out, std::string_view exchange) {
    const std::vector<float> r = get_array<float>();
    if (!r.empty()) add(out, residue_part(r), exchange);
  }
  void legacy_copies(std::vector<StatePart>& out, std::string_view kind,
                     std::string_view exchange) {
    const auto n = get<uint64_t>();
    if (n > left() / 24) throw std::runtime_error(what + ": truncated or corrupt rank state");
    std::vector<PublicCopy> v(static_cast<size_t>(n));
    for (PublicCopy& c : v) {
      const auto peer = get<int64_t>();
      if (peer < 0 || peer > (int64_t{1} << 30))
        throw std::runtime_error(what + ": corrupt public copy in the rank state");
      c.peer = static_cast<int>(peer);
      c.mine = get<uint64_t>() != 0;
      c.values = get_array<float>();
    }
    if (!v.empty()) add(out, copies_part(std::string(kind), v), exchange);
  }
  static void add(std::vector<StatePart>& out, StatePart p, std::string_view exchange) {
    p.exchange = exchange;
    out.push_back(std::move(p));
  }
};

std::string hex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace

std::vector<uint8_t> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error(path + ": cannot be read");
  std::vector<uint8_t> out((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return out;
}

size_t encode_state_into(const RankState& s, uint8_t* dst) {
  Out out{dst};
  out.bytes(kRankMagic, sizeof kRankMagic);
  out.put<int64_t>(s.step);
  out.put<int64_t>(s.steps_per_epoch);
  out.put<int64_t>(s.rank);
  out.put<int64_t>(s.ranks);
  out.put<double>(s.lr_scale);
  out.put<int64_t>(s.nan_restores);
  out.put<uint64_t>(s.dropout_step);
  out.put<uint64_t>(s.sgd_started ? 1 : 0);
  out.array(s.params);
  out.array(s.buffers);
  out.array(s.velocity);
  out.array(s.delayed_delta);
  out.array(s.shuffle);
  out.put<double>(s.consensus_distance);
  out.parts(s.parts);
  // The file checks itself too.
  out.put<uint64_t>(dst != nullptr ? checksum(dst, out.n) : 0);
  return out.n;
}

std::vector<uint8_t> encode_state(const RankState& s) {
  std::vector<uint8_t> out(encode_state_into(s, nullptr));
  encode_state_into(s, out.data());
  return out;
}

RankState decode_state(const uint8_t* data, size_t size, const std::string& what) {
  if (size < sizeof kRankMagic + 8)
    throw std::runtime_error(what + ": not a gossipgrad rank state");
  const bool v1 = std::memcmp(data, kRankMagicV1, sizeof kRankMagicV1) == 0;
  if (!v1 && std::memcmp(data, kRankMagic, sizeof kRankMagic) != 0)
    throw std::runtime_error(
        what + (std::memcmp(data, kRankMagic, 6) == 0
                    ? ": a rank state of a newer format than this gossipgrad reads: resume it "
                      "with the gossipgrad that wrote it"
                    : ": not a gossipgrad rank state"));
  uint64_t stored;
  std::memcpy(&stored, data + size - 8, 8);
  if (stored != checksum(data, size - 8))
    throw std::runtime_error(what + ": checksum mismatch (corrupt or truncated)");
  Cursor c(data + sizeof kRankMagic, size - 8 - sizeof kRankMagic, what);
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
  if (c.left() >= sizeof(double)) s.consensus_distance = c.get<double>();  // absent: older files
  if (!v1) {
    s.parts = c.parts();
  } else {
    if (c.left() > 0) {  // absent: files older than the residues (resumed with none)
      c.legacy_residue(s.parts, kGradientExchange);
      c.legacy_residue(s.parts, kWeightExchange);
      c.legacy_residue(s.parts, kMomentumExchange);
    }
    if (c.left() > 0) {  // absent: files older than the public copies
      c.legacy_copies(s.parts, kPublicCopiesKind, kWeightExchange);
      c.legacy_copies(s.parts, kPublicCopiesKind, kMomentumExchange);
    }
    if (c.left() > 0) {  // absent: files older than low-rank gossip
      c.legacy_copies(s.parts, kLowRankKind, kWeightExchange);
      c.legacy_copies(s.parts, kLowRankKind, kMomentumExchange);
    }
  }
  if (c.left() != 0) throw std::runtime_error(what + ": trailing bytes in the rank state");
  // What is in a part its owner checks when it reads it back (the model it must fit is known
  // only there).
  if (s.step < 0 || s.steps_per_epoch < 1 || s.ranks < 1 || s.rank < 0 || s.rank >= s.ranks ||
      !(s.lr_scale > 0 && s.lr_scale <= 1) || s.velocity.size() != s.params.size() ||
      (!s.delayed_delta.empty() && s.delayed_delta.size() != s.params.size()))
    throw std::runtime_error(what + ": inconsistent rank state");
  return s;
}

uint64_t checksum(const void* data, size_t size) { return XXH3_64bits(data, size); }

FileDigest write_file_durably(const std::string& path, const void* data, size_t size) {
  kernels::write_file_durably(path, data, size);
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
  nlohmann::json j = {{"format", "gossipgrad-full-checkpoint"},
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
  if (!m.widths.empty()) j["model"]["widths"] = m.widths;
  if (m.unreported_bytes != 0) j["unreported_bytes"] = m.unreported_bytes;
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
    if (model.contains("widths")) {
      m.widths = model.at("widths").get<std::map<std::string, int64_t>>();
      for (const auto& [name, units] : m.widths)
        if (units < 1) throw std::runtime_error("width of " + name + " out of range");
    }
    m.unreported_bytes = j.value("unreported_bytes", int64_t{0});  // absent: none
    if (m.unreported_bytes < 0) throw std::runtime_error("unreported_bytes out of range");
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
      const std::vector<uint8_t> bytes = read_file(p.string());
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

}  // namespace gg::gossip
