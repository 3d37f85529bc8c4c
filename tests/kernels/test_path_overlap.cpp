#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <string>

#include "kernels/path_overlap.hpp"

using namespace gg::kernels;
namespace fs = std::filesystem;

namespace {

// A fresh folder under the system's temporary folder, removed at the end of the test.
struct Scratch {
  fs::path dir = fs::temp_directory_path() / ("gg-overlap-" + std::to_string(::getpid()));
  Scratch() {
    fs::remove_all(dir);
    fs::create_directories(dir / "ck" / "ckpt-1");
    std::ofstream(dir / "x.npy") << "x";
    std::ofstream(dir / "ck" / "model.npz") << "w";
  }
  ~Scratch() { fs::remove_all(dir); }
  std::string operator/(const std::string& name) const { return (dir / name).string(); }
};

}  // namespace

TEST_CASE("an output that is an input is found by inode: the same name, a symlink, a hard link") {
  Scratch s;
  fs::create_symlink(s / "x.npy", s / "link.npy");
  fs::create_hard_link(s / "x.npy", s / "hard.npy");
  for (const char* out : {"x.npy", "link.npy", "hard.npy"}) {
    const std::string why = output_overlap({"--output", s / out}, {"--input", s / "x.npy"});
    CHECK_THAT(why, Catch::Contains("is the same file as --input"));
  }
  // Through a folder spelled another way.
  CHECK_FALSE(output_overlap({"--output", s / "ck/../x.npy"}, {"--input", s / "x.npy"}).empty());
  CHECK(output_overlap({"--output", s / "y.npy"}, {"--input", s / "x.npy"}).empty());
}

TEST_CASE("an output inside an input folder is found, also through a symlink to the folder") {
  Scratch s;
  fs::create_directory_symlink(s / "ck", s / "ck-link");
  CHECK_THAT(output_overlap({"--output", s / "ck/meta.json"}, {"--checkpoint", s / "ck"}),
             Catch::Contains("lies inside --checkpoint"));
  CHECK_THAT(
      output_overlap({"--output", s / "ck/ckpt-1/new/w.npz"}, {"--checkpoint", s / "ck-link"}),
      Catch::Contains("lies inside"));
  CHECK_THAT(output_overlap({"--output", s / "ck"}, {"--input", s / "ck-link/"}),
             Catch::Contains("is the same folder"));
  CHECK(output_overlap({"--output", s / "ck2/w.npz"}, {"--checkpoint", s / "ck"}).empty());
  CHECK(output_overlap({"--output", s / "w.npz"}, {"--checkpoint", s / "ck"}).empty());
  CHECK(lies_inside(s / "ck/model.npz", s / "ck"));
  CHECK_FALSE(lies_inside(s / "ck", s / "ck"));
  CHECK_FALSE(lies_inside(s / "ckx/model.npz", s / "ck"));
}

TEST_CASE("paths that do not exist yet are compared by their resolved names") {
  Scratch s;
  CHECK_THAT(
      output_overlap({"log.metrics", s / "new/m.jsonl"}, {"log.timeline", s / "new/./m.jsonl"}),
      Catch::Contains("log.metrics = "));
  CHECK(output_overlap({"log.metrics", s / "new/m.jsonl"}, {"log.timeline", s / "new/t.json"})
            .empty());
  CHECK(output_overlap({"log.metrics", ""}, {"log.timeline", s / "x.npy"}).empty());
}
