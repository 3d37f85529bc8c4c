// Unit tests for JPEG files that must be skipped without harm (issue 15): a file cut inside its
// header, a header declaring 0x0, one declaring more pixels than the decoder takes. Each must be
// refused with a reason, counted by the loader, and leave the decoder able to read the next file.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include "shuffle/image.hpp"
#include "shuffle/loader.hpp"
#include "shuffle/source.hpp"
#include "shuffle/tar.hpp"
#include "tests/shuffle/data_fixture.hpp"

using Catch::Matchers::Contains;
using namespace gg::shuffle;
using gg::test::TempDir;

namespace {

std::vector<uint8_t> good_jpeg(int64_t i, int width = 48, int height = 40) {
  return encode_jpeg(gg::test::fashion_rgb(i, width, height, 1));
}

// The same file with its frame header (SOF0 or SOF2) declaring width x height.
std::vector<uint8_t> with_size(std::vector<uint8_t> jpg, int width, int height) {
  for (size_t p = 2; p + 9 < jpg.size(); ++p) {
    if (jpg[p] == 0xFF && (jpg[p + 1] == 0xC0 || jpg[p + 1] == 0xC2)) {
      jpg[p + 5] = static_cast<uint8_t>(height >> 8);
      jpg[p + 6] = static_cast<uint8_t>(height);
      jpg[p + 7] = static_cast<uint8_t>(width >> 8);
      jpg[p + 8] = static_cast<uint8_t>(width);
      return jpg;
    }
  }
  FAIL("no SOF marker");
  return jpg;
}

// The first `n` bytes: a file cut inside its header (the tables alone take about 600 bytes).
std::vector<uint8_t> cut(const std::vector<uint8_t>& jpg, size_t n) {
  return {jpg.begin(), jpg.begin() + static_cast<std::ptrdiff_t>(std::min(n, jpg.size()))};
}

// The decoder reads good files correctly: the right size, and the pixels of the image.
void check_decodes(JpegDecoder& dec, int64_t i) {
  const std::vector<uint8_t> jpg = good_jpeg(i);
  int w = 0, h = 0;
  std::string err;
  REQUIRE(dec.header(jpg.data(), jpg.size(), w, h, &err));
  CHECK((w == 48 && h == 40));
  Image img;
  REQUIRE(dec.decode(jpg.data(), jpg.size(), 3, 48, 40, img, &err) == 1.0);
  CHECK((img.width == 48 && img.height == 40 && img.channels == 3));
  CHECK(img.pixels.size() == 48u * 40u * 3u);
}

std::vector<Batch> drain(PrefetchLoader& loader) {
  std::vector<Batch> out;
  Batch b;
  while (loader.next(b)) out.push_back(b);
  return out;
}

// Every row of every batch: skipped rows (label -1) are zeros and name one of `bad`; the others
// hold finite values. Returns the number of skipped rows.
int64_t check_rows(const std::vector<Batch>& batches, const SampleSource& src,
                   const std::vector<std::string>& bad, int64_t row_size) {
  int64_t skipped = 0;
  for (const Batch& b : batches)
    for (int64_t r = 0; r < b.valid; ++r) {
      const float* x = b.x.data() + r * row_size;
      if (b.y[static_cast<size_t>(r)] < 0) {
        ++skipped;
        CHECK(std::find(bad.begin(), bad.end(), src.name(b.ids[static_cast<size_t>(r)])) !=
              bad.end());
        CHECK(std::all_of(x, x + row_size, [](float v) { return v == 0.f; }));
      } else {
        CHECK(std::all_of(x, x + row_size, [](float v) { return std::isfinite(v); }));
      }
    }
  return skipped;
}

}  // namespace

TEST_CASE("a JPEG cut inside its header fails and the decoder reads the next files correctly",
          "[shuffle][image]") {
  // 100 bytes end inside the tables (TurboJPEG 2.1 then reports success without a size), 300 and
  // 400 inside the frame and Huffman tables.
  for (size_t n : {size_t{100}, size_t{300}, size_t{400}}) {
    CAPTURE(n);
    JpegDecoder dec;
    const std::vector<uint8_t> bad = cut(good_jpeg(1), n);
    int w = -1, h = -1;
    std::string err;
    CHECK_FALSE(dec.header(bad.data(), bad.size(), w, h, &err));
    CHECK(!err.empty());
    for (int64_t i = 0; i < 3; ++i) check_decodes(dec, i);
    Image img;
    CHECK(dec.decode(bad.data(), bad.size(), 3, 1, 1, img, &err) == 0);
    CHECK(img.pixels.empty());  // nothing a caller could resample by mistake
    for (int64_t i = 0; i < 3; ++i) check_decodes(dec, i);
  }
}

TEST_CASE(
    "a JPEG cut inside its header among good ones is skipped and counted from a folder and its "
    "shards with any worker count and augmentation",
    "[shuffle][loader]") {
  TempDir d;
  gg::test::make_imagenet(d / "in", 2, 6);
  const std::vector<std::string> bad = {d / "in/train/n00000001/img_00_002.JPEG",
                                        d / "in/train/n00000008/img_01_004.JPEG"};
  gg::test::write_bytes(bad[0], cut(good_jpeg(3), 100));
  gg::test::write_bytes(bad[1], cut(good_jpeg(3), 300));
  PackOptions po;
  po.input = d / "in";
  po.output = d / "shards";
  po.shard_bytes = 6000;
  pack(po, {});
  const auto folder = read_imagenet(d / "in", true);
  const auto shards = open_source(parse_source("shards:" + (d / "shards"), ""), true);
  for (const SampleSource* src : {static_cast<const SampleSource*>(folder.get()),
                                  static_cast<const SampleSource*>(shards.get())})
    for (int workers : {1, 2})
      for (bool augment : {false, true}) {
        CAPTURE(src->describe(), workers, augment);
        LoaderOptions o;
        o.batch = 4;
        o.workers = workers;
        o.augment.enabled = augment;
        o.jpeg.crop = 16;
        o.jpeg.resize = 20;
        PrefetchLoader loader(*src, o, 0, 2);
        const std::vector<Batch> batches = drain(loader);
        CHECK(batches.size() == 6u);
        std::vector<std::string> names;  // the folder's paths, or shard:key of the same files
        for (int64_t i = 0; i < src->size(); ++i)
          if (folder->name(i) == bad[0] || folder->name(i) == bad[1]) names.push_back(src->name(i));
        CHECK(check_rows(batches, *src, names, 3 * 16 * 16) == 4);  // 2 files x 2 epochs
        CHECK(loader.skipped() == 4);
      }
}

TEST_CASE("a JPEG declaring 0x0 is refused and later valid files are not reported corrupt",
          "[shuffle][image][loader]") {
  const std::vector<uint8_t> zero = with_size(good_jpeg(2), 0, 0);
  JpegDecoder dec;
  int w = -1, h = -1;
  std::string err;
  CHECK_FALSE(dec.header(zero.data(), zero.size(), w, h, &err));
  CHECK(!err.empty());
  for (int64_t i = 0; i < 20; ++i) check_decodes(dec, i);

  // 80 files, one of them 0x0: one skip per epoch, whatever the worker count.
  TempDir d;
  gg::test::make_imagenet(d.path.string(), 4, 20);
  const std::string bad = d / "train/n00000015/img_02_007.JPEG";
  gg::test::write_bytes(bad, zero);
  const auto src = read_imagenet(d.path.string(), true);
  for (int workers : {1, 2}) {
    LoaderOptions o;
    o.batch = 8;
    o.workers = workers;
    o.jpeg.crop = 16;
    o.jpeg.resize = 20;
    PrefetchLoader loader(*src, o, 0, 2);
    CHECK(check_rows(drain(loader), *src, {bad}, 3 * 16 * 16) == 2);
    CHECK(loader.skipped() == 2);
  }
}

TEST_CASE("a JPEG declaring more than 100 megapixels is refused from its header before decoding",
          "[shuffle][image]") {
  const std::vector<uint8_t> huge = with_size(good_jpeg(4), 20000, 20000);  // 400 megapixels
  JpegDecoder dec;
  int w = 0, h = 0;
  std::string err;
  CHECK_FALSE(dec.header(huge.data(), huge.size(), w, h, &err));
  CHECK_THAT(err, Contains("20000x20000") && Contains("megapixels"));
  Image img;
  CHECK(dec.decode(huge.data(), huge.size(), 3, 16, 16, img, &err) == 0);
  CHECK(img.pixels.empty());
  check_decodes(dec, 0);
  // Just under the limit: a sequential file is read, decoded a few rows at a time at 1/8 scale.
  const std::vector<uint8_t> big = with_size(good_jpeg(4), 10000, 10000);
  CHECK(dec.header(big.data(), big.size(), w, h, &err));
  CHECK(dec.decode(big.data(), big.size(), 1, 1000, 1000, img, &err) == 0.125);
  CHECK((img.width == 1250 && img.height == 1250));
}

TEST_CASE("resample_to_chw refuses an image whose pixels do not match its size",
          "[shuffle][image]") {
  Image img;
  img.width = 64;
  img.height = 64;
  img.channels = 3;
  img.pixels.resize(10);
  std::vector<float> out(3 * 8 * 8);
  const PixelMap map;
  CHECK_THROWS_AS(resample_to_chw(img, {0, 0, 64, 64}, 8, 8, false, map, out.data()),
                  std::invalid_argument);
  img.pixels.resize(64 * 64 * 3);
  CHECK_THROWS_AS(resample_to_chw(img, {0, 0, NAN, 64}, 8, 8, false, map, out.data()),
                  std::invalid_argument);
  CHECK_THROWS_AS(resample_to_chw(img, {0, 0, 0, 64}, 8, 8, false, map, out.data()),
                  std::invalid_argument);
  img.width = img.height = 0;
  img.pixels.clear();
  CHECK_THROWS_AS(resample_to_chw(img, {0, 0, 1, 1}, 8, 8, false, map, out.data()),
                  std::invalid_argument);
  CHECK(std::all_of(out.begin(), out.end(), [](float v) { return v == 0.f; }));
}

TEST_CASE(
    "a progressive JPEG is refused when its whole-image coefficient buffer would pass 256 MiB",
    "[shuffle][image]") {
  const Image img = gg::test::fashion_rgb(5, 48, 40, 1);
  const std::vector<uint8_t> prog = encode_jpeg(img, 90, true), base = encode_jpeg(img, 90);
  JpegFrame f;
  std::string err;
  REQUIRE(read_jpeg_frame(prog.data(), prog.size(), f, &err));
  CHECK((f.width == 48 && f.height == 40 && f.components == 3 && f.buffered));
  REQUIRE(read_jpeg_frame(base.data(), base.size(), f, &err));
  CHECK_FALSE(f.buffered);

  JpegDecoder dec;
  Image out;
  CHECK(dec.decode(prog.data(), prog.size(), 3, 48, 40, out, &err) == 1.0);  // a real one decodes
  // 96 megapixels, 4:2:0: about 276 MiB of coefficients when progressive, nothing when sequential.
  const std::vector<uint8_t> wide = with_size(prog, 12000, 8000);
  REQUIRE(read_jpeg_frame(wide.data(), wide.size(), f, &err));
  CHECK(f.coefficient_bytes > kMaxJpegCoefficientBytes);
  int w = 0, h = 0;
  CHECK_FALSE(dec.header(wide.data(), wide.size(), w, h, &err));
  CHECK_THAT(err, Contains("12000x8000") && Contains("MiB"));
  const std::vector<uint8_t> wide_base = with_size(base, 12000, 8000);
  CHECK(dec.header(wide_base.data(), wide_base.size(), w, h, &err));
  check_decodes(dec, 1);
}

TEST_CASE("read_jpeg_frame refuses what is not a JPEG frame", "[shuffle][image]") {
  JpegFrame f;
  std::string err;
  const std::vector<uint8_t> good = good_jpeg(6);
  for (size_t n : {size_t{0}, size_t{2}, size_t{20}, size_t{300}}) {
    const std::vector<uint8_t> part = cut(good, n);
    CHECK_FALSE(read_jpeg_frame(part.data(), part.size(), f, &err));
  }
  const std::vector<uint8_t> zero = with_size(good, 0, 40);
  CHECK_FALSE(read_jpeg_frame(zero.data(), zero.size(), f, &err));
  CHECK_THAT(err, Contains("0x40"));
  REQUIRE(read_jpeg_frame(good.data(), good.size(), f, &err));
  CHECK((f.width == 48 && f.height == 40 && f.components == 3));
}

TEST_CASE("a JPEG truncated inside its image data is skipped as truncated and not decoded as grey",
          "[shuffle][image][loader]") {
  for (bool progressive : {false, true}) {
    const std::vector<uint8_t> whole =
        encode_jpeg(gg::test::fashion_rgb(3, 200, 160, 1), 90, progressive);
    const std::vector<uint8_t> part = cut(whole, whole.size() * 2 / 3);
    JpegDecoder dec;
    Image img;
    std::string err;
    CHECK(dec.decode(part.data(), part.size(), 3, 200, 160, img, &err) == 0);
    CHECK_THAT(err, Contains("truncated"));
    CHECK(img.pixels.empty());
    check_decodes(dec, 2);
  }
  TempDir d;
  gg::test::make_imagenet(d.path.string(), 2, 4);
  const std::string bad = d / "train/n00000008/img_01_001.JPEG";
  const std::vector<uint8_t> whole = good_jpeg(9, 160, 120);
  gg::test::write_bytes(bad, cut(whole, whole.size() / 3 + 700));  // past the ~600 header bytes
  const auto src = read_imagenet(d.path.string(), true);
  LoaderOptions o;
  o.batch = 4;
  o.jpeg.crop = 16;
  o.jpeg.resize = 20;
  PrefetchLoader loader(*src, o, 0, 1);
  CHECK(check_rows(drain(loader), *src, {bad}, 3 * 16 * 16) == 1);
  CHECK(loader.skipped() == 1);
}

TEST_CASE(
    "an image file larger than any JPEG the loader takes is skipped unread and pack refuses it",
    "[shuffle][loader][tar]") {
  TempDir d;
  gg::test::make_imagenet(d / "in", 2, 4);
  const std::string big = d / "in/train/n00000001/img_00_001.JPEG";
  std::filesystem::resize_file(big, kMaxEncodedBytes + 1);  // sparse: no disk, no reading
  const auto src = read_imagenet(d / "in", true);
  std::vector<uint8_t> bytes;
  CHECK_THROWS_AS(src->read(1, bytes), UnusableSample);
  CHECK(bytes.empty());
  LoaderOptions o;
  o.batch = 4;
  o.jpeg.crop = 16;
  o.jpeg.resize = 20;
  PrefetchLoader loader(*src, o, 0, 1);
  CHECK(check_rows(drain(loader), *src, {big}, 3 * 16 * 16) == 1);
  CHECK(loader.skipped() == 1);
  PackOptions po;
  po.input = d / "in";
  po.output = d / "out";
  CHECK_THROWS_WITH(pack(po, {}), Contains(big) && Contains("MiB"));
}
