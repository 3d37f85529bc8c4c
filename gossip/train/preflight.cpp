#include "gossip/train/preflight.hpp"

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
  }
  if (!c.log.timeline.empty() && !c.log.overwrite)
    check_not_clobbered("log.timeline", c.log.timeline);
  // A resumed run appends to its metrics file.
  if (!c.log.overwrite && !resuming) check_not_clobbered("log.metrics", c.log.metrics);
}

}  // namespace gg::gossip
