// Full checkpoints and resume (gossip/train/recovery.hpp): the folder and its files written in
// turn, each step agreed by every rank; the newest valid checkpoint chosen and read back.
#include "gossip/train/recovery.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <stdexcept>

#include "gossip/train/agree.hpp"
#include "gossip/train/data.hpp"
#include "gossip/train/trainer.hpp"
#include "kernels/apoptosis.hpp"
#include "kernels/tensor.hpp"
#include "shuffle/loader.hpp"

namespace gg::gossip {
namespace {

namespace fs = std::filesystem;

constexpr const char* kConfigFile = "config.ini";

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

Recovery::Recovery(const Config& c, const mpi::Comm& world, Trainer& trainer, TrainingData& data,
                   kernels::ModelSpec model)
    : c_(c),
      world_(world),
      trainer_(trainer),
      data_(data),
      model_(std::move(model)),
      guard_(c, world, trainer, data),
      stop_at_(c.train.stop_at) {
  start_ = now_seconds();
}

Recovery::~Recovery() = default;
Recovery::Recovery(Recovery&&) noexcept = default;

RankState Recovery::capture() {
  RankState s;
  trainer_.capture_state(s);
  s.rank = world_.rank();
  s.ranks = world_.size();
  s.steps_per_epoch = data_.steps_per_epoch();
  s.nan_restores = guard_.restores();
  return s;
}

int64_t Recovery::resume() {
  if (c_.checkpoint.resume.empty()) return 0;
  const std::string where = resume_auto(c_) ? c_.checkpoint.dir : c_.checkpoint.resume;
  const std::string folder = choose_checkpoint(where);
  if (folder.empty()) {
    if (world_.rank() == 0)
      std::printf("gossipgrad: no checkpoint in %s yet: starting from step 0\n", where.c_str());
    return 0;
  }
  const Manifest m = open_manifest(folder);
  const bool same_ranks = m.ranks == world_.size();
  if (same_ranks && m.steps_per_epoch != data_.steps_per_epoch())
    throw UsageError("checkpoint.resume: " + folder + " was written with " +
                     std::to_string(m.steps_per_epoch) + " steps per epoch, this run has " +
                     std::to_string(data_.steps_per_epoch()) +
                     " (another train.batch or data set): resume with the settings of that run");
  const RankState s = read_states(folder, m);
  try {
    trainer_.restore_model(s);
  } catch (const std::invalid_argument& e) {
    throw UsageError("checkpoint.resume: " + folder + ": " + e.what());
  }
  int64_t step = s.step;
  if (same_ranks) {
    if (data_.shuffles()) data_.restore_shuffle(s.shuffle);
  } else {
    step = same_point(s.step, s.steps_per_epoch);
    data_.shuffle_start_at(step);
  }
  // Rank 0 writes the metrics: what it sent and had not counted, its next step counts.
  continue_at(step, s, same_ranks && world_.rank() == 0 ? m.unreported_bytes : 0);
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

std::string Recovery::choose_checkpoint(const std::string& where) {
  // Rank 0 chooses (reading every file of the candidates); every rank takes its verdict.
  std::string chosen, error;
  if (world_.rank() == 0) {
    std::vector<std::string> rejected;
    const auto found = find_latest_valid(where, rejected);
    for (const std::string& r : rejected) std::fprintf(stderr, "gossipgrad: %s\n", r.c_str());
    // Folders without a manifest are writes that never finished: with auto and nothing else,
    // the run starts afresh (a job that died during its first checkpoint).
    bool any_manifest = false;
    for (const auto& [step, folder] : list_checkpoints(where))
      any_manifest |= fs::exists(fs::path(folder) / kManifest);
    if (found) {
      chosen = *found;
    } else if (any_manifest || !resume_auto(c_)) {
      error = "checkpoint.resume: no valid checkpoint in " + where +
              (rejected.empty() ? "" : " (every one is corrupt or incomplete)");
    }
  }
  throw_agreed(world_, {error, false});
  world_.broadcast(chosen, 0);
  return chosen;
}

namespace {
std::string dims_text(const kernels::Dims& d) {
  std::string s;
  for (const int64_t v : d) {
    if (!s.empty()) s += 'x';
    s += std::to_string(v);
  }
  return s;
}
}  // namespace

std::string model_difference(const kernels::ModelSpec& saved, const kernels::ModelSpec& built) {
  std::string out;
  auto differ = [&](bool d, const std::string& what, const std::string& a, const std::string& b) {
    if (!d) return;
    if (!out.empty()) out += ", ";
    out.append(what).append(" ").append(a).append(" there, ").append(b).append(" here");
  };
  differ(saved.name != built.name, "model.name", saved.name, built.name);
  differ(saved.width != built.width, "model.width", std::to_string(saved.width),
         std::to_string(built.width));
  differ(saved.batch_norm != built.batch_norm, "model.batch_norm",
         saved.batch_norm ? "true" : "false", built.batch_norm ? "true" : "false");
  differ(saved.input != built.input, "the input (the data's samples)", dims_text(saved.input),
         dims_text(built.input));
  differ(saved.classes != built.classes, "the classes (the data's labels)",
         std::to_string(saved.classes), std::to_string(built.classes));
  return out;
}

Manifest Recovery::open_manifest(const std::string& folder) {
  Manifest m;
  std::string error;
  bool usage = false;
  try {
    m = read_manifest(folder);
    const kernels::ModelSpec& a = m.model;
    const std::string differs = model_difference(a, model_);
    if (!differs.empty()) {
      usage = true;
      throw std::runtime_error(folder + " holds another model than this run builds: " + differs +
                               "; resume with that run's model and data settings");
    }
  } catch (const std::exception& e) {
    error = std::string("checkpoint.resume: ") + e.what();
  }
  // A checkpoint taken after apoptosis shrank the model: the same widths here first.
  std::optional<kernels::Graph> shrunk;
  if (error.empty() && !m.widths.empty()) {
    try {
      shrunk = kernels::apply_widths(kernels::build_model(model_), m.widths);
    } catch (const std::invalid_argument& e) {
      usage = true;
      error = "checkpoint.resume: " + folder + ": " + e.what();
    }
  }
  throw_agreed(world_, {error, usage});
  if (shrunk) trainer_.reshape(std::move(*shrunk));
  return m;
}

RankState Recovery::read_states(const std::string& folder, const Manifest& m) {
  const bool same_ranks = m.ranks == world_.size();
  RankState s;
  std::string error;
  bool usage = false;
  try {
    if (same_ranks)
      s = read_own_state(folder, m);
    else if (world_.rank() == 0)
      s = average_states(folder, m);
    if (same_ranks && s.shuffle.empty() != !data_.shuffles()) {
      usage = true;
      throw std::runtime_error(folder + " was written with data.shuffle " +
                               (s.shuffle.empty() ? "off" : "on") + ", this run has it " +
                               (data_.shuffles() ? "on" : "off"));
    }
  } catch (const std::exception& e) {
    error = std::string("checkpoint.resume: ") + e.what();
  }
  throw_agreed(world_, {error, usage});
  if (!same_ranks) {
    std::vector<uint8_t> bytes = world_.rank() == 0 ? encode_state(s) : std::vector<uint8_t>{};
    std::string wire(bytes.begin(), bytes.end());
    world_.broadcast(wire, 0);
    s = decode_state(reinterpret_cast<const uint8_t*>(wire.data()), wire.size(), "broadcast");
  }
  return s;
}

RankState Recovery::read_own_state(const std::string& folder, const Manifest& m) const {
  const std::string name = rank_file_name(world_.rank());
  const fs::path p = fs::path(folder) / name;
  const std::vector<uint8_t> bytes = read_file(p.string());
  if (FileDigest{bytes.size(), checksum(bytes.data(), bytes.size())} != m.files.at(name))
    throw std::runtime_error(p.string() + " changed since it was checked");
  RankState s = decode_state(bytes.data(), bytes.size(), p.string());
  if (s.rank != world_.rank() || s.ranks != m.ranks || s.step != m.step)
    throw std::runtime_error(p.string() + ": rank, ranks or step differ from the manifest");
  return s;
}

RankState Recovery::average_states(const std::string& folder, const Manifest& m) const {
  // Another rank count: the ranks' average model (a pending weight correction applied first);
  // the samples are reassigned afresh.
  RankState s;
  for (int r = 0; r < m.ranks; ++r) {
    const fs::path p = fs::path(folder) / rank_file_name(r);
    const std::vector<uint8_t> bytes = read_file(p.string());
    RankState one = decode_state(bytes.data(), bytes.size(), p.string());
    if (!one.delayed_delta.empty())
      for (size_t i = 0; i < one.params.size(); ++i) one.params[i] += one.delayed_delta[i];
    if (r == 0) {
      s = std::move(one);
      s.delayed_delta.clear();
      s.shuffle.clear();
      s.parts.clear();  // what rank 0's exchanges kept, not the average's
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
  return s;
}

int64_t Recovery::same_point(int64_t step, int64_t old_per_epoch) const {
  const int64_t epoch = step / old_per_epoch;
  const int64_t within = step % old_per_epoch;
  const int64_t per_epoch = data_.steps_per_epoch();
  if (within == 0) return epoch * per_epoch;
  return epoch * per_epoch + std::min(per_epoch - 1, within * per_epoch / old_per_epoch);
}

int64_t Recovery::continue_from(const RankState& own, int64_t old_step, int64_t old_per_epoch) {
  const int64_t step = same_point(old_step, old_per_epoch);
  data_.shuffle_start_at(step);
  trainer_.restore_model(own);
  // The survivors' checkpoints join the run's (none of them is removed as an earlier run's).
  continue_at(step, own, 0);
  return step;
}

void Recovery::continue_at(int64_t step, const RankState& s, int64_t unreported_bytes) {
  trainer_.resume_at(step, s.dropout_step, unreported_bytes);
  guard_.continue_with(s.nan_restores, s.lr_scale);
  resumed_ = true;
  last_written_ = step;
}

bool Recovery::time_due() {
  if (c_.checkpoint.every_minutes <= 0) return false;
  float due = now_seconds() - start_ - last_write_time_ >= 60 * c_.checkpoint.every_minutes;
  world_.broadcast(&due, 1, 0);  // rank 0's clock decides for everyone
  return due != 0;
}

bool Recovery::after_step_done(int64_t s, int64_t epoch, bool last, MetricsWriter& metrics) {
  const int64_t done = s + 1;
  const bool stop = stop_at_ > 0 && done == stop_at_ && !last;
  bool due = c_.checkpoint.every > 0 && done % c_.checkpoint.every == 0;
  due = time_due() || due || stop || last;
  if (due) checkpoint_now(done, epoch, metrics);
  if (stop && world_.rank() == 0) {
    std::printf(
        "gossipgrad: stopped after step %lld (train.stop_at); resume with "
        "--checkpoint.resume auto\n",
        static_cast<long long>(done));
    std::fflush(stdout);
  }
  return stop;
}

std::string Recovery::checkpoint_now(int64_t done, int64_t epoch, MetricsWriter& metrics) {
  if (c_.checkpoint.dir.empty()) return "";
  const std::string folder = (fs::path(c_.checkpoint.dir) / checkpoint_folder_name(done)).string();
  if (last_written_ == done) return folder;
  const double t0 = now_seconds();
  write_checkpoint(done, epoch);
  if (world_.rank() == 0)
    metrics.write({{"event", "full_checkpoint"},
                   {"step", done},
                   {"seconds", now_seconds() - t0},
                   {"dir", folder}});
  return folder;
}

void Recovery::make_folder(const std::string& folder) {
  std::string error;
  if (world_.rank() == 0) {
    try {
      const fs::path root(c_.checkpoint.dir);
      std::error_code ec;
      fs::create_directories(root, ec);
      // A fresh run (log.overwrite) replaces the full checkpoints of an earlier run.
      if (!wrote_any_ && !resumed_)
        for (const auto& [step, old] : list_checkpoints(root.string())) fs::remove_all(old, ec);
      // A folder of this step left by an earlier attempt is set aside, never overwritten.
      if (fs::exists(folder))
        fs::rename(folder, folder + ".old-" + std::to_string(std::time(nullptr)));
      fs::create_directories(folder);
    } catch (const std::exception& e) {
      error = "checkpoint: cannot create " + folder + ": " + e.what();
    }
  }
  throw_agreed(world_, {error, false});
}

void Recovery::write_own_file(const std::string& folder, std::vector<int64_t>& digests) {
  const RankState s = [&] {
    RankState st = capture();
    st.shuffle = data_.save_shuffle();
    return st;
  }();
  const std::vector<uint8_t> bytes = encode_state(s);
  std::string error;
  try {
    const FileDigest d = write_file_durably(
        (fs::path(folder) / rank_file_name(world_.rank())).string(), bytes.data(), bytes.size());
    digests[2 * world_.rank()] = static_cast<int64_t>(d.size);
    std::memcpy(&digests[2 * world_.rank() + 1], &d.hash, 8);
  } catch (const std::exception& e) {
    error = std::string("checkpoint: ") + e.what();
  }
  throw_agreed(world_, {error, false});
}

void Recovery::write_manifest_of(const std::string& folder, int64_t steps, int64_t epoch,
                                 const std::vector<int64_t>& digests) {
  std::string error;
  if (world_.rank() == 0) {
    try {
      Manifest m;
      m.step = steps;
      m.epoch = epoch;
      m.ranks = world_.size();
      m.steps_per_epoch = data_.steps_per_epoch();
      m.model = model_;
      m.unreported_bytes = trainer_.unreported_bytes();  // after the capture in write_own_file
      m.widths = kernels::changed_widths(kernels::build_model(model_), trainer_.graph());
      for (int r = 0; r < world_.size(); ++r) {
        FileDigest d;
        d.size = static_cast<uint64_t>(digests[2 * r]);
        std::memcpy(&d.hash, &digests[2 * r + 1], 8);
        m.files[rank_file_name(r)] = d;
      }
      const std::string ini = to_ini(c_);
      m.files[kConfigFile] =
          write_file_durably((fs::path(folder) / kConfigFile).string(), ini.data(), ini.size());
      write_manifest(folder, m);  // last: from here on the checkpoint counts
      prune_checkpoints(c_.checkpoint.dir, c_.checkpoint.keep);
    } catch (const std::exception& e) {
      error = std::string("checkpoint: ") + e.what();
    }
  }
  throw_agreed(world_, {error, false});
}

void Recovery::write_checkpoint(int64_t steps, int64_t epoch) {
  const std::string folder = (fs::path(c_.checkpoint.dir) / checkpoint_folder_name(steps)).string();
  std::string error;
  // A model that diverged is no state to resume from: nothing is written, nothing removed.
  if (!weights_finite(trainer_))
    error = "checkpoint: not written after step " + std::to_string(steps) + ": rank " +
            std::to_string(world_.rank()) + "'s weights hold NaN or inf; lower train.lr";
  throw_agreed(world_, {error, false});
  make_folder(folder);
  std::vector<int64_t> digests(2 * world_.size(), 0);
  write_own_file(folder, digests);
  world_.allreduce_sum(digests.data(), static_cast<int64_t>(digests.size()));
  write_manifest_of(folder, steps, epoch, digests);
  wrote_any_ = true;
  last_written_ = steps;
  last_write_time_ = now_seconds() - start_;
}

}  // namespace gg::gossip
