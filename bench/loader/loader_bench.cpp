// bench/loader: decode + augment images/s of the data path, per worker thread, on a folder of
// JPEG files (ImageNet layout or flat). The files are read into memory first, so the figure is
// the CPU cost of decode + transform, not of the disk.
//
//   gg_bench_loader make DIR N [W H]    writes N photo-like JPEGs of about W x H (default 500 x
//   375) gg_bench_loader run DIR [SECONDS]   prints CSV rows:
//   impl,transform,threads,images,seconds,images_per_s
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "shuffle/image.hpp"
#include "shuffle/loader.hpp"
#include "shuffle/rng.hpp"
#include "shuffle/source.hpp"

using namespace gg::shuffle;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

// Smooth gradients, a few soft blobs and fine noise: compresses like a photo (about 0.15-0.3
// bytes per pixel at quality 90), unlike flat synthetic images.
Image photo_like(int w, int h, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const auto u = [&] { return static_cast<double>(rng() >> 11) * 0x1.0p-53; };
  Image img;
  img.width = w;
  img.height = h;
  img.channels = 3;
  img.pixels.resize(static_cast<size_t>(w) * h * 3);
  double cx[6], cy[6], r[6], col[6][3], base[3], gx[3], gy[3];
  for (int b = 0; b < 6; ++b) {
    cx[b] = u() * w;
    cy[b] = u() * h;
    r[b] = (0.05 + 0.3 * u()) * std::min(w, h);
    for (double& c : col[b]) c = 255 * u() - 128;
  }
  for (int c = 0; c < 3; ++c) {
    base[c] = 60 + 120 * u();
    gx[c] = (u() - 0.5) * 120 / w;
    gy[c] = (u() - 0.5) * 120 / h;
  }
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) {
      double v[3];
      for (int c = 0; c < 3; ++c) v[c] = base[c] + gx[c] * x + gy[c] * y;
      for (int b = 0; b < 6; ++b) {
        const double d2 = ((x - cx[b]) * (x - cx[b]) + (y - cy[b]) * (y - cy[b])) / (r[b] * r[b]);
        const double k = std::exp(-d2);
        for (int c = 0; c < 3; ++c) v[c] += k * col[b][c];
      }
      const double noise =
          (static_cast<double>(splitmix64(seed ^ (y * 131071ULL + x)) >> 58) - 32) * 1.2;
      uint8_t* p = img.pixels.data() + (static_cast<size_t>(y) * w + x) * 3;
      for (int c = 0; c < 3; ++c) p[c] = static_cast<uint8_t>(std::clamp(v[c] + noise, 0.0, 255.0));
    }
  return img;
}

std::vector<std::vector<uint8_t>> read_all(const std::string& dir) {
  std::vector<std::string> paths;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file() && is_jpeg_name(e.path().filename().string()))
      paths.push_back(e.path().string());
  std::sort(paths.begin(), paths.end());
  std::vector<std::vector<uint8_t>> out;
  for (const std::string& p : paths) {
    std::ifstream f(p, std::ios::binary);
    out.emplace_back(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  }
  return out;
}

// An in-memory encoded source over the files, for the PrefetchLoader figure.
class MemorySource : public SampleSource {
 public:
  explicit MemorySource(const std::vector<std::vector<uint8_t>>& files) : files_(files) {}
  int64_t size() const override { return static_cast<int64_t>(files_.size()); }
  int classes() const override { return 1; }
  int32_t label(int64_t) const override { return 0; }
  Encoding encoding() const override { return Encoding::Jpeg; }
  void read(int64_t id, std::vector<uint8_t>& out) const override {
    out = files_[static_cast<size_t>(id)];
  }
  std::string name(int64_t id) const override {
    return std::string("memory#").append(std::to_string(id));
  }
  std::string describe() const override { return "memory"; }

 private:
  const std::vector<std::vector<uint8_t>>& files_;
};

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "make" && argc >= 4) {
    const int n = std::atoi(argv[3]);
    const int w = argc > 4 ? std::atoi(argv[4]) : 500, h = argc > 5 ? std::atoi(argv[5]) : 375;
    fs::create_directories(fs::path(argv[2]) / "n00000001");
    int64_t bytes = 0;
    for (int i = 0; i < n; ++i) {
      // Sizes vary around w x h like ImageNet's (most photos 500 x 375 or 375 x 500).
      const bool portrait = i % 4 == 3;
      const int iw = portrait ? h : w - (i % 3) * 40, ih = portrait ? w : h - (i % 5) * 20;
      const std::vector<uint8_t> j = encode_jpeg(photo_like(iw, ih, 1000 + i), 90);
      char name[64];
      std::snprintf(name, sizeof name, "n00000001/img_%05d.JPEG", i);
      std::ofstream(fs::path(argv[2]) / name, std::ios::binary)
          .write(reinterpret_cast<const char*>(j.data()), static_cast<std::streamsize>(j.size()));
      bytes += static_cast<int64_t>(j.size());
    }
    std::fprintf(stderr, "wrote %d JPEGs, %.1f KB on average\n", n, bytes / 1e3 / n);
    return 0;
  }
  if (mode != "run" || argc < 3) {
    std::fprintf(stderr, "usage: gg_bench_loader make DIR N [W H] | run DIR [SECONDS]\n");
    return 2;
  }
  const double seconds = argc > 3 ? std::atof(argv[3]) : 5.0;
  const std::vector<std::vector<uint8_t>> files = read_all(argv[2]);
  if (files.empty()) {
    std::fprintf(stderr, "no JPEG files under %s\n", argv[2]);
    return 1;
  }
  std::printf("impl,transform,threads,images,seconds,images_per_s\n");
  // One thread, the transform loop itself (what one loader worker does per image).
  for (const bool train : {true, false}) {
    JpegDecoder dec;
    Image img;
    RandomResizedCrop rrc;
    PixelMap map;
    std::vector<float> out(3 * 224 * 224);
    std::mt19937_64 rng(1);
    int64_t n = 0;
    const auto t0 = Clock::now();
    double dt = 0;
    while (dt < seconds) {
      const std::vector<uint8_t>& f = files[static_cast<size_t>(n) % files.size()];
      int w = 0, h = 0;
      dec.header(f.data(), f.size(), w, h, nullptr);
      const CropBox box = train ? rrc.sample(w, h, rng) : center_crop_box(w, h, 256, 224);
      const bool flip = train && (rng() >> 63) != 0;
      const int mw = static_cast<int>(std::ceil(224.0 * w / box.w));
      const int mh = static_cast<int>(std::ceil(224.0 * h / box.h));
      dec.decode(f.data(), f.size(), 3, std::min(mw, w), std::min(mh, h), img, nullptr);
      const double sx = static_cast<double>(img.width) / w,
                   sy = static_cast<double>(img.height) / h;
      resample_to_chw(img, {box.x * sx, box.y * sy, box.w * sx, box.h * sy}, 224, 224, flip, map,
                      out.data());
      ++n;
      dt = std::chrono::duration<double>(Clock::now() - t0).count();
    }
    std::printf("gossipgrad,%s,1,%lld,%.3f,%.1f\n", train ? "train" : "eval",
                static_cast<long long>(n), dt, n / dt);
    std::fflush(stdout);
  }
  // The PrefetchLoader with 1 and 2 worker threads (batches of 32, training transform).
  MemorySource src(files);
  for (const int workers : {1, 2}) {
    LoaderOptions o;
    o.batch = 32;
    o.augment.enabled = true;
    o.workers = workers;
    o.prefetch = 4;
    const int64_t epochs =
        std::max<int64_t>(1, static_cast<int64_t>(seconds * 3000 / files.size()));
    PrefetchLoader loader(src, o, 0, epochs);
    Batch b;
    int64_t n = 0;
    const auto t0 = Clock::now();
    double dt = 0;
    while (dt < seconds && loader.next(b)) {
      n += b.valid;
      dt = std::chrono::duration<double>(Clock::now() - t0).count();
    }
    std::printf("gossipgrad-loader,train,%d,%lld,%.3f,%.1f\n", workers, static_cast<long long>(n),
                dt, n / dt);
    std::fflush(stdout);
  }
  return 0;
}
