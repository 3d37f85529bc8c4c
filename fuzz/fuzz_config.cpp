// libFuzzer target: the config reader (`gossipgrad train --config FILE`, INI) must reject any
// input with a UsageError (one line), never crash, hang or let another exception escape; a
// config it accepts must come back unchanged through to_ini (the text checkpoints record).
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gossip/config/config.hpp"

namespace {

gg::gossip::Config parse(const std::string& path) {
  // The config alone: whether this machine can run it (gossip/train/preflight) is not asked.
  return gg::gossip::parse_train_args({"--config", path});
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("gg-fuzz-config-" + std::to_string(::getpid()));
  static const std::string path = (std::filesystem::create_directories(dir), dir / "c.ini");
  {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  gg::gossip::Config c;
  try {
    c = parse(path);
  } catch (const gg::gossip::UsageError& e) {
    const std::string what = e.what();
    if (what.empty() || what.find('\n') != std::string::npos) __builtin_trap();  // one line
    return 0;
  }
  const std::string ini = gg::gossip::to_ini(c);
  {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f << ini;
  }
  if (gg::gossip::to_ini(parse(path)) != ini) __builtin_trap();
  return 0;
}
