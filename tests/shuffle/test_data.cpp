// Unit tests for the data pipeline: JPEG decode and transforms, the image folder, tar shard and
// synthetic readers, pack, and the multi-worker loader over them.
#include <archive.h>
#include <archive_entry.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
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

std::vector<Batch> drain(PrefetchLoader& loader) {
  std::vector<Batch> out;
  Batch b;
  while (loader.next(b)) out.push_back(b);
  return out;
}

LoaderOptions jpeg_options(bool augment, int workers) {
  LoaderOptions o;
  o.batch = 4;
  o.seed = 5;
  o.augment.enabled = augment;
  o.workers = workers;
  o.jpeg.crop = 32;
  o.jpeg.resize = 36;
  return o;
}

// A tar written member by member, for archives pack would never write.
void write_tar(const std::string& path, const std::vector<std::pair<std::string, std::string>>& m) {
  archive* a = archive_write_new();
  archive_write_set_format_pax_restricted(a);
  REQUIRE(archive_write_open_filename(a, path.c_str()) == ARCHIVE_OK);
  for (const auto& [name, data] : m) {
    archive_entry* e = archive_entry_new();
    archive_entry_set_pathname(e, name.c_str());
    archive_entry_set_size(e, static_cast<la_int64_t>(data.size()));
    archive_entry_set_filetype(e, AE_IFREG);
    archive_entry_set_perm(e, 0644);
    REQUIRE(archive_write_header(a, e) == ARCHIVE_OK);
    if (!data.empty()) archive_write_data(a, data.data(), data.size());
    archive_entry_free(e);
  }
  archive_write_close(a);
  archive_write_free(a);
}

std::string jpeg_string(int64_t i) {
  const std::vector<uint8_t> j = encode_jpeg(gg::test::fashion_rgb(i, 48, 40, 1));
  return std::string(j.begin(), j.end());
}

}  // namespace

TEST_CASE("RandomResizedCrop boxes lie inside the image with torchvision's area and ratio bounds",
          "[shuffle][image]") {
  RandomResizedCrop rrc;
  std::mt19937_64 rng(3);
  for (int t = 0; t < 2000; ++t) {
    // Aspect ratios within [1/2, 2]: a random box always fits (extreme shapes take the fallback).
    const int w = 40 + static_cast<int>(rng() % 600);
    const int h = w / 2 + static_cast<int>(rng() % static_cast<uint64_t>(w * 3 / 2));
    const CropBox b = rrc.sample(w, h, rng);
    INFO(w << "x" << h << " -> " << b.x << "," << b.y << " " << b.w << "x" << b.h);
    CHECK(b.x >= 0);
    CHECK(b.y >= 0);
    CHECK(b.x + b.w <= w);
    CHECK(b.y + b.h <= h);
    CHECK(b.w == std::floor(b.w));
    const double area = b.w * b.h / (static_cast<double>(w) * h);
    // Whole-pixel rounding of each side moves the area and ratio a little past the bounds.
    const double slack = 2.0 / std::min(b.w, b.h) + 2.0 / std::min(w, h);
    CHECK(area >= 0.08 * (1 - 2 * slack));
    CHECK(b.w / b.h >= 0.75 * (1 - slack));
    CHECK(b.w / b.h <= 4.0 / 3.0 * (1 + slack));
  }
}

TEST_CASE("RandomResizedCrop falls back to a centred crop at the nearest ratio for extreme shapes",
          "[shuffle][image]") {
  RandomResizedCrop rrc;
  std::mt19937_64 rng(1);
  // 1000x10: no random box of ratio <= 4/3 and area >= 8% fits, so the fallback decides.
  const CropBox b = rrc.sample(1000, 10, rng);
  CHECK(b.h == 10);
  CHECK(b.w == 13);  // round(10 * 4/3)
  CHECK(b.x == (1000 - 13) / 2);
  CHECK(b.y == 0);
}

TEST_CASE("center_crop_box takes the centred crop of the image resized on its shorter side",
          "[shuffle][image]") {
  const CropBox b = center_crop_box(512, 384, 256, 224);
  CHECK(b.w == Approx(224.0 * 384 / 256));
  CHECK(b.h == Approx(224.0 * 384 / 256));
  CHECK(b.x == Approx((512 - b.w) / 2));
  CHECK(b.y == Approx((384 - b.h) / 2));
}

TEST_CASE("JPEG round trip keeps the pixels and DCT scaling picks the smallest SIMD scale",
          "[shuffle][image]") {
  const Image img = gg::test::fashion_rgb(7, 800, 600, 2);
  const std::vector<uint8_t> jpg = encode_jpeg(img, 95);
  JpegDecoder dec;
  Image out;
  std::string err;
  REQUIRE(dec.decode(jpg.data(), jpg.size(), 3, 800, 600, out, &err) == 1.0);
  REQUIRE(out.width == 800);
  double diff = 0;
  for (size_t i = 0; i < img.pixels.size(); ++i) diff += std::abs(img.pixels[i] - out.pixels[i]);
  CHECK(diff / img.pixels.size() < 4.0);
  CHECK(dec.decode(jpg.data(), jpg.size(), 3, 100, 75, out, &err) == 0.125);
  CHECK((out.width == 100 && out.height == 75));
  CHECK(dec.decode(jpg.data(), jpg.size(), 3, 101, 10, out, &err) == 0.25);
  CHECK(out.width == 200);
  CHECK(dec.decode(jpg.data(), jpg.size(), 1, 10, 10, out, &err) == 0.125);
  CHECK(out.channels == 1);
  CHECK(out.pixels.size() == 100u * 75u);
}

TEST_CASE("a corrupt or empty JPEG fails to decode with a reason", "[shuffle][image]") {
  JpegDecoder dec;
  Image out;
  std::string err;
  const std::vector<uint8_t> junk(500, 0x42);
  CHECK(dec.decode(junk.data(), junk.size(), 3, 1, 1, out, &err) == 0);
  CHECK(!err.empty());
  CHECK(dec.decode(nullptr, 0, 3, 1, 1, out, &err) == 0);
  CHECK(err == "empty file");
}

TEST_CASE("resample_to_chw maps a whole-image box to the normalised pixels and flips",
          "[shuffle][image]") {
  Image img;
  img.width = 4;
  img.height = 2;
  img.channels = 3;
  for (int i = 0; i < 24; ++i) img.pixels.push_back(static_cast<uint8_t>(i * 10));
  PixelMap map;
  for (int c = 0; c < 3; ++c) {
    map.mean[c] = 0;
    map.std[c] = 1;
  }
  std::vector<float> out(24), flipped(24);
  resample_to_chw(img, {0, 0, 4, 2}, 2, 4, false, map, out.data());
  resample_to_chw(img, {0, 0, 4, 2}, 2, 4, true, map, flipped.data());
  for (int c = 0; c < 3; ++c)
    for (int y = 0; y < 2; ++y)
      for (int x = 0; x < 4; ++x) {
        const float want = img.pixels[(y * 4 + x) * 3 + c] / 255.f;
        CHECK(out[(c * 2 + y) * 4 + x] == Approx(want));
        CHECK(flipped[(c * 2 + y) * 4 + (3 - x)] == Approx(want));
      }
}

TEST_CASE("synthetic specs parse, reject malformed text and give deterministic samples",
          "[shuffle][source]") {
  const SyntheticSpec s = parse_synthetic("3x32x24:7:100");
  CHECK((s.channels == 3 && s.height == 32 && s.width == 24 && s.classes == 7 && s.count == 100));
  CHECK(parse_synthetic("1x8x8").count == 10000);
  for (const char* bad : {"", "3x32", "2x8x8", "3x8x8:0", "3x8x8:2:0", "3xAx8", "3x8x8:1:2:3"})
    CHECK_THROWS_AS(parse_synthetic(bad), std::invalid_argument);
  SyntheticSource a(s), b(s);
  std::vector<uint8_t> x, y, z;
  a.read(5, x);
  b.read(5, y);
  a.read(6, z);
  CHECK(x.size() == 3u * 32 * 24);
  CHECK(x == y);
  CHECK(x != z);
  std::set<int32_t> labels;
  for (int64_t i = 0; i < 100; ++i) labels.insert(a.label(i));
  CHECK(*labels.begin() >= 0);
  CHECK(*labels.rbegin() < 7);
  CHECK(labels.size() == 7u);
}

TEST_CASE("data source specs name the layout, and missing folders are clear errors",
          "[shuffle][source]") {
  CHECK(parse_source("fashion-mnist", "/x").path == "/x");
  CHECK(parse_source("imagenet:/data/in1k", "").kind == SourceSpec::Kind::ImageNet);
  CHECK(parse_source("shards:/s", "").kind == SourceSpec::Kind::Shards);
  CHECK(parse_source("synthetic:3x8x8", "").kind == SourceSpec::Kind::Synthetic);
  CHECK_THROWS_WITH(parse_source("imagenet:", ""), Contains("names no folder"));
  CHECK_THROWS_WITH(parse_source("s3://bucket", ""), Contains("not a data source"));
  CHECK_THROWS_WITH(open_source(parse_source("imagenet:/nonexistent/in1k", ""), true),
                    Contains("/nonexistent/in1k") && Contains("no such folder"));
  CHECK_THROWS_WITH(open_source(parse_source("shards:/nonexistent/s", ""), true),
                    Contains("no such folder"));
  TempDir empty;
  std::filesystem::create_directories(empty / "train/n1");
  CHECK_THROWS_WITH(read_imagenet(empty.path.string(), true), Contains("no class folder holds"));
}

TEST_CASE("ImageNet folders give classes in sorted wnid order, val as folders or a labels file",
          "[shuffle][source]") {
  TempDir d;
  gg::test::make_imagenet(d.path.string(), 3, 4, 2);
  const auto train = read_imagenet(d.path.string(), true);
  REQUIRE(train->size() == 12);
  CHECK(train->classes() == 3);
  CHECK(train->class_names() == std::vector<std::string>{"n00000001", "n00000008", "n00000015"});
  for (int64_t i = 0; i < 12; ++i) CHECK(train->label(i) == i / 4);
  const auto val = read_imagenet(d.path.string(), false);
  REQUIRE(val->size() == 6);
  CHECK(val->label(5) == 2);

  // A flat val/ with labels by wnid or index.
  TempDir flat;
  gg::test::make_imagenet(flat.path.string(), 3, 2, 0);
  gg::test::write_bytes(flat / "val/a.JPEG", encode_jpeg(gg::test::fashion_rgb(1, 30, 30, 0)));
  gg::test::write_bytes(flat / "val/b.JPEG", encode_jpeg(gg::test::fashion_rgb(2, 30, 30, 0)));
  {
    std::ofstream f(flat / "val_labels.txt");
    f << "a.JPEG n00000015\nb.JPEG 1\n";
  }
  const auto v = read_imagenet(flat.path.string(), false);
  REQUIRE(v->size() == 2);
  CHECK(v->label(0) == 2);
  CHECK(v->label(1) == 1);
  {
    std::ofstream f(flat / "val_labels.txt");
    f << "a.JPEG n99999999\n";
  }
  CHECK_THROWS_WITH(read_imagenet(flat.path.string(), false),
                    Contains("val_labels.txt:1") && Contains("n99999999"));
}

TEST_CASE("pack writes tar shards that hold the folder's images with the same ids and labels",
          "[shuffle][tar]") {
  TempDir d;
  gg::test::make_imagenet(d / "in", 3, 5, 2);
  PackOptions o;
  o.input = d / "in";
  o.output = d / "out";
  o.shard_bytes = 4000;  // several shards
  o.threads = 3;
  int calls = 0;
  const PackResult r = pack(o, [&](const PackProgress&) { ++calls; });
  CHECK(r.images == 21);
  CHECK(r.shards >= 3);
  CHECK(calls > 0);
  CHECK(std::filesystem::exists(d / "out/classes.txt"));
  CHECK(std::filesystem::exists(d / "out/train/shard-000000.tar"));
  CHECK(std::filesystem::exists(d / "out/val/shard-000000.tar"));
  for (const auto& e : std::filesystem::directory_iterator(d / "out/train"))
    CHECK(e.path().extension() == ".tar");  // no .tmp left behind

  const auto folder = read_imagenet(d / "in", true);
  const auto shards = open_source(parse_source("shards:" + (d / "out"), ""), true);
  REQUIRE(shards->size() == folder->size());
  CHECK(shards->classes() == 3);
  std::vector<uint8_t> a, b;
  for (int64_t i = 0; i < folder->size(); ++i) {
    CHECK(shards->label(i) == folder->label(i));
    folder->read(i, a);
    shards->read(i, b);
    CHECK(a == b);
  }
  CHECK_THAT(shards->name(0), Contains("shard-000000.tar:n00000001/img_00_000"));
  const auto val = open_source(parse_source("shards:" + (d / "out"), ""), false);
  REQUIRE(val != nullptr);
  CHECK(val->size() == 6);

  // Refuses to overwrite; an input without images is an error.
  CHECK_THROWS_WITH(pack(o, {}), Contains("already holds shards"));
  o.input = d / "nope";
  CHECK_THROWS_AS(pack(o, {}), std::invalid_argument);
}

TEST_CASE("pack asked to stop keeps its finished shards whole and leaves no partial one",
          "[shuffle][tar]") {
  TempDir d;
  gg::test::make_imagenet(d / "in", 3, 5, 0);
  PackOptions o;
  o.input = d / "in";
  o.output = d / "out";
  o.shard_bytes = 4000;
  o.threads = 1;
  int asked = 0;
  o.stop = [&] { return ++asked > 8; };  // a few images in, inside a shard
  try {
    pack(o, {});
    FAIL("pack did not stop");
  } catch (const gg::shuffle::PackStopped& e) {
    CHECK(e.done >= 1);
    CHECK(e.done < e.shards);
  }
  int whole = 0;
  for (const auto& e : std::filesystem::directory_iterator(d / "out/train")) {
    CHECK(e.path().extension() == ".tar");  // the shard being written is removed
    ++whole;
  }
  CHECK(whole >= 1);
  CHECK_NOTHROW(ShardSource(d / "out/train"));  // what is there reads as whole shards
}

TEST_CASE("the ImageNet folder and its tar shards give the same batches, with any worker count",
          "[shuffle][tar][loader]") {
  TempDir d;
  gg::test::make_imagenet(d / "in", 4, 6);
  PackOptions o;
  o.input = d / "in";
  o.output = d / "out";
  o.shard_bytes = 6000;
  pack(o, {});
  const auto folder = read_imagenet(d / "in", true);
  const ShardSource shards(d / "out/train");
  for (const bool augment : {true, false}) {
    PrefetchLoader a(*folder, jpeg_options(augment, 1), 0, 2);
    PrefetchLoader b(shards, jpeg_options(augment, 3), 0, 2);
    const std::vector<Batch> x = drain(a), y = drain(b);
    REQUIRE(x.size() == 12u);
    REQUIRE(y.size() == x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      CHECK(x[i].ids == y[i].ids);
      CHECK(x[i].y == y[i].y);
      CHECK(x[i].x == y[i].x);
    }
    CHECK(a.skipped() == 0);
    CHECK(a.sample_shape() == std::array<int, 3>{3, 32, 32});
  }
}

TEST_CASE("the tar reader takes long names and empty members, and reports truncation clearly",
          "[shuffle][tar]") {
  TempDir d;
  const std::string long_key = "n00000001/" + std::string(150, 'k');
  write_tar(d / "shard-000000.tar", {{long_key + ".jpg", jpeg_string(1)},
                                     {long_key + ".cls", "1"},
                                     {"empty.jpg", ""},
                                     {"empty.cls", "0\n"},
                                     {"notes.txt", "ignored"},
                                     {"zero_length.txt", ""}});
  const std::vector<TarMember> members = list_tar(d / "shard-000000.tar");
  REQUIRE(members.size() == 6u);
  CHECK(members[0].name == long_key + ".jpg");
  CHECK(members[2].size == 0);
  ShardSource src(d.path.string());
  REQUIRE(src.size() == 2);
  CHECK(src.label(0) == 1);
  CHECK(src.classes() == 2);
  std::vector<uint8_t> bytes;
  src.read(0, bytes);
  CHECK(std::string(bytes.begin(), bytes.end()) == jpeg_string(1));
  src.read(1, bytes);
  CHECK(bytes.empty());

  // The empty image is skipped and counted, not fatal.
  LoaderOptions lo = jpeg_options(false, 1);
  lo.batch = 2;
  PrefetchLoader loader(src, lo, 0, 1);
  const std::vector<Batch> batches = drain(loader);
  REQUIRE(batches.size() == 1u);
  CHECK(loader.skipped() == 1);
  const int skipped_row = batches[0].ids[0] == 1 ? 0 : 1;
  CHECK(batches[0].y[skipped_row] == -1);
  CHECK(batches[0].y[1 - skipped_row] == 1);

  // Truncated in the middle of a member.
  const auto size = std::filesystem::file_size(d / "shard-000000.tar");
  std::filesystem::resize_file(d / "shard-000000.tar", 2000);
  CHECK_THROWS_WITH(list_tar(d / "shard-000000.tar"),
                    Contains("shard-000000.tar") && Contains("truncated"));
  CHECK_THROWS_WITH(ShardSource(d.path.string()), Contains("truncated"));
  CHECK(size > 2000);

  // Not a tar at all; a sample without .cls; a bad .cls.
  gg::test::write_bytes(d / "shard-000000.tar", std::vector<uint8_t>(3000, 'x'));
  CHECK_THROWS_WITH(list_tar(d / "shard-000000.tar"), Contains("shard-000000.tar"));
  write_tar(d / "shard-000000.tar", {{"a.jpg", jpeg_string(1)}});
  CHECK_THROWS_WITH(ShardSource(d.path.string()), Contains("'a'") && Contains("no .cls"));
  write_tar(d / "shard-000000.tar", {{"a.jpg", jpeg_string(1)}, {"a.cls", "cat"}});
  CHECK_THROWS_WITH(ShardSource(d.path.string()), Contains("not a class index"));
}

TEST_CASE("a corrupt JPEG in an image folder is skipped and counted while the rest loads",
          "[shuffle][loader]") {
  TempDir d;
  gg::test::make_imagenet(d.path.string(), 2, 4);
  const std::string bad = d / "train/n00000008/img_01_002.JPEG";
  std::vector<uint8_t> junk(777, 0x5a);
  gg::test::write_bytes(bad, junk);
  const auto src = read_imagenet(d.path.string(), true);
  LoaderOptions o = jpeg_options(true, 2);
  PrefetchLoader loader(*src, o, 0, 3);
  int64_t padded = 0;
  for (const Batch& b : drain(loader))
    for (size_t r = 0; r < b.y.size(); ++r) {
      if (b.y[r] >= 0) continue;
      ++padded;
      CHECK(src->name(b.ids[r]) == bad);
    }
  CHECK(padded == 3);  // once per epoch
  CHECK(loader.skipped() == 3);
}

TEST_CASE("loader batches do not depend on the worker count or prefetch depth",
          "[shuffle][loader]") {
  TempDir d;
  gg::test::make_imagenet(d.path.string(), 3, 5);
  const auto src = read_imagenet(d.path.string(), true);
  LoaderOptions a = jpeg_options(true, 1), b = jpeg_options(true, 4);
  b.prefetch = 1;
  PrefetchLoader la(*src, a, 1, 2), lb(*src, b, 1, 2);
  const std::vector<Batch> x = drain(la), y = drain(lb);
  REQUIRE(x.size() == y.size());
  for (size_t i = 0; i < x.size(); ++i) {
    CHECK(x[i].epoch == y[i].epoch);
    CHECK(x[i].x == y[i].x);
  }
  // Synthetic pixels go through the pixel path with several workers too.
  SyntheticSpec s = parse_synthetic("3x8x8:4:64");
  SyntheticSource syn(s);
  LoaderOptions p;
  p.batch = 8;
  p.augment.enabled = true;
  p.workers = 3;
  PrefetchLoader ls(syn, p, 0, 2);
  const std::vector<Batch> z = drain(ls);
  CHECK(z.size() == 16u);
  CHECK(ls.sample_shape() == std::array<int, 3>{3, 8, 8});
}
