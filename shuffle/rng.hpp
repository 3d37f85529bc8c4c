// Reproducible random numbers for the shuffle module: stream seeds hashed from integer keys and
// unbiased bounded draws that do not depend on the standard library's distribution implementations.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <random>

namespace gg::shuffle {

// SplitMix64 finaliser (Steele et al.): a bijective 64-bit mix, so distinct inputs never collide.
inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Hashes an ordered list of keys into one seed; chaining through splitmix64 makes (a, b) and (b, a)
// give different streams. Callers pass a distinct leading tag per purpose so that, e.g., the
// permutation stream of epoch 3 never equals the augmentation stream of batch 3.
inline uint64_t stream_seed(std::initializer_list<uint64_t> keys) {
  uint64_t h = 0x6a09e667f3bcc909ULL;
  for (uint64_t k : keys) h = splitmix64(h ^ splitmix64(k));
  return h;
}

// Uniform integer in [0, bound) by Lemire's multiply-and-reject method.
// std::uniform_int_distribution is not specified bit-for-bit, so libstdc++ and libc++ would shuffle
// differently; this is. bound must be > 0.
inline uint64_t uniform_below(std::mt19937_64& rng, uint64_t bound) {
  __extension__ typedef unsigned __int128 u128;  // __extension__: stays quiet under -Wpedantic
  u128 m = static_cast<u128>(rng()) * bound;
  uint64_t low = static_cast<uint64_t>(m);
  if (low < bound) {
    const uint64_t threshold = (0 - bound) % bound;
    while (low < threshold) {
      m = static_cast<u128>(rng()) * bound;
      low = static_cast<uint64_t>(m);
    }
  }
  return static_cast<uint64_t>(m >> 64);
}

}  // namespace gg::shuffle
