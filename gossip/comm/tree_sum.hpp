// Sums over ranks held in one process, in the order MPICH's allreduce adds them, so that virtual
// ranks (gossip/train/virtual.hpp) reach a real run's bits.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace gg::gossip {

// The sum over ranks in the order of MPICH's allreduce for a commutative operation (recursive
// doubling, and its reduce-scatter + allgather for long vectors, add in the same tree): ranks
// beyond the largest power of two below p are first folded into their even neighbours, then
// partners 1, 2, 4, ... apart are added pairwise. x[r] holds rank r's n values; the total goes
// into `out` (n values; it may be one of the x[r]: each chunk is read whole before it is
// written). The tree is walked depth first, a chunk of values at a time, so that only one partial
// sum per level of one chunk is held: memory of log2(p) chunks, not of p copies.
template <typename T>
class TreeSum {
 public:
  static constexpr size_t kChunk = 4096;
  explicit TreeSum(int p) : p_(p) {
    while (pof2_ * 2 <= p_) {
      pof2_ *= 2;
      ++levels_;
    }
    rem_ = p_ - pof2_;
    scratch_.assign(static_cast<size_t>(levels_ + 1) * kChunk, T{});
  }
  void sum(const std::vector<const T*>& x, size_t n, T* out) {
    for (size_t off = 0; off < n; off += kChunk) {
      const size_t len = std::min(kChunk, n - off);
      node(x, off, len, 0, pof2_, 0);
      std::copy(scratch_.begin(), scratch_.begin() + static_cast<std::ptrdiff_t>(len), out + off);
    }
  }
  // The scratch memory a sum over p ranks holds.
  static int64_t bytes(int p) {
    int levels = 0;
    for (int q = 1; q * 2 <= p; q *= 2) ++levels;
    return static_cast<int64_t>(levels + 1) * kChunk * static_cast<int64_t>(sizeof(T));
  }

 private:
  // Parts [k, k + width) summed into level `depth`'s chunk of scratch.
  void node(const std::vector<const T*>& x, size_t off, size_t len, int k, int width, int depth) {
    T* out = scratch_.data() + static_cast<size_t>(depth) * kChunk;
    if (width == 1) {
      // Part k: rank 2k + 1 with its even neighbour folded in (the first rem), else rank k + rem.
      if (k < rem_) {
        const T* a = x[static_cast<size_t>(2 * k)] + off;
        const T* b = x[static_cast<size_t>(2 * k + 1)] + off;
        for (size_t i = 0; i < len; ++i) out[i] = a[i] + b[i];
      } else {
        const T* a = x[static_cast<size_t>(k + rem_)] + off;
        std::copy(a, a + len, out);
      }
      return;
    }
    node(x, off, len, k, width / 2, depth);
    node(x, off, len, k + width / 2, width / 2, depth + 1);
    const T* right = scratch_.data() + static_cast<size_t>(depth + 1) * kChunk;
    for (size_t i = 0; i < len; ++i) out[i] = out[i] + right[i];
  }
  int p_, pof2_ = 1, levels_ = 0, rem_ = 0;
  std::vector<T> scratch_;
};

template <typename T>
void tree_sum(const std::vector<const T*>& x, size_t n, T* out) {
  TreeSum<T>(static_cast<int>(x.size())).sum(x, n, out);
}

// The sum over ranks of one number each, in MPICH's order (an allreduce of doubles); one value
// is returned as it is.
inline double tree_sum(const std::vector<double>& v) {
  std::vector<const double*> x;
  for (const double& d : v) x.push_back(&d);
  double out = 0;
  tree_sum(x, 1, &out);
  return out;
}

}  // namespace gg::gossip
