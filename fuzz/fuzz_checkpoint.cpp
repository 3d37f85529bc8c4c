// libFuzzer target: the full-checkpoint readers (a rank state file and a manifest) must reject
// any input with an exception, never crash, hang or read out of bounds.
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>

#include "gossip/resilience/full_checkpoint.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const gg::gossip::RankState s = gg::gossip::decode_state(data, size, "fuzz");
    // What decodes must encode back to the same bytes.
    if (gg::gossip::encode_state(s) != std::vector<uint8_t>(data, data + size)) __builtin_trap();
  } catch (const std::runtime_error&) {
  }
  static const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("gg-fuzz-ckpt-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  {
    std::ofstream f(dir / gg::gossip::kManifest, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  (void)gg::gossip::verify_checkpoint(dir.string());  // reports, never throws
  return 0;
}
