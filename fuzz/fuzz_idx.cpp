// libFuzzer target: the idx reader must reject a damaged image/label pair (plain or gzip) with
// std::runtime_error, never crash, allocate beyond what the files hold, or return a data set whose
// sizes and labels disagree. Input: a 2-byte big-endian length, the images file of that many
// bytes, then the labels file.
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>

#include "shuffle/dataset.hpp"

namespace {

void write(const std::filesystem::path& path, const uint8_t* data, size_t size) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
}

void check(const gg::shuffle::Dataset& d, int classes) {
  if (d.count < 0 || d.channels < 1 || d.height < 1 || d.width < 1) __builtin_trap();
  if (static_cast<int64_t>(d.pixels.size()) != d.count * d.sample_size()) __builtin_trap();
  if (static_cast<int64_t>(d.labels.size()) != d.count) __builtin_trap();
  if (d.classes < 0 || d.classes > gg::shuffle::kMaxClasses) __builtin_trap();
  if (classes > 0 && d.classes != classes) __builtin_trap();
  for (int32_t v : d.labels)
    if (v < 0 || v >= d.classes) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  static const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("gg-fuzz-idx-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const size_t split = std::min<size_t>((size_t{data[0]} << 8) | data[1], size - 2);
  write(dir / "images", data + 2, split);
  write(dir / "labels", data + 2 + split, size - 2 - split);
  const std::string images = (dir / "images").string(), labels = (dir / "labels").string();
  try {
    const gg::shuffle::Dataset d = gg::shuffle::read_idx(images, labels);
    check(d, 0);
    gg::shuffle::check_discovered_classes(d.labels, d.classes, "fuzz", "declare them");
  } catch (const std::runtime_error&) {
  }
  try {
    check(gg::shuffle::read_idx(images, labels, 10), 10);
  } catch (const std::runtime_error&) {
  }
  return 0;
}
