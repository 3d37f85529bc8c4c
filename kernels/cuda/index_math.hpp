// Index arithmetic of the CUDA kernels, plain C++ as well so that the host tests check it
// (tests/kernels/test_index_math.cpp): division by a divisor fixed at launch, for the kernels that
// find an element's channel or image from its flat index (a multiply-high, an add and a shift
// instead of a divide, which CUDA emulates in dozens of instructions, 64-bit ones in about a
// hundred), and the walk of an NCHW tensor in 16-byte vectors.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#if defined(__CUDACC__)
#define GG_HD __host__ __device__ __forceinline__
#else
#define GG_HD inline
#endif

namespace gg::kernels::cuda {

// The largest dividend FastDiv takes: every flat index of a tensor the kernels walk stays below.
constexpr uint32_t kFastDivLimit = 0x7fffffffu;

// n / d for n in [0, 2^31) and d in [1, 2^31), by the round-up method of Granlund and Montgomery
// ("Division by invariant integers using multiplication", PLDI 1994): with s = ceil(log2 d) and
// m = floor(2^32 (2^s - d) / d) + 1 (which fits 32 bits), n / d = (mulhi(n, m) + n) >> s, and
// mulhi(n, m) + n < 2^32 because mulhi(n, m) <= n < 2^31.
struct FastDiv {
  uint32_t d = 1, m = 1, s = 0;

  FastDiv() = default;
  explicit FastDiv(int64_t divisor) {
    if (divisor < 1 || divisor > static_cast<int64_t>(kFastDivLimit))
      throw std::invalid_argument("FastDiv: divisor " + std::to_string(divisor) +
                                  " is outside [1, 2^31)");
    d = static_cast<uint32_t>(divisor);
    s = 0;
    while ((uint64_t{1} << s) < d) ++s;
    m = static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << s) - d)) / d + 1);
  }

  GG_HD uint32_t div(uint32_t n) const {
#if defined(__CUDA_ARCH__)
    const uint32_t t = __umulhi(n, m);
#else
    const uint32_t t = static_cast<uint32_t>((static_cast<uint64_t>(n) * m) >> 32);
#endif
    return (t + n) >> s;
  }
  GG_HD uint32_t mod(uint32_t n) const { return n - div(n) * d; }
};

// Refuses a tensor whose flat indices FastDiv cannot take, in one line that says what to lower.
inline void check_fast_div_range(int64_t elements, const char* what) {
  if (elements > static_cast<int64_t>(kFastDivLimit))
    throw std::length_error(std::string("CUDA backend: ") + what + " has " +
                            std::to_string(elements) +
                            " elements, more than the 2^31 - 1 its kernels index: lower "
                            "train.batch");
}

// An NCHW tensor {batch, c, plane} walked in vectors of `vec` values (16 bytes: 4 fp32 or 8 bf16;
// 1 where vec does not divide plane), so that a vector never spans two channels.
struct NchwWalk {
  FastDiv pv;  // vectors per plane
  FastDiv cd;  // channels
  uint32_t vec = 1, batch = 0;

  NchwWalk() = default;
  NchwWalk(int64_t batch_, int64_t c, int64_t plane, int vec_)
      : pv(plane / vec_),
        cd(c),
        vec(static_cast<uint32_t>(vec_)),
        batch(static_cast<uint32_t>(batch_)) {
    if (vec_ < 1 || plane % vec_ != 0)
      throw std::invalid_argument("NchwWalk: vec must divide plane");
    check_fast_div_range(batch_ * c * plane, "a tensor");
  }
  // Vectors in the whole tensor.
  GG_HD uint32_t vectors() const { return batch * cd.d * pv.d; }
  // The channel of vector j (its first value is j * vec), and of its lane e: the same.
  GG_HD uint32_t channel(uint32_t j) const { return cd.mod(pv.div(j)); }
  static constexpr uint32_t kLaneStep = 0;
  // The first value of the q-th vector of channel ch counted from image n0 on.
  GG_HD uint32_t at(uint32_t q, uint32_t ch, uint32_t n0) const {
    const uint32_t r = pv.div(q);
    return (((n0 + r) * cd.d + ch) * pv.d + (q - r * pv.d)) * vec;
  }
};

// A channels-last tensor {rows (batch * plane), c} walked in vectors of `vec` channels of one row
// (vec divides c).
struct RowWalk {
  FastDiv cv;  // channel vectors a row
  uint32_t rows = 0, vec = 1;

  RowWalk() = default;
  RowWalk(int64_t rows_, int64_t c, int vec_)
      : rows(static_cast<uint32_t>(rows_)), vec(static_cast<uint32_t>(vec_)) {
    if (vec_ < 1 || c % vec_ != 0) throw std::invalid_argument("RowWalk: vec must divide c");
    check_fast_div_range(rows_ * c, "a tensor");
    cv = FastDiv(c / vec_);
  }
  GG_HD uint32_t vectors() const { return rows * cv.d; }
  // The channel of vector j's first lane; lane e holds channel + e.
  GG_HD uint32_t channel(uint32_t j) const { return cv.mod(j) * vec; }
  static constexpr uint32_t kLaneStep = 1;
};

}  // namespace gg::kernels::cuda
