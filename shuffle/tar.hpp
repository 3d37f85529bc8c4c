// Tar shards in the WebDataset convention (`shard-000000.tar` holding `<key>.jpg` + `<key>.cls`):
// an index built with libarchive whose samples are then read by offset, and the writer behind
// `gossipgrad pack`.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "shuffle/source.hpp"

namespace gg::shuffle {

// One shard's members as the index sees them.
struct TarMember {
  std::string name;
  int64_t offset = 0;  // of the data in the file
  int64_t size = 0;
};

// Every regular file of an uncompressed tar archive (ustar, pax or GNU long names), with the
// offset of its data. Throws std::runtime_error "PATH: ..." for a missing file, a file that is
// not a tar archive, or one that is truncated or damaged.
std::vector<TarMember> list_tar(const std::string& path);

// Samples of the shard files `dir/*.tar` (sorted by name): members grouped by key (the name up
// to the first dot of its last path component), `<key>.jpg|.jpeg` the image and `<key>.cls`
// the class index as decimal text; other members are ignored. classes: the lines of
// classes.txt in dir or its parent (every .cls must be below), else the largest label + 1 (below
// kMaxClasses).
class ShardSource : public SampleSource {
 public:
  // Throws std::runtime_error (one line naming the shard and key) for a missing or empty
  // folder, a damaged shard, a key without image or .cls or with two of either, or a bad .cls.
  explicit ShardSource(const std::string& dir);
  int64_t size() const override { return static_cast<int64_t>(samples_.size()); }
  int classes() const override { return classes_; }
  int32_t label(int64_t id) const override { return samples_[static_cast<size_t>(id)].label; }
  Encoding encoding() const override { return Encoding::Jpeg; }
  void read(int64_t id, std::vector<uint8_t>& out) const override;
  std::string name(int64_t id) const override;
  std::string describe() const override;
  // The classes.txt that declared the classes; empty when they came from the labels.
  const std::string& class_list() const { return class_list_; }

 private:
  struct Sample {
    int32_t shard;
    int32_t label;
    int64_t offset, size;
    std::string key;
  };
  std::string dir_;
  std::vector<std::string> shards_;
  std::vector<Sample> samples_;
  int classes_ = 0;
  std::string class_list_;
};

struct PackOptions {
  std::string input, output;
  int64_t shard_bytes = int64_t{256} << 20;  // a shard closes once it holds this much
  int threads = 2;
  uint64_t shuffle_seed = 0;  // 0: keep the sorted order (the same ids as the folder reader)
  // Asked between two images: true ends the packing (PackStopped), the shard being written
  // removed, the finished ones kept.
  std::function<bool()> stop;
};

// pack() ended by PackOptions::stop.
struct PackStopped : std::runtime_error {
  PackStopped(int done, int shards)
      : std::runtime_error(std::to_string(done) + " of " + std::to_string(shards) +
                           " shards written"),
        done(done),
        shards(shards) {}
  int done, shards;
};

struct PackProgress {
  int64_t images = 0, total_images = 0, bytes = 0;
  int shards_done = 0, shards = 0;
};

struct PackResult {
  int64_t images = 0, bytes = 0;
  int shards = 0;
  std::vector<std::string> files;  // every shard written
};

// An image folder -> tar shards (POSIX ustar; pax extended headers only for names that do not
// fit). The input is either class folders (`<wnid>/*.JPEG`: shards and classes.txt go to output)
// or an ImageNet root with train/ (and val/ as class folders): output/train/, output/val/ and
// output/classes.txt. Member names: `<wnid>/<file stem>.jpg` and `.cls`. Shards are written in
// parallel as `.tmp` files and renamed when complete. Throws std::invalid_argument for a bad
// option, a missing input or an output that already holds shards, and std::runtime_error for an
// input without images, two files that would be stored under one member name (the reader would
// keep only one), a file larger than kMaxEncodedBytes, or an I/O failure. `progress` (may be empty)
// is called from the writer threads, serialised.
PackResult pack(const PackOptions& o, const std::function<void(const PackProgress&)>& progress);

}  // namespace gg::shuffle
