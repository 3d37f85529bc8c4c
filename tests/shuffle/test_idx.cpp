// Unit tests for the idx reader: small files written to a temp dir, error messages, real data.
#include <stdlib.h>
#include <zlib.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

#include "shuffle/dataset.hpp"

namespace fs = std::filesystem;
using Catch::Matchers::Contains;
using gg::shuffle::Dataset;
using gg::shuffle::load_idx_dir;
using gg::shuffle::read_idx;

namespace {

// A fresh directory under the system temp dir, removed with everything in it at scope exit.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "gg_shuffle_idx_XXXXXX").string();
    if (mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed: " + tmpl);
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

void put_be32(std::vector<uint8_t>& out, uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<uint8_t>(v >> s));
}

// An idx file image: magic (0, 0, type, ndims), big-endian dims, then the payload.
std::vector<uint8_t> idx_bytes(uint8_t type, const std::vector<uint32_t>& dims,
                               const std::vector<uint8_t>& payload) {
  std::vector<uint8_t> out = {0, 0, type, static_cast<uint8_t>(dims.size())};
  for (uint32_t d : dims) put_be32(out, d);
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

void write_plain(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(f.good());
}

void write_gz(const std::string& path, const std::vector<uint8_t>& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  REQUIRE(f != nullptr);
  REQUIRE(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())) ==
          static_cast<int>(bytes.size()));
  REQUIRE(gzclose(f) == Z_OK);
}

std::vector<uint8_t> read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// Three 2x4 images with distinct pixels and labels {2, 0, 1}.
const std::vector<uint8_t> kPixels = {0,  1,  2,  3,  4,   5,   6,   7,   10,  11,  12,  13,
                                      14, 15, 16, 17, 200, 201, 202, 203, 252, 253, 254, 255};
const std::vector<uint8_t> kLabels = {2, 0, 1};

std::vector<uint8_t> images_file() { return idx_bytes(0x08, {3, 2, 4}, kPixels); }
std::vector<uint8_t> labels_file() { return idx_bytes(0x08, {3}, kLabels); }

void check_small_set(const Dataset& d) {
  CHECK(d.count == 3);
  CHECK(d.channels == 1);
  CHECK(d.height == 2);
  CHECK(d.width == 4);
  CHECK(d.sample_size() == 8);
  CHECK(d.classes == 3);
  CHECK(d.pixels == kPixels);
  CHECK(d.labels == std::vector<int32_t>{2, 0, 1});
}

// The message of the std::runtime_error that f throws; fails the test if it throws nothing.
template <class F>
std::string runtime_error_of(F&& f) {
  try {
    f();
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  FAIL("expected a std::runtime_error");
  return {};
}

}  // namespace

TEST_CASE("read_idx reads plain idx3 images and idx1 labels byte for byte", "[shuffle][idx]") {
  TempDir dir;
  write_plain(dir.file("img"), images_file());
  write_plain(dir.file("lab"), labels_file());
  check_small_set(read_idx(dir.file("img"), dir.file("lab")));
}

TEST_CASE("read_idx reads gzip-compressed files, alone or mixed with plain ones",
          "[shuffle][idx]") {
  TempDir dir;
  write_gz(dir.file("img.gz"), images_file());
  write_gz(dir.file("lab.gz"), labels_file());
  write_plain(dir.file("lab"), labels_file());
  const std::vector<uint8_t> gz = read_all(dir.file("img.gz"));
  REQUIRE(gz.size() >= 2);
  REQUIRE((gz[0] == 0x1f && gz[1] == 0x8b));  // really compressed, not passed through
  check_small_set(read_idx(dir.file("img.gz"), dir.file("lab.gz")));
  check_small_set(read_idx(dir.file("img.gz"), dir.file("lab")));
}

TEST_CASE("read_idx reads idx4 images as N x C x H x W", "[shuffle][idx]") {
  TempDir dir;
  std::vector<uint8_t> pixels(2 * 3 * 2 * 2);
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<uint8_t>(i * 7);
  write_plain(dir.file("img"), idx_bytes(0x08, {2, 3, 2, 2}, pixels));
  write_plain(dir.file("lab"), idx_bytes(0x08, {2}, {4, 1}));
  const Dataset d = read_idx(dir.file("img"), dir.file("lab"));
  CHECK(d.count == 2);
  CHECK(d.channels == 3);
  CHECK(d.height == 2);
  CHECK(d.width == 2);
  CHECK(d.classes == 5);
  CHECK(d.pixels == pixels);
}

TEST_CASE("read_idx decodes big-endian int32 labels and rejects negative ones as out of range",
          "[shuffle][idx]") {
  TempDir dir;
  write_plain(dir.file("img"), images_file());
  std::vector<uint8_t> labels;
  put_be32(labels, 300);
  put_be32(labels, 0);
  put_be32(labels, 7);
  write_plain(dir.file("lab32"), idx_bytes(0x0C, {3}, labels));
  const Dataset d = read_idx(dir.file("img"), dir.file("lab32"));
  CHECK(d.labels == std::vector<int32_t>{300, 0, 7});
  CHECK(d.classes == 301);

  labels.clear();
  put_be32(labels, 1);
  put_be32(labels, 0xffffffffu);  // -1
  put_be32(labels, 0);
  write_plain(dir.file("neg"), idx_bytes(0x0C, {3}, labels));
  const std::string msg = runtime_error_of([&] { read_idx(dir.file("img"), dir.file("neg")); });
  CHECK_THAT(msg, Contains(dir.file("neg")) && Contains("out of range") &&
                      Contains("label -1 of sample 1"));
}

TEST_CASE("read_idx with an explicit class count rejects labels at or above it and keeps it",
          "[shuffle][idx]") {
  TempDir dir;
  write_plain(dir.file("img"), images_file());
  write_plain(dir.file("lab"), labels_file());
  CHECK(read_idx(dir.file("img"), dir.file("lab"), 10).classes == 10);
  const std::string msg = runtime_error_of([&] { read_idx(dir.file("img"), dir.file("lab"), 2); });
  CHECK_THAT(msg, Contains(dir.file("lab")) && Contains("label 2 of sample 0") &&
                      Contains("out of range [0, 2)"));
  CHECK_THROWS_AS(read_idx(dir.file("img"), dir.file("lab"), 0), std::invalid_argument);
}

TEST_CASE("read_idx names a missing file in a one-line error", "[shuffle][idx]") {
  TempDir dir;
  write_plain(dir.file("lab"), labels_file());
  write_plain(dir.file("img"), images_file());
  const std::string missing = dir.file("no-such-images.gz");
  std::string msg = runtime_error_of([&] { read_idx(missing, dir.file("lab")); });
  CHECK_THAT(msg, Contains(missing) && Contains("not found"));
  CHECK(msg.find('\n') == std::string::npos);
  msg = runtime_error_of([&] { read_idx(dir.file("img"), dir.file("no-such-labels")); });
  CHECK_THAT(msg, Contains(dir.file("no-such-labels")) && Contains("not found"));
}

TEST_CASE("read_idx rejects a directory given where a file is expected", "[shuffle][idx]") {
  TempDir dir;
  write_plain(dir.file("lab"), labels_file());
  const std::string msg = runtime_error_of([&] { read_idx(dir.path().string(), dir.file("lab")); });
  CHECK_THAT(msg, Contains(dir.path().string()) && Contains("directory"));
}

TEST_CASE("read_idx reports a bad magic number and suspects swapped files", "[shuffle][idx]") {
  TempDir dir;
  write_plain(dir.file("img"), images_file());
  write_plain(dir.file("lab"), labels_file());
  write_plain(dir.file("junk"), {0x12, 0x34, 0x56, 0x78, 0, 0, 0, 3, 1, 2, 3});
  std::string msg = runtime_error_of([&] { read_idx(dir.file("junk"), dir.file("lab")); });
  CHECK_THAT(msg, Contains(dir.file("junk")) && Contains("bad magic number 0x12345678"));
  CHECK(msg.find('\n') == std::string::npos);

  msg = runtime_error_of([&] { read_idx(dir.file("lab"), dir.file("img")); });
  CHECK_THAT(msg, Contains(dir.file("lab")) && Contains("bad magic number 0x00000801") &&
                      Contains("swapped"));

  // Float images are valid idx but not the uint8 pixels a Dataset holds.
  write_plain(dir.file("float"), idx_bytes(0x0D, {3, 2, 4}, std::vector<uint8_t>(96)));
  msg = runtime_error_of([&] { read_idx(dir.file("float"), dir.file("lab")); });
  CHECK_THAT(msg, Contains(dir.file("float")) && Contains("bad magic number 0x00000d03"));
}

TEST_CASE("read_idx reports truncated headers and payloads, plain and gzip", "[shuffle][idx]") {
  TempDir dir;
  write_plain(dir.file("lab"), labels_file());
  std::vector<uint8_t> short_pixels(kPixels.begin(), kPixels.end() - 3);
  const std::vector<uint8_t> cut = idx_bytes(0x08, {3, 2, 4}, short_pixels);

  SECTION("plain payload") {
    write_plain(dir.file("img"), cut);
    const std::string msg = runtime_error_of([&] { read_idx(dir.file("img"), dir.file("lab")); });
    CHECK_THAT(msg, Contains(dir.file("img")) && Contains("truncated") &&
                        Contains("expected 24 bytes") && Contains("found 21"));
  }
  SECTION("complete gzip stream of a short payload") {
    write_gz(dir.file("img.gz"), cut);
    const std::string msg =
        runtime_error_of([&] { read_idx(dir.file("img.gz"), dir.file("lab")); });
    CHECK_THAT(msg, Contains(dir.file("img.gz")) && Contains("truncated"));
  }
  SECTION("gzip stream cut in the middle") {
    std::vector<uint8_t> big(4 + 12 + 3 * 64 * 64);
    for (size_t i = 16; i < big.size(); ++i) big[i] = static_cast<uint8_t>((i * 2654435761u) >> 7);
    const std::vector<uint8_t> full = idx_bytes(0x08, {3, 64, 64}, {big.begin() + 16, big.end()});
    write_gz(dir.file("full.gz"), full);
    std::vector<uint8_t> gz = read_all(dir.file("full.gz"));
    gz.resize(gz.size() / 2);
    write_plain(dir.file("cut.gz"), gz);
    const std::string msg =
        runtime_error_of([&] { read_idx(dir.file("cut.gz"), dir.file("lab")); });
    CHECK_THAT(msg, Contains(dir.file("cut.gz")) && Contains("truncated"));
  }
  SECTION("header") {
    write_plain(dir.file("hdr"), {0, 0, 8, 3, 0, 0});
    const std::string msg = runtime_error_of([&] { read_idx(dir.file("hdr"), dir.file("lab")); });
    CHECK_THAT(msg, Contains(dir.file("hdr")) && Contains("truncated"));
  }
  SECTION("labels") {
    write_plain(dir.file("img"), images_file());
    write_plain(dir.file("lab2"), idx_bytes(0x08, {3}, {1, 2}));
    const std::string msg = runtime_error_of([&] { read_idx(dir.file("img"), dir.file("lab2")); });
    CHECK_THAT(msg, Contains(dir.file("lab2")) && Contains("truncated"));
  }
}

TEST_CASE("read_idx reports corrupt gzip data as unreadable", "[shuffle][idx]") {
  TempDir dir;
  write_plain(dir.file("lab"), labels_file());
  // A valid gzip member header followed by bytes that are not a deflate stream.
  std::vector<uint8_t> bad = {0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3};
  for (int i = 0; i < 64; ++i) bad.push_back(0xff);
  write_plain(dir.file("bad.gz"), bad);
  const std::string msg = runtime_error_of([&] { read_idx(dir.file("bad.gz"), dir.file("lab")); });
  CHECK_THAT(msg, Contains(dir.file("bad.gz")) && Contains("corrupt gzip"));
}

TEST_CASE("read_idx reports a count mismatch naming both files", "[shuffle][idx]") {
  TempDir dir;
  write_plain(dir.file("img"), images_file());
  write_plain(dir.file("lab"), idx_bytes(0x08, {4}, {0, 1, 2, 3}));
  const std::string msg = runtime_error_of([&] { read_idx(dir.file("img"), dir.file("lab")); });
  CHECK_THAT(msg, Contains("count mismatch") && Contains(dir.file("img")) &&
                      Contains(dir.file("lab")) && Contains("3 images") && Contains("4 labels"));
  CHECK(msg.find('\n') == std::string::npos);
}

TEST_CASE("load_idx_dir picks the train or t10k split, gzip or plain", "[shuffle][idx]") {
  TempDir dir;
  write_gz(dir.file("train-images-idx3-ubyte.gz"), images_file());
  write_gz(dir.file("train-labels-idx1-ubyte.gz"), labels_file());
  write_plain(dir.file("t10k-images-idx3-ubyte"),
              idx_bytes(0x08, {1, 2, 4}, {kPixels.begin(), kPixels.begin() + 8}));
  write_plain(dir.file("t10k-labels-idx1-ubyte"), idx_bytes(0x08, {1}, {4}));
  check_small_set(load_idx_dir(dir.path().string(), true));
  const Dataset test = load_idx_dir(dir.path().string(), false);
  CHECK(test.count == 1);
  CHECK(test.labels == std::vector<int32_t>{4});
  CHECK(test.classes == 5);
}

TEST_CASE("load_idx_dir points at the dataset-fashion-mnist package when data is missing",
          "[shuffle][idx]") {
  TempDir dir;
  const std::string hint = "dataset-fashion-mnist";
  const std::string where = "/usr/share/datasets/fashion-mnist";

  const std::string nodir = dir.file("absent");
  std::string msg = runtime_error_of([&] { load_idx_dir(nodir, true); });
  CHECK_THAT(msg, Contains(nodir) && Contains(hint) && Contains(where));
  CHECK(msg.find('\n') == std::string::npos);

  write_gz(dir.file("train-images-idx3-ubyte.gz"), images_file());
  msg = runtime_error_of([&] { load_idx_dir(dir.path().string(), true); });
  CHECK_THAT(msg, Contains("train-labels-idx1-ubyte") && Contains(hint) && Contains(where));
  msg = runtime_error_of([&] { load_idx_dir(dir.path().string(), false); });
  CHECK_THAT(msg, Contains("t10k-images-idx3-ubyte") && Contains(hint) && Contains(where));
}

TEST_CASE("load_idx_dir reads the installed Fashion-MNIST: 60000/10000 balanced 28x28 images",
          "[shuffle][idx][data]") {
  const std::string dir = gg::shuffle::kFashionMnistDir;
  if (!fs::is_directory(dir)) {
    WARN("skipped: " << dir << " is absent (apt-get install dataset-fashion-mnist)");
    return;
  }
  for (const bool train : {true, false}) {
    const Dataset d = load_idx_dir(dir, train);
    const int64_t n = train ? 60000 : 10000;
    CHECK(d.count == n);
    CHECK(d.channels == 1);
    CHECK(d.height == 28);
    CHECK(d.width == 28);
    CHECK(d.classes == 10);
    REQUIRE(d.pixels.size() == static_cast<size_t>(n * 28 * 28));
    REQUIRE(d.labels.size() == static_cast<size_t>(n));
    std::vector<int64_t> per_class(10, 0);
    for (int32_t l : d.labels) per_class.at(static_cast<size_t>(l))++;
    CHECK(per_class == std::vector<int64_t>(10, n / 10));
    uint8_t lo = 255, hi = 0;
    for (uint8_t p : d.pixels) {
      lo = std::min(lo, p);
      hi = std::max(hi, p);
    }
    CHECK(lo == 0);
    CHECK(hi == 255);
    if (train) {
      // The first training samples are an ankle boot, two T-shirts and a dress.
      CHECK(std::vector<int32_t>(d.labels.begin(), d.labels.begin() + 4) ==
            std::vector<int32_t>{9, 0, 0, 3});
    }
  }
}
