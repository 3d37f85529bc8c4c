// libFuzzer target: the tar shard index (list_tar) must reject a damaged archive with
// std::runtime_error, never crash or report a member outside the file.
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>

#include "shuffle/tar.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("gg-fuzz-tar-" + std::to_string(::getpid()));
  {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  try {
    for (const gg::shuffle::TarMember& m : gg::shuffle::list_tar(path.string()))
      if (m.offset < 0 || m.size < 0 || m.offset + m.size > static_cast<int64_t>(size))
        __builtin_trap();
  } catch (const std::runtime_error&) {
  }
  return 0;
}
