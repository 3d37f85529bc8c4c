#include "gossip/train/preflight.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>

#include "gossip/resilience/checkpoint.hpp"
#include "kernels/executor.hpp"
#include "shuffle/source.hpp"

namespace fs = std::filesystem;

namespace gg::gossip {
namespace {

// The data folder is reported before any rank starts (deeper problems, e.g. a folder without
// images, when the data is opened).
void check_data_folder(const Config& c) {
  const shuffle::SourceSpec spec = shuffle::parse_source(c.data.source, c.data.dir);
  if (spec.kind == shuffle::SourceSpec::Kind::Synthetic) return;
  if (c.data.source == "fashion-mnist" && !fs::is_directory(c.data.dir))
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

}  // namespace

void check_this_machine(const Config& c) {
  if (c.train.backend == "cuda" && !kernels::cuda_built())
    throw UsageError("train.backend = cuda: this gossipgrad was built without CUDA");
  if (c.train.precision == "bf16" && c.train.backend == "onednn" && !kernels::bf16_supported())
    throw UsageError("train.precision = bf16 needs a CPU with AVX512_BF16 (or AMX): use fp32");
}

void check_run_files(const Config& c) {
  check_data_folder(c);
  const bool resuming = !c.checkpoint.resume.empty();
  if (resuming && c.checkpoint.resume != "auto" && !fs::is_directory(c.checkpoint.resume))
    throw UsageError("checkpoint.resume = " + c.checkpoint.resume + " is not a folder");
  if (!c.train.init_from.empty() && !fs::is_regular_file(c.train.init_from))
    throw UsageError("train.init_from = " + c.train.init_from + " is not a file");
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
  // A resumed run appends to its metrics file.
  if (!c.log.overwrite && !resuming) check_not_clobbered("log.metrics", c.log.metrics);
}

}  // namespace gg::gossip
