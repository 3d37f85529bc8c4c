// Where samples come from: an indexed, labelled collection of stored samples (raw pixels or
// encoded JPEG bytes) behind one interface, and the readers for the supported layouts.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "shuffle/dataset.hpp"

namespace gg::shuffle {

enum class Encoding { Pixels, Jpeg };

// Thrown by SampleSource::read for one stored sample that cannot be used (a file too large to be an
// image): the loader skips and counts it like a file that fails to decode. Other read errors stop
// training.
struct UnusableSample : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The largest encoded sample a source hands out: more than any JPEG within kMaxJpegPixels at an
// ordinary quality, and a bound on what one read allocates.
inline constexpr int64_t kMaxEncodedBytes = int64_t{256} << 20;

// Sample ids are 0..size()-1. Every method is safe to call from several threads at once.
class SampleSource {
 public:
  virtual ~SampleSource() = default;
  virtual int64_t size() const = 0;
  virtual int classes() const = 0;
  virtual int32_t label(int64_t id) const = 0;
  virtual Encoding encoding() const = 0;
  // Pixels: the stored C, H, W of every sample. Jpeg: {0, 0, 0} (sizes vary).
  virtual std::array<int, 3> shape() const { return {0, 0, 0}; }
  // Replaces `out` with the stored bytes of sample id: the encoded file, or C*H*W pixels.
  // Throws std::runtime_error naming the file when the storage cannot be read, UnusableSample when
  // it is larger than kMaxEncodedBytes.
  virtual void read(int64_t id, std::vector<uint8_t>& out) const = 0;
  // Pixels sources held in memory: the sample without a copy. Otherwise nullptr.
  virtual const uint8_t* pixels(int64_t /*id*/) const { return nullptr; }
  // A name for log lines: the file, or shard:key.
  virtual std::string name(int64_t id) const = 0;
  // One line: what this is and where it lives.
  virtual std::string describe() const = 0;
};

// An in-memory Dataset (idx files) as a source; owns it, or shares it with the caller.
class DatasetSource : public SampleSource {
 public:
  DatasetSource(Dataset data, std::string where);
  DatasetSource(std::shared_ptr<const Dataset> data, std::string where);
  int64_t size() const override { return data_.count; }
  int classes() const override { return data_.classes; }
  int32_t label(int64_t id) const override { return data_.labels[static_cast<size_t>(id)]; }
  Encoding encoding() const override { return Encoding::Pixels; }
  std::array<int, 3> shape() const override;
  void read(int64_t id, std::vector<uint8_t>& out) const override;
  const uint8_t* pixels(int64_t id) const override;
  std::string name(int64_t id) const override;
  std::string describe() const override;
  const Dataset& data() const { return data_; }

 private:
  std::shared_ptr<const Dataset> owned_;
  const Dataset& data_;
  std::string where_;
};

// `synthetic:<C>x<H>x<W>[:classes[:count]]`: deterministic pseudo-random pixels and labels, a
// pure function of (id, seed), generated on demand (no memory per sample).
struct SyntheticSpec {
  int channels = 3, height = 224, width = 224;
  int classes = 10;
  int64_t count = 10000;
  uint64_t seed = 0;
};
// Parses the part after "synthetic:". Throws std::invalid_argument with the expected form.
SyntheticSpec parse_synthetic(const std::string& text);

class SyntheticSource : public SampleSource {
 public:
  explicit SyntheticSource(SyntheticSpec spec);
  int64_t size() const override { return spec_.count; }
  int classes() const override { return spec_.classes; }
  int32_t label(int64_t id) const override;
  Encoding encoding() const override { return Encoding::Pixels; }
  std::array<int, 3> shape() const override { return {spec_.channels, spec_.height, spec_.width}; }
  void read(int64_t id, std::vector<uint8_t>& out) const override;
  std::string name(int64_t id) const override;
  std::string describe() const override;

 private:
  SyntheticSpec spec_;
};

// Encoded image files listed by path, with labels (the ImageNet folder layout).
class FileListSource : public SampleSource {
 public:
  struct File {
    std::string path;
    int32_t label;
  };
  FileListSource(std::vector<File> files, std::vector<std::string> class_names, std::string where);
  int64_t size() const override { return static_cast<int64_t>(files_.size()); }
  int classes() const override { return static_cast<int>(class_names_.size()); }
  int32_t label(int64_t id) const override { return files_[static_cast<size_t>(id)].label; }
  Encoding encoding() const override { return Encoding::Jpeg; }
  void read(int64_t id, std::vector<uint8_t>& out) const override;
  std::string name(int64_t id) const override { return files_[static_cast<size_t>(id)].path; }
  std::string describe() const override;
  const std::vector<std::string>& class_names() const { return class_names_; }
  const std::vector<File>& files() const { return files_; }

 private:
  std::vector<File> files_;
  std::vector<std::string> class_names_;
  std::string where_;
};

// True for the file names the readers and `pack` take as JPEG images (.jpg, .jpeg, any case).
bool is_jpeg_name(const std::string& filename);

// The class folders of an ImageNet split: `dir/<wnid>/*.JPEG`, classes in sorted wnid order,
// files sorted by name within a class. Throws std::runtime_error (one line) when dir is missing,
// unreadable, holds no class folder with images, or more than kMaxClasses folders.
std::unique_ptr<FileListSource> read_image_folders(const std::string& dir);

// An ImageNet root: `root/train/<wnid>/...` and, for split "val", either `root/val/<wnid>/...`
// or flat `root/val/*.JPEG` with `labels_file` (default root/val_labels.txt) holding lines
// `<file name> <wnid or class index>`. Class indices always follow the sorted train wnids. Every
// line must name a file of val/ (once) and a train class; a labels_file given for a val/ of class
// folders is an error, not silently ignored. Errors: std::runtime_error, one line naming the file
// (and line).
std::unique_ptr<FileListSource> read_imagenet(const std::string& root, bool train,
                                              const std::string& labels_file = "");

// What a data source specification names, e.g. "imagenet:/data/ilsvrc".
struct SourceSpec {
  enum class Kind { Idx, ImageNet, Shards, Synthetic } kind = Kind::Idx;
  std::string path;         // Idx, ImageNet, Shards
  SyntheticSpec synthetic;  // Synthetic
  int classes = 0;          // Idx: the declared class count (fashion-mnist: 10), 0 = none
};
// "fashion-mnist" (the idx files under idx_dir, 10 classes), "idx:DIR", "imagenet:DIR",
// "shards:DIR", "synthetic:CxHxW[:classes[:count]]". Throws std::invalid_argument listing the
// forms.
SourceSpec parse_source(const std::string& text, const std::string& idx_dir);

// Opens the training or evaluation split. Returns nullptr when the layout has no evaluation
// split (synthetic data, an ImageNet root or shards without val/). Throws std::runtime_error with
// one line when the path is missing or unreadable, or the labels do not fit the classes. Classes:
// idx data declares them with SourceSpec::classes or DIR/classes.txt, shards with classes.txt,
// image folders with their class folders; otherwise the training labels give them (largest + 1,
// checked by check_discovered_classes).
std::unique_ptr<SampleSource> open_source(const SourceSpec& spec, bool train,
                                          const std::string& val_labels = "");

// Both splits, checked against each other: the evaluation samples (when there are any) must have
// the training samples' shape (pixel data) and labels among the training classes. Throws
// std::runtime_error with one line naming both files or folders and the mismatch.
struct DataSplits {
  std::unique_ptr<SampleSource> train, eval;
};
DataSplits open_splits(const SourceSpec& spec, const std::string& val_labels = "");

}  // namespace gg::shuffle
