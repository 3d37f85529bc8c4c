// Unit tests for the checks made when the data is opened (issue 15): test images of another size
// than the training images, labels that would silently widen the model or fail only after
// training, and val_labels lines that name missing files. Each is one error naming the file.
#include <archive.h>
#include <archive_entry.h>

#include <array>
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "shuffle/loader.hpp"
#include "shuffle/source.hpp"
#include "shuffle/tar.hpp"
#include "tests/shuffle/data_fixture.hpp"

using Catch::Matchers::Contains;
using namespace gg::shuffle;
using gg::test::TempDir;

namespace {

void put_be32(std::vector<uint8_t>& out, uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<uint8_t>(v >> s));
}

// One split of an idx folder: `labels.size()` images of side x side pixels, int32 labels.
void write_idx_split(const std::string& dir, bool train, int side,
                     const std::vector<uint32_t>& labels) {
  const std::string split = train ? "train" : "t10k";
  const auto n = static_cast<uint32_t>(labels.size());
  std::vector<uint8_t> images = {0, 0, 0x08, 3}, lab = {0, 0, 0x0C, 1};
  for (uint32_t d : {n, static_cast<uint32_t>(side), static_cast<uint32_t>(side)})
    put_be32(images, d);
  images.resize(images.size() + static_cast<size_t>(n) * side * side, 7);
  put_be32(lab, n);
  for (uint32_t v : labels) put_be32(lab, v);
  gg::test::write_bytes(dir + "/" + split + "-images-idx3-ubyte", images);
  gg::test::write_bytes(dir + "/" + split + "-labels-idx1-ubyte", lab);
}

// Labels 0..classes-1, `per` of each.
std::vector<uint32_t> balanced(int classes, int per) {
  std::vector<uint32_t> v;
  for (int c = 0; c < classes; ++c) v.insert(v.end(), static_cast<size_t>(per), c);
  return v;
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  f << text;
}

std::string lines(int n) {
  std::string s;
  for (int i = 0; i < n; ++i) s += "class" + std::to_string(i) + "\n";
  return s;
}

// The message of the std::runtime_error that f throws; fails the test if it throws nothing.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  FAIL("expected a std::runtime_error");
  return {};
}

// A shard of samples `k<i>.jpg` + `k<i>.cls` holding the given class texts.
void write_shard(const std::string& path, const std::vector<std::string>& cls) {
  archive* a = archive_write_new();
  archive_write_set_format_pax_restricted(a);
  REQUIRE(archive_write_open_filename(a, path.c_str()) == ARCHIVE_OK);
  const std::vector<uint8_t> jpg = encode_jpeg(gg::test::fashion_rgb(1, 16, 16, 0));
  const auto member = [&](const std::string& name, const void* data, size_t size) {
    archive_entry* e = archive_entry_new();
    archive_entry_set_pathname(e, name.c_str());
    archive_entry_set_size(e, static_cast<la_int64_t>(size));
    archive_entry_set_filetype(e, AE_IFREG);
    archive_entry_set_perm(e, 0644);
    REQUIRE(archive_write_header(a, e) == ARCHIVE_OK);
    archive_write_data(a, data, size);
    archive_entry_free(e);
  };
  for (size_t i = 0; i < cls.size(); ++i) {
    const std::string key = std::string("k").append(std::to_string(i));
    member(key + ".jpg", jpg.data(), jpg.size());
    member(key + ".cls", cls[i].data(), cls[i].size());
  }
  archive_write_close(a);
  archive_write_free(a);
}

}  // namespace

TEST_CASE("idx test images of another size than the training images are refused naming both files",
          "[shuffle][source][idx]") {
  for (int side : {32, 14}) {
    TempDir d;
    write_idx_split(d.path.string(), true, 28, balanced(2, 3));
    write_idx_split(d.path.string(), false, side, balanced(2, 2));
    const std::string s = std::to_string(side);
    const std::string msg = error_of([&] { open_splits(parse_source("idx:" + (d / ""), "")); });
    CHECK_THAT(msg, Contains(d / "t10k-images-idx3-ubyte") && Contains("1x" + s + "x" + s) &&
                        Contains(d / "train-images-idx3-ubyte") && Contains("1x28x28"));
    CHECK(msg.find('\n') == std::string::npos);
  }
  TempDir ok;
  write_idx_split(ok.path.string(), true, 28, balanced(2, 3));
  write_idx_split(ok.path.string(), false, 28, balanced(2, 2));
  const DataSplits s = open_splits(parse_source("idx:" + ok.path.string(), ""));
  CHECK(s.eval->shape() == s.train->shape());
}

TEST_CASE("a stray training label does not widen the model unless classes.txt declares the classes",
          "[shuffle][source][idx]") {
  TempDir d;
  std::vector<uint32_t> labels = balanced(10, 5);
  labels[7] = 200;
  write_idx_split(d.path.string(), true, 4, labels);
  write_idx_split(d.path.string(), false, 4, balanced(10, 1));
  const SourceSpec spec = parse_source("idx:" + d.path.string(), "");
  const std::string msg = error_of([&] { open_splits(spec); });
  CHECK_THAT(msg, Contains(d / "train-labels-idx1-ubyte") && Contains("label 200 of sample 7") &&
                      Contains("classes.txt"));
  write_text(d / "classes.txt", lines(201));
  CHECK(open_splits(spec).train->classes() == 201);
  // A declared count also bounds the labels.
  write_text(d / "classes.txt", lines(100));
  CHECK_THAT(error_of([&] { open_splits(spec); }),
             Contains("label 200 of sample 7") && Contains("classes.txt lists 100 classes"));
  // Labels 1..26 (EMNIST letters: class 0 unused) are fine without a declaration.
  std::filesystem::remove(d / "classes.txt");
  std::vector<uint32_t> letters;
  for (uint32_t c = 1; c <= 26; ++c) letters.push_back(c);
  write_idx_split(d.path.string(), true, 4, letters);
  write_idx_split(d.path.string(), false, 4, {1, 26});
  CHECK(open_splits(spec).train->classes() == 27);
}

TEST_CASE("fashion-mnist declares 10 classes and refuses other labels naming the file",
          "[shuffle][source][idx]") {
  TempDir d;
  std::vector<uint32_t> labels = balanced(10, 2);
  labels[3] = 12;
  write_idx_split(d.path.string(), true, 4, labels);
  write_idx_split(d.path.string(), false, 4, balanced(10, 1));
  const SourceSpec spec = parse_source("fashion-mnist", d.path.string());
  CHECK(spec.classes == 10);
  CHECK_THAT(error_of([&] { open_splits(spec); }), Contains(d / "train-labels-idx1-ubyte") &&
                                                       Contains("label 12 of sample 3") &&
                                                       Contains("10 classes"));
  labels[3] = 3;
  write_idx_split(d.path.string(), true, 4, labels);
  CHECK(open_splits(spec).train->classes() == 10);
}

TEST_CASE("a test label outside the training classes is refused when the data is opened",
          "[shuffle][source][idx]") {
  TempDir d;
  write_idx_split(d.path.string(), true, 4, balanced(10, 2));
  std::vector<uint32_t> test = balanced(10, 1);
  test[7] = 255;
  write_idx_split(d.path.string(), false, 4, test);
  const std::string msg = error_of([&] { open_splits(parse_source("idx:" + (d / ""), "")); });
  CHECK_THAT(msg, Contains(d / "t10k-labels-idx1-ubyte") && Contains("label 255 of sample 7") &&
                      Contains("10 training classes"));
}

TEST_CASE("an absurd label is an error naming it before any class-sized allocation",
          "[shuffle][source][idx][tar]") {
  TempDir d;
  std::vector<uint32_t> labels = balanced(2, 2);
  labels[1] = 50'000'000;
  write_idx_split(d.path.string(), true, 4, labels);
  write_idx_split(d.path.string(), false, 4, balanced(2, 1));
  CHECK_THAT(error_of([&] { open_splits(parse_source("idx:" + (d / ""), "")); }),
             Contains("label 50000000 of sample 1"));
  labels[1] = 0x7fffffff;  // max label + 1 would overflow int32
  write_idx_split(d.path.string(), true, 4, labels);
  CHECK_THAT(error_of([&] { open_splits(parse_source("idx:" + (d / ""), "")); }),
             Contains("label 2147483647"));

  TempDir s;
  write_shard(s / "shard-000000.tar", {"0", "50000000", "1"});
  CHECK_THAT(error_of([&] { ShardSource src(s.path.string()); }),
             Contains("shard-000000.tar") && Contains("'k1'") && Contains("50000000"));
}

TEST_CASE("shard labels must lie within classes.txt, or be dense enough without it",
          "[shuffle][source][tar]") {
  TempDir s;
  std::filesystem::create_directories(s / "train");
  write_shard(s / "train/shard-000000.tar", {"0", "1", "5"});
  write_text(s / "classes.txt", lines(3));
  CHECK_THAT(error_of([&] { open_splits(parse_source("shards:" + (s / ""), "")); }),
             Contains("shard-000000.tar") && Contains("'k2'") && Contains("class 5") &&
                 Contains("classes.txt lists 3"));
  std::filesystem::remove(s / "classes.txt");
  write_shard(s / "train/shard-000000.tar", {"0", "1", "90"});
  CHECK_THAT(error_of([&] { open_splits(parse_source("shards:" + (s / ""), "")); }),
             Contains("3 of the 91 classes") && Contains("classes.txt"));
  write_text(s / "classes.txt", lines(91));
  CHECK(open_splits(parse_source("shards:" + (s / ""), "")).train->classes() == 91);

  // Validation shards with a label the training shards do not have.
  std::filesystem::create_directories(s / "val");
  write_shard(s / "val/shard-000000.tar", {"0", "95"});
  std::filesystem::remove(s / "classes.txt");
  write_shard(s / "train/shard-000000.tar", {"0", "1", "2"});
  CHECK_THAT(error_of([&] { open_splits(parse_source("shards:" + (s / ""), "")); }),
             Contains("val/shard-000000.tar:k1") && Contains("label 95") &&
                 Contains("3 training classes"));
}

TEST_CASE("val_labels lines must name files of val/ once, and a labels file needs a flat val/",
          "[shuffle][source]") {
  TempDir flat;
  gg::test::make_imagenet(flat.path.string(), 3, 2, 0);
  gg::test::write_bytes(flat / "val/a.JPEG", encode_jpeg(gg::test::fashion_rgb(1, 30, 30, 0)));
  gg::test::write_bytes(flat / "val/b.JPEG", encode_jpeg(gg::test::fashion_rgb(2, 30, 30, 0)));
  write_text(flat / "val_labels.txt", "a.JPEG n00000015\nb.JPEG 1\nmissing.JPEG 0\n");
  CHECK_THAT(error_of([&] { read_imagenet(flat.path.string(), false); }),
             Contains("val_labels.txt:3") && Contains("missing.JPEG"));
  write_text(flat / "val_labels.txt", "a.JPEG n00000015\nb.JPEG 1\n# a comment\na.JPEG 2\n");
  CHECK_THAT(error_of([&] { read_imagenet(flat.path.string(), false); }),
             Contains("val_labels.txt:4") && Contains("line 1"));
  write_text(flat / "val_labels.txt", "a.JPEG n00000015\nb.JPEG 1\n");
  CHECK(read_imagenet(flat.path.string(), false)->size() == 2);

  // val/ with class folders and an explicit labels file: the file would be ignored.
  TempDir folders;
  gg::test::make_imagenet(folders.path.string(), 2, 2, 1);
  write_text(folders / "labels.txt", "x.JPEG 0\n");
  CHECK_THAT(error_of([&] { read_imagenet(folders.path.string(), false, folders / "labels.txt"); }),
             Contains("labels.txt") && Contains("class folders"));
}

TEST_CASE("a shard with two image or two .cls members under one key is refused naming both",
          "[shuffle][tar]") {
  TempDir s;
  write_shard(s / "shard-000000.tar", {"0", "1"});
  CHECK(ShardSource(s.path.string()).size() == 2);
  // Append k0.jpeg: a second image for key k0 (one of them used to be dropped silently).
  archive* a = archive_write_new();
  archive_write_set_format_pax_restricted(a);
  REQUIRE(archive_write_open_filename(a, (s / "shard-000001.tar").c_str()) == ARCHIVE_OK);
  for (const char* name : {"k0.jpg", "k0.jpeg", "k0.cls"}) {
    const std::string data = name[3] == 'c' ? "0" : "x";
    archive_entry* e = archive_entry_new();
    archive_entry_set_pathname(e, name);
    archive_entry_set_size(e, static_cast<la_int64_t>(data.size()));
    archive_entry_set_filetype(e, AE_IFREG);
    archive_entry_set_perm(e, 0644);
    REQUIRE(archive_write_header(a, e) == ARCHIVE_OK);
    archive_write_data(a, data.data(), data.size());
    archive_entry_free(e);
  }
  archive_write_close(a);
  archive_write_free(a);
  CHECK_THAT(error_of([&] { ShardSource src(s.path.string()); }),
             Contains("shard-000001.tar") && Contains("'k0'") && Contains("k0.jpg") &&
                 Contains("k0.jpeg"));
}

TEST_CASE("pack refuses two files that would be stored under one member name", "[shuffle][tar]") {
  TempDir d;
  gg::test::make_imagenet(d / "in", 2, 2);
  const std::string a = d / "in/train/n00000001/photo.a.JPEG",
                    b = d / "in/train/n00000001/photo_a.jpg";
  gg::test::write_bytes(a, encode_jpeg(gg::test::fashion_rgb(1, 20, 20, 0)));
  gg::test::write_bytes(b, encode_jpeg(gg::test::fashion_rgb(2, 20, 20, 0)));
  PackOptions o;
  o.input = d / "in";
  o.output = d / "out";
  CHECK_THAT(error_of([&] { pack(o, {}); }),
             Contains(a) && Contains(b) && Contains("n00000001/photo_a.jpg"));
  std::filesystem::remove(b);
  CHECK(pack(o, {}).images == 5);
}

TEST_CASE("an idx header whose C x H x W wraps around 64 bits is refused, not read as 4 bytes",
          "[shuffle][idx]") {
  TempDir d;
  std::vector<uint8_t> images = {0, 0, 0x08, 4};  // idx4: 1 x 2^22 x 2^22 x 2^22 = 2^66 bytes
  for (uint32_t v : {1u, 1u << 22, 1u << 22, 1u << 22}) put_be32(images, v);
  images.insert(images.end(), {1, 2, 3, 4});
  std::vector<uint8_t> labels = {0, 0, 0x08, 1};
  put_be32(labels, 1);
  labels.push_back(0);
  gg::test::write_bytes(d / "img", images);
  gg::test::write_bytes(d / "lab", labels);
  CHECK_THAT(error_of([&] { read_idx(d / "img", d / "lab"); }),
             Contains(d / "img") && Contains("implausible image shape"));
}

namespace {

// A pixel source whose storage holds fewer bytes than its shape says.
class ShortSource : public SampleSource {
 public:
  int64_t size() const override { return 8; }
  int classes() const override { return 2; }
  int32_t label(int64_t id) const override { return static_cast<int32_t>(id % 2); }
  Encoding encoding() const override { return Encoding::Pixels; }
  std::array<int, 3> shape() const override { return {3, 64, 64}; }
  void read(int64_t, std::vector<uint8_t>& out) const override { out.assign(5, 1); }
  std::string name(int64_t id) const override { return "short#" + std::to_string(id); }
  std::string describe() const override { return "short"; }
};

}  // namespace

TEST_CASE("a pixel sample shorter than its shape is an error, not a read past its buffer",
          "[shuffle][loader]") {
  ShortSource src;
  LoaderOptions o;
  o.batch = 4;
  PrefetchLoader loader(src, o, 0, 1);
  Batch b;
  CHECK_THAT(error_of([&] { loader.next(b); }), Contains("short#") && Contains("3x64x64"));
}

TEST_CASE("a tar member declaring nearly 2^63 bytes is refused without overflowing the size check",
          "[shuffle][tar]") {
  // One ustar header whose size field holds 2^63 - 100 in base-256 form, then the end blocks.
  std::vector<uint8_t> tar(512 + 1024, 0);
  const auto put = [&](size_t at, const std::string& s) {
    std::copy(s.begin(), s.end(), &tar[at]);
  };
  put(0, "a.jpg");
  put(100, "0000644");
  put(108, "0000000");
  put(116, "0000000");
  put(136, "00000000000");
  put(156, "0");
  put(257, "ustar");
  put(263, "00");
  tar[124] = 0x80;
  const uint64_t size = (uint64_t{1} << 63) - 100;
  for (int i = 0; i < 8; ++i) tar[135 - i] = static_cast<uint8_t>(size >> (8 * i));
  put(148, "        ");
  unsigned sum = 0;
  for (size_t i = 0; i < 512; ++i) sum += tar[i];
  char field[8];
  std::snprintf(field, sizeof field, "%06o", sum);
  put(148, field);
  TempDir d;
  gg::test::write_bytes(d / "huge.tar", tar);
  CHECK_THAT(error_of([&] { list_tar(d / "huge.tar"); }),
             Contains("declares " + std::to_string(size) + " bytes"));
}
