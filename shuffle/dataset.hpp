// In-memory labelled image sets and the idx (MNIST / Fashion-MNIST) file reader that fills them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gg::shuffle {

// An in-memory labelled image set, uint8 pixels, N x C x H x W.
struct Dataset {
  int64_t count = 0;
  int channels = 0, height = 0, width = 0;
  int classes = 0;
  std::vector<uint8_t> pixels;  // count*channels*height*width
  std::vector<int32_t> labels;  // count
  int64_t sample_size() const;  // channels*height*width
};

// More classes than any data set this runtime trains (ImageNet-21k has 21,841): a label or class
// list beyond it is a mistake, refused before a model that wide is allocated.
inline constexpr int kMaxClasses = 1'000'000;

// Checks a class count found as the largest label + 1, when the data declares none: refused when
// more than half of the classes [0, classes) have no sample, since a few stray labels (one 200
// among 0..9) would otherwise silently widen the model. Throws std::runtime_error (one line) naming
// `where`, the largest label and its sample, and `declare`: how to declare the count instead.
void check_discovered_classes(const std::vector<int32_t>& labels, int classes,
                              const std::string& where, const std::string& declare);

// The number of classes a class list declares (classes.txt: one name per non-blank line). Throws
// std::runtime_error naming the file when it cannot be read, is empty, or lists more than
// kMaxClasses.
int read_class_list(const std::string& path);

// Reads an idx3 image file (N x H x W, or idx4 N x C x H x W) of unsigned bytes and an idx1 label
// file (unsigned/signed byte, int16 or int32 elements), each gzip-compressed or plain (zlib reads
// both). classes = max label + 1. Throws std::runtime_error with a one-line message naming the
// file and the problem: missing, unreadable, bad magic number, unsupported element type,
// truncated, count mismatch between images and labels, label out of range (negative, or not
// below kMaxClasses), a sample size beyond 2^31 bytes.
Dataset read_idx(const std::string& images_path, const std::string& labels_path);

// As above, but every label must lie in [0, classes) and the result has exactly `classes` classes,
// so a test split that happens to lack the top class still matches the model's output width.
Dataset read_idx(const std::string& images_path, const std::string& labels_path, int classes);

// The image and label files of one split of an idx folder: train-* or t10k-*, each .gz if present,
// else plain. Throws std::runtime_error like load_idx_dir when either is missing.
struct IdxFiles {
  std::string images, labels;
};
IdxFiles find_idx_files(const std::string& dir, bool train);

// Fashion-MNIST/MNIST in a directory holding train-images-idx3-ubyte.gz,
// train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz, t10k-labels-idx1-ubyte.gz (each with or
// without .gz). classes = max label + 1 (10). A missing directory or file names the Debian
// package `dataset-fashion-mnist`, which installs them under kFashionMnistDir.
Dataset load_idx_dir(const std::string& dir, bool train);

inline constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";
inline constexpr int kFashionMnistClasses = 10;

}  // namespace gg::shuffle
