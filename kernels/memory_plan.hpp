// Compile-time placement of buffers with known lifetimes in one arena: buffers whose lifetimes
// overlap get disjoint bytes, the others may share. Executors plan activations and gradients with
// it once, so that a step allocates nothing and its peak memory follows what is live at once.
#pragma once

#include <cstddef>
#include <vector>

namespace gg::kernels {

// A buffer of `bytes` used at step positions first..last (inclusive). A buffer with bytes == 0
// or first > last is unused and gets no space.
struct Lifetime {
  size_t bytes = 0;
  int first = 0;
  int last = -1;
  bool used() const { return bytes > 0 && first <= last; }
};

struct MemoryPlan {
  std::vector<size_t> offsets;  // one per lifetime, multiples of `align`
  size_t total = 0;             // arena bytes
};

// Greedy by size: largest buffers first, each at the lowest offset free during its lifetime.
MemoryPlan plan_memory(const std::vector<Lifetime>& buffers, size_t align = 64);

}  // namespace gg::kernels
