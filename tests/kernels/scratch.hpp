// Test helpers for files: a fresh scratch folder per test process and a whole file as bytes.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

namespace gg::test {

// A fresh folder per test process (ctest runs test cases in parallel processes).
inline std::filesystem::path scratch(const std::string& prefix, const std::string& test) {
  const std::filesystem::path p = std::filesystem::temp_directory_path() /
                                  (prefix + "_" + std::to_string(::getpid()) + "_" + test);
  std::filesystem::remove_all(p);
  std::filesystem::create_directories(p);
  return p;
}

inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), {});
}

}  // namespace gg::test
