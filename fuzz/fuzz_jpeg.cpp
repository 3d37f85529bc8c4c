// libFuzzer target: the loader's JPEG path (decode_to_chw: header and size limits, DCT-scaled
// decode, crop and resample) must refuse bad input with a reason, never crash, read out of bounds
// or write a non-finite value. One decoder serves every input, as in a loader worker, so a failure
// must leave it ready for the next file.
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "shuffle/image.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static gg::shuffle::JpegDecoder decoder;
  static gg::shuffle::Image scratch;
  // The options vary with the input's length, so that every seed stays a valid JPEG.
  gg::shuffle::JpegOptions j;
  j.channels = size % 2 == 0 ? 3 : 1;
  j.crop = 8 + static_cast<int>(size % 3) * 8;
  j.resize = j.crop + static_cast<int>(size % 5) * 4;
  const bool augment = size % 4 < 2, may_flip = size % 7 < 4;
  std::mt19937_64 rng(size);
  const size_t n = static_cast<size_t>(j.channels) * j.crop * j.crop;
  std::vector<float> out(n, -7.f);
  std::string error;
  if (gg::shuffle::decode_to_chw(decoder, data, size, j, augment, may_flip, rng, scratch,
                                 out.data(), &error)) {
    for (float v : out)
      if (!std::isfinite(v) || v == -7.f) __builtin_trap();  // every value written, and finite
  } else {
    if (error.empty()) __builtin_trap();  // a refusal says why
    for (float v : out)
      if (v != -7.f) __builtin_trap();  // and writes nothing
  }
  return 0;
}
