// write_file_durably: the file appears complete or not at all, a failure keeps the old content and
// leaves no temporary behind, and every failure is one message naming the file and the reason.
#include <sys/resource.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/durable_file.hpp"
#include "tests/kernels/scratch.hpp"

using gg::kernels::write_file_durably;
namespace fs = std::filesystem;

namespace {

fs::path scratch(const std::string& test) { return gg::test::scratch("gg_durable", test); }
using gg::test::slurp;

std::vector<std::string> names_in(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  return names;
}

// The message of the std::runtime_error `f` throws ("" when it throws nothing).
template <typename F>
std::string error_of(F f) {
  try {
    f();
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

// Limits the size of files this process may write (RLIMIT_FSIZE) while it lives, so that a write
// fails part-way with EFBIG (SIGXFSZ is ignored meanwhile) — even for root.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    ::getrlimit(RLIMIT_FSIZE, &old_);
    old_handler_ = std::signal(SIGXFSZ, SIG_IGN);
    rlimit lim = old_;
    lim.rlim_cur = bytes;
    ::setrlimit(RLIMIT_FSIZE, &lim);
  }
  ~FileSizeLimit() {
    ::setrlimit(RLIMIT_FSIZE, &old_);
    std::signal(SIGXFSZ, old_handler_);
  }
  FileSizeLimit(const FileSizeLimit&) = delete;
  FileSizeLimit& operator=(const FileSizeLimit&) = delete;

 private:
  rlimit old_{};
  void (*old_handler_)(int) = SIG_DFL;
};

}  // namespace

TEST_CASE("a durable write replaces the file with exactly the new bytes and leaves nothing else") {
  const fs::path dir = scratch("replace");
  const std::string path = (dir / "state.bin").string();
  write_file_durably(path, std::string("old content"));
  CHECK(slurp(path) == "old content");
  std::string bytes(100000, '\0');
  for (size_t k = 0; k < bytes.size(); ++k) bytes[k] = static_cast<char>(k * 7 + k / 251);
  write_file_durably(path, bytes.data(), bytes.size());
  CHECK(slurp(path) == bytes);
  write_file_durably(path, std::string());
  CHECK(fs::file_size(path) == 0);
  CHECK(names_in(dir) == std::vector<std::string>{"state.bin"});
  fs::remove_all(dir);
}

TEST_CASE("a durable write that fails part-way keeps the old content and removes its temporary") {
  const fs::path dir = scratch("partial");
  const std::string path = (dir / "weights.npz").string();
  write_file_durably(path, std::string("old content"));
  const std::string big(64 * 1024, 'x');
  std::string e;
  {
    const FileSizeLimit limit(4096);
    e = error_of([&] { write_file_durably(path, big); });
  }
  INFO(e);
  CHECK(e.find("cannot write " + path + ": ") == 0);
  CHECK(e.find("File too large") != std::string::npos);
  CHECK(slurp(path) == "old content");
  CHECK(names_in(dir) == std::vector<std::string>{"weights.npz"});
  // Without the limit the same write succeeds.
  write_file_durably(path, big);
  CHECK(slurp(path) == big);
  fs::remove_all(dir);
}

TEST_CASE("a durable write to a folder or into a missing folder is an error that changes nothing") {
  const fs::path dir = scratch("folder");
  fs::create_directories(dir / "sub");
  const std::string folder = (dir / "sub").string();
  CHECK(error_of([&] { write_file_durably(folder, std::string("x")); }) ==
        "cannot write " + folder + ": it is a folder");
  CHECK(fs::is_directory(folder));
  CHECK(fs::is_empty(folder));
  const std::string missing = (dir / "no/such/file.bin").string();
  CHECK(error_of([&] { write_file_durably(missing, std::string("x")); }) ==
        "cannot write " + missing + ": No such file or directory");
  CHECK(names_in(dir) == std::vector<std::string>{"sub"});
  fs::remove_all(dir);
}
