// Generated test data: JPEG image folders in the ImageNet layout made from Fashion-MNIST images,
// and temporary folders that clean up after themselves. Nothing is downloaded.
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "shuffle/dataset.hpp"
#include "shuffle/image.hpp"

namespace gg::test {

// A fresh folder under the system temp dir, removed with everything in it on destruction.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    char tmpl[] = "/tmp/gg-test-XXXXXX";
    path = mkdtemp(tmpl);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string operator/(const std::string& name) const { return (path / name).string(); }
};

inline const shuffle::Dataset& fashion_test_images() {
  static const shuffle::Dataset d = shuffle::load_idx_dir(shuffle::kFashionMnistDir, false);
  return d;
}

// Fashion-MNIST image i as an RGB image of width x height (nearest neighbour), tinted by `tint`
// so that colour channels differ.
inline shuffle::Image fashion_rgb(int64_t i, int width, int height, int tint) {
  const shuffle::Dataset& d = fashion_test_images();
  shuffle::Image img;
  img.width = width;
  img.height = height;
  img.channels = 3;
  img.pixels.resize(static_cast<size_t>(width) * height * 3);
  const uint8_t* src = d.pixels.data() + (i % d.count) * 28 * 28;
  for (int y = 0; y < height; ++y)
    for (int x = 0; x < width; ++x) {
      const int v = src[(y * 28 / height) * 28 + x * 28 / width];
      uint8_t* p = img.pixels.data() + (static_cast<size_t>(y) * width + x) * 3;
      p[0] = static_cast<uint8_t>(v);
      p[1] = static_cast<uint8_t>((v * (3 + tint % 5)) / 8);
      p[2] = static_cast<uint8_t>(255 - v / 2 - 10 * (tint % 7));
    }
  return img;
}

inline void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// root/train/n000000CC/img_CC_KKK.JPEG (per_class images per class) and, when val_per_class > 0,
// root/val/n000000CC/...; image sizes vary between 40 and 160 pixels a side.
inline void make_imagenet(const std::string& root, int classes, int per_class,
                          int val_per_class = 0) {
  int64_t k = 0;
  for (const char* split : {"train", "val"}) {
    const int n = std::string(split) == "train" ? per_class : val_per_class;
    for (int c = 0; c < classes; ++c) {
      char wnid[16];
      std::snprintf(wnid, sizeof wnid, "n%08d", c * 7 + 1);
      for (int j = 0; j < n; ++j, ++k) {
        const int w = 40 + static_cast<int>((k * 37) % 121),
                  h = 40 + static_cast<int>((k * 53) % 121);
        char name[64];
        std::snprintf(name, sizeof name, "img_%02d_%03d.JPEG", c, j);
        write_bytes(root + "/" + split + "/" + wnid + "/" + name,
                    shuffle::encode_jpeg(fashion_rgb(k, w, h, c), 90));
      }
    }
  }
}

}  // namespace gg::test
