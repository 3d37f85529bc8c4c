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

// Reads an idx3 image file (N x H x W, or idx4 N x C x H x W) of unsigned bytes and an idx1 label
// file (unsigned/signed byte, int16 or int32 elements), each gzip-compressed or plain (zlib reads
// both). classes = max label + 1. Throws std::runtime_error with a one-line message naming the
// file and the problem: missing, unreadable, bad magic number, unsupported element type,
// truncated, count mismatch between images and labels, label out of range (negative).
Dataset read_idx(const std::string& images_path, const std::string& labels_path);

// As above, but every label must lie in [0, classes) and the result has exactly `classes` classes,
// so a test split that happens to lack the top class still matches the model's output width.
Dataset read_idx(const std::string& images_path, const std::string& labels_path, int classes);

// Fashion-MNIST/MNIST in a directory holding train-images-idx3-ubyte.gz,
// train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz, t10k-labels-idx1-ubyte.gz (each with or
// without .gz). classes = max label + 1 (10). A missing directory or file names the Debian
// package `dataset-fashion-mnist`, which installs them under kFashionMnistDir.
Dataset load_idx_dir(const std::string& dir, bool train);

inline constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";

}  // namespace gg::shuffle
