// libFuzzer target: the .npz and .npy readers must reject a damaged file with an NpyError, never
// crash or allocate by a corrupt size; arrays they return fill their shapes and survive a round
// trip through write_npz.
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "kernels/npz.hpp"

namespace {

bool well_formed(const gg::kernels::NpyArray& a) {
  return static_cast<uint64_t>(a.size()) == (a.is_float() ? a.f.size() : a.i.size());
}

bool same(const gg::kernels::NpzEntries& x, const gg::kernels::NpzEntries& y) {
  if (x.size() != y.size()) return false;
  for (size_t k = 0; k < x.size(); ++k) {
    const auto &a = x[k].second, &b = y[k].second;
    if (x[k].first != y[k].first || a.shape != b.shape || a.i != b.i || a.f.size() != b.f.size() ||
        std::memcmp(a.f.data(), b.f.data(), a.f.size() * sizeof(float)) != 0)
      return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace fs = std::filesystem;
  using namespace gg::kernels;
  static const fs::path dir =
      fs::temp_directory_path() / ("gg-fuzz-npz-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string in = (dir / "in").string(), out = (dir / "out.npz").string();
  {
    std::ofstream f(in, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  try {
    if (!well_formed(read_npy(in))) __builtin_trap();
  } catch (const NpyError&) {
  }
  NpzEntries arrays;
  try {
    arrays = read_npz(in);
  } catch (const NpyError&) {
    return 0;
  }
  for (const auto& [name, a] : arrays) {
    if (!well_formed(a)) __builtin_trap();
    if (name.empty() || name.size() > 60000) return 0;  // write_npz refuses these names
  }
  write_npz(out, arrays);
  if (!same(read_npz(out), arrays)) __builtin_trap();
  return 0;
}
