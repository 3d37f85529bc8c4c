// The files of a full checkpoint and how they are written, checked and found; no MPI, so that
// tools and fuzz targets can use it alone. Layout and guarantees: gossip/train/recovery.hpp.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gossip/resilience/rank_state.hpp"
#include "kernels/models.hpp"

namespace gg::gossip {

// A whole file; throws std::runtime_error "PATH: cannot be read".
std::vector<uint8_t> read_file(const std::string& path);

uint64_t checksum(const void* data, size_t size);  // XXH3-64

struct FileDigest {
  uint64_t size = 0;
  uint64_t hash = 0;
  bool operator==(const FileDigest&) const = default;
};

// kernels::write_file_durably (complete or not at all, and on disk before it returns), with the
// size and checksum the manifest records. Throws std::runtime_error.
FileDigest write_file_durably(const std::string& path, const void* data, size_t size);

struct Manifest {
  int64_t step = 0;
  int64_t epoch = 0;
  int ranks = 0;
  int64_t steps_per_epoch = 0;
  kernels::ModelSpec model;  // name, input, classes, width, batch_norm (seed not recorded)
  // The prunable layers apoptosis shrank, at their widths now (empty: the model as built).
  std::map<std::string, int64_t> widths;
  std::map<std::string, FileDigest> files;
  // Bytes rank 0 had sent that its metrics had not counted (Trainer::unreported_bytes): the
  // resumed run's first step counts them.
  int64_t unreported_bytes = 0;
};

constexpr const char* kManifest = "MANIFEST.json";
std::string checkpoint_folder_name(int64_t step);  // "ckpt-000000001234"
std::string rank_file_name(int rank);              // "rank-00000.bin"

void write_manifest(const std::string& folder, const Manifest& m);
// Throws std::runtime_error naming the file for a missing or malformed manifest.
Manifest read_manifest(const std::string& folder);
// Empty when every file the manifest lists is there with its size and checksum; else why not.
std::string verify_checkpoint(const std::string& folder);

// The ckpt-<step> folders of `root`, newest first.
std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& root);
// The newest valid checkpoint: `where` is a checkpoint.dir or one ckpt-<step> folder. Every
// folder passed over is described in `rejected` (one line each).
std::optional<std::string> find_latest_valid(const std::string& where,
                                             std::vector<std::string>& rejected);
// Removes the complete checkpoints (with a manifest) beyond the newest `keep`, and incomplete
// ones older than the oldest kept. Never a folder newer than the newest complete one.
void prune_checkpoints(const std::string& root, int64_t keep);

}  // namespace gg::gossip
