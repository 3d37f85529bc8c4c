// The bucket layout the MPI exchange tests share: buckets of uneven sizes growing from 1 (so some
// are smaller than a node's rank count), the last element of the buffer in bucket 0, as backward
// makes them.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/graph.hpp"

namespace gg::test {

inline std::vector<kernels::Bucket> make_layout(int64_t count) {
  std::vector<kernels::Bucket> b;
  int64_t end = count, size = 1;
  while (end > 0) {
    const int64_t begin = std::max<int64_t>(0, end - size);
    b.push_back({begin, end});
    end = begin;
    size = size * 3 + 5;
  }
  return b;
}

}  // namespace gg::test
