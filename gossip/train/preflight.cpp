#include "gossip/train/preflight.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include "gossip/resilience/checkpoint.hpp"
#include "gossip/train/metrics.hpp"
#include "kernels/executor.hpp"
#include "kernels/npz.hpp"
#include "kernels/path_overlap.hpp"
#include "kernels/tensor.hpp"
#include "shuffle/source.hpp"

namespace fs = std::filesystem;

namespace gg::gossip {
namespace {

// The data folder is reported before any rank starts (deeper problems, e.g. a folder without
// images, when the data is opened).
void check_data_folder(const Config& c) {
  const shuffle::SourceSpec spec = data_source(c);
  if (spec.kind == shuffle::SourceSpec::Kind::Synthetic) return;
  if (fashion_mnist(c) && !fs::is_directory(c.data.dir))
    throw UsageError("data.dir = " + c.data.dir +
                     " is not a folder (Debian's dataset-fashion-mnist package installs "
                     "/usr/share/datasets/fashion-mnist)");
  std::error_code ec;
  if (!fs::is_directory(spec.path, ec))
    throw UsageError("data.source = " + c.data.source + ": " + spec.path +
                     (fs::exists(spec.path, ec) ? " is not a folder" : ": no such folder"));
}

// A folder the run writes late (checkpoints after the first epoch, the timeline at the end) must
// be writable before training, not found unwritable once the model is trained. A file is
// written and removed in it, or, while it does not exist yet, in the nearest folder above it
// (where the run will create it): nothing is left behind, also by --dry-run.
void check_writable(const std::string& key, const std::string& value, fs::path folder) {
  std::error_code ec;
  folder = fs::absolute(folder, ec);
  while (!fs::exists(folder, ec) && folder.has_parent_path() && folder != folder.parent_path())
    folder = folder.parent_path();
  if (!fs::is_directory(folder, ec))
    throw UsageError(key + " = " + value + ": " + folder.string() +
                     " is not a folder (choose a folder this user can write)");
  const fs::path probe = folder / (".gossipgrad-write-test-" + std::to_string(::getpid()));
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600);
  const int err = errno;
  if (fd >= 0) {
    const bool wrote = ::write(fd, "x", 1) == 1;
    ::close(fd);
    ::unlink(probe.c_str());
    if (wrote) return;
  }
  throw UsageError(key + " = " + value + ": cannot write in " + folder.string() + ": " +
                   std::strerror(fd >= 0 ? ENOSPC : err) +
                   " (choose a folder this user can write)");
}

void check_not_clobbered(const std::string& key, const std::string& path) {
  if (fs::exists(path))
    throw UsageError(key + " = " + path +
                     " already exists: choose a new path or pass --log.overwrite true");
}

// train.init_from is read before any rank starts: a file that is no .npz of C-ordered float
// arrays, or that holds NaN or inf, is refused in one line (issue 31: exit 1 on every rank, or
// "lower train.lr" for NaN). Whether its tensors fit the model is found once the model is built
// (Trainer::load_initial_weights, agreed across ranks).
void check_init_from(const std::string& path) {
  if (path.empty()) return;
  if (!fs::is_regular_file(path)) throw UsageError("train.init_from = " + path + " is not a file");
  kernels::NpzEntries arrays;
  try {
    arrays = kernels::read_npz(path);
  } catch (const std::exception& e) {
    throw UsageError("train.init_from: " + std::string(e.what()));
  }
  for (const auto& [name, a] : arrays)
    if (a.is_float() && !kernels::all_finite(a.f))
      throw UsageError("train.init_from = " + path + ": '" + name +
                       "' holds NaN or inf: these weights cannot start a run (was the model "
                       "they came from diverging?)");
}

// The data the run reads that an output could change: an image folder, where every new folder
// is read as a class (idx and shard folders are read by file name: outputs beside the data
// change nothing), and the ImageNet labels file.
std::vector<kernels::NamedPath> data_inputs(const Config& c) {
  std::vector<kernels::NamedPath> in;
  const shuffle::SourceSpec spec = data_source(c);
  if (spec.kind == shuffle::SourceSpec::Kind::ImageNet) in.push_back({"data.source", spec.path});
  if (!val_labels_file(c).empty()) in.push_back({"data.val_labels", c.data.val_labels});
  return in;
}

// No output of the run is one of its inputs or another output, or lies inside an input folder
// (issue 31: outputs written over inputs). Inputs: the config file, the data, train.init_from,
// checkpoint.resume. Outputs: log.metrics, log.timeline, log.samples and log.losses (PATH.<rank>),
// and checkpoint.dir's own files (model.npz, meta.json, run.lock, ckpt-*/).
void check_outputs_apart(const Config& c) {
  std::vector<kernels::NamedPath> inputs = data_inputs(c);
  if (!c.config_path.empty()) inputs.push_back({"--config", c.config_path});
  if (!c.train.init_from.empty()) inputs.push_back({"train.init_from", c.train.init_from});
  if (!c.checkpoint.resume.empty() && !resume_auto(c))
    inputs.push_back({"checkpoint.resume", c.checkpoint.resume});
  std::vector<kernels::NamedPath> files;  // the files the run writes
  if (!c.log.metrics.empty()) files.push_back({"log.metrics", c.log.metrics});
  if (!c.log.timeline.empty()) files.push_back({"log.timeline", c.log.timeline});
  if (!c.log.samples.empty()) files.push_back({"log.samples", c.log.samples + ".0"});
  if (!c.log.losses.empty()) files.push_back({"log.losses", c.log.losses + ".0"});
  const std::string& ck = c.checkpoint.dir;
  if (!ck.empty()) {
    // Checkpoints in an image folder become a class folder.
    for (const kernels::NamedPath& in : data_inputs(c))
      if (const std::string why = kernels::output_overlap({"checkpoint.dir", ck}, in); !why.empty())
        throw UsageError(why);
    // The checkpoint replaces model.npz and prunes ckpt-*/: weights there are no input to it.
    if (!c.train.init_from.empty() && kernels::lies_inside(c.train.init_from, ck))
      throw UsageError("train.init_from = " + c.train.init_from +
                       " lies inside checkpoint.dir = " + ck +
                       ", which this run writes over: copy the file out of it or choose "
                       "another checkpoint.dir");
    for (const char* name : {kCheckpointModel, kCheckpointMeta, "run.lock"})
      inputs.push_back({"checkpoint.dir", (fs::path(ck) / name).string()});
  }
  for (size_t i = 0; i < files.size(); ++i) {
    std::error_code ec;
    if (fs::is_directory(files[i].path, ec))  // found at the first write, or after training
      throw UsageError(kernels::shown(files[i]) + " is a folder: name a file");
    for (const kernels::NamedPath& in : inputs)
      if (const std::string why = kernels::output_overlap(files[i], in); !why.empty())
        throw UsageError(why);
    for (size_t j = i + 1; j < files.size(); ++j)
      if (const std::string why = kernels::output_overlap(files[i], files[j]); !why.empty())
        throw UsageError(why);
    if (!ck.empty() && kernels::lies_inside(files[i].path, ck)) {
      const fs::path under = fs::path(files[i].path).lexically_relative(ck);
      if (!under.empty() && under.begin()->string().starts_with("ckpt-"))
        throw UsageError(kernels::shown(files[i]) +
                         " lies inside a full checkpoint of checkpoint.dir = " + ck +
                         " (pruned as newer ones are written): choose a path outside it");
    }
  }
}

}  // namespace

void check_this_machine(const Config& c) {
  if (backend_of(c) == kernels::Backend::Cuda && !kernels::cuda_built())
    throw UsageError("train.backend = cuda: this gossipgrad was built without CUDA");
  if (precision_of(c) == kernels::Precision::Bf16 && backend_of(c) == kernels::Backend::OneDnn &&
      !kernels::bf16_supported())
    throw UsageError("train.precision = bf16 needs a CPU with AVX512_BF16 (or AMX): use fp32");
}

void check_run_files(const Config& c) {
  check_data_folder(c);
  const bool resuming = !c.checkpoint.resume.empty();
  if (resuming && !resume_auto(c) && !fs::is_directory(c.checkpoint.resume))
    throw UsageError("checkpoint.resume = " + c.checkpoint.resume + " is not a folder");
  check_init_from(c.train.init_from);
  check_outputs_apart(c);
  if (!c.checkpoint.dir.empty()) {
    if (fs::exists(c.checkpoint.dir) && !fs::is_directory(c.checkpoint.dir))
      throw UsageError("checkpoint.dir = " + c.checkpoint.dir + " exists and is not a folder");
    if (holds_checkpoint(c.checkpoint.dir) && !c.log.overwrite && !resuming)
      throw UsageError("checkpoint.dir = " + c.checkpoint.dir +
                       " already holds a checkpoint: choose a new folder, pass "
                       "--checkpoint.resume auto or --log.overwrite true");
    check_writable("checkpoint.dir", c.checkpoint.dir, c.checkpoint.dir);
  }
  if (!c.log.timeline.empty())
    check_writable("log.timeline", c.log.timeline, fs::absolute(c.log.timeline).parent_path());
  if (!c.log.timeline.empty() && !c.log.overwrite)
    check_not_clobbered("log.timeline", c.log.timeline);
  // log.samples and log.losses write PATH.<rank>: the folder is made at the start if missing.
  for (const auto& [key, path] :
       {std::pair{"log.samples", c.log.samples}, {"log.losses", c.log.losses}})
    if (!path.empty()) check_writable(key, path, fs::absolute(path).parent_path());
  if (c.log.metrics.empty()) return;
  // runs/latest/metrics.jsonl: each run writes into a fresh runs/<time>/ (metrics.hpp), made
  // beside `latest`. Another path is written as named: a resumed run appends to it.
  if (names_run_folder(c.log.metrics)) {
    const fs::path latest = fs::path(c.log.metrics).parent_path();
    std::error_code ec;
    const fs::file_status st = fs::symlink_status(latest, ec);
    if (fs::exists(st) && !fs::is_symlink(st) && !fs::is_directory(st))
      throw UsageError("log.metrics = " + c.log.metrics + ": " + latest.string() +
                       " is a file, not the link to the latest run: move it away");
    check_writable("log.metrics", c.log.metrics, fs::absolute(latest).parent_path());
    return;
  }
  check_writable("log.metrics", c.log.metrics, fs::absolute(c.log.metrics).parent_path());
  if (!c.log.overwrite && !resuming) check_not_clobbered("log.metrics", c.log.metrics);
}

}  // namespace gg::gossip
