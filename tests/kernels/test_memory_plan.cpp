// Tests for the compile-time memory plan: overlapping lifetimes never share bytes, disjoint ones
// do, and the arena is no larger than it must be on simple cases.
#include <catch2/catch.hpp>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/memory_plan.hpp"

using namespace gg::kernels;

namespace {
bool overlap_in_time(const Lifetime& a, const Lifetime& b) {
  return a.first <= b.last && b.first <= a.last;
}
bool overlap_in_space(size_t a, size_t an, size_t b, size_t bn) { return a < b + bn && b < a + an; }
}  // namespace

TEST_CASE("memory plan: buffers live at once never share bytes, random lifetimes", "[plan]") {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<Lifetime> life(40);
    for (Lifetime& t : life) {
      t.bytes = 1 + rng() % 5000;
      t.first = static_cast<int>(rng() % 30);
      t.last = t.first + static_cast<int>(rng() % 10);
    }
    const MemoryPlan p = plan_memory(life);
    size_t peak_live = 0;
    for (int pos = 0; pos < 40; ++pos) {
      size_t live = 0;
      for (const Lifetime& t : life) live += t.first <= pos && pos <= t.last ? t.bytes : 0;
      peak_live = std::max(peak_live, live);
    }
    CHECK(p.total >= peak_live);
    for (size_t i = 0; i < life.size(); ++i) {
      CHECK(p.offsets[i] % 64 == 0);
      CHECK(p.offsets[i] + life[i].bytes <= p.total);
      for (size_t j = i + 1; j < life.size(); ++j)
        if (overlap_in_time(life[i], life[j]))
          CHECK_FALSE(overlap_in_space(p.offsets[i], life[i].bytes, p.offsets[j], life[j].bytes));
    }
  }
}

TEST_CASE("memory plan: a chain of buffers that never overlap in time fits in the largest",
          "[plan]") {
  // Like the gradients of a plain chain of layers: each lives from its consumer to its producer.
  const std::vector<Lifetime> life{{1000, 0, 1}, {4000, 2, 3}, {2000, 4, 5}, {640, 6, 7}};
  const MemoryPlan p = plan_memory(life);
  CHECK(p.total == 4032);  // 4000 rounded up to 64
  for (size_t o : p.offsets) CHECK(o == 0);
}

TEST_CASE("memory plan: unused buffers take no space", "[plan]") {
  const std::vector<Lifetime> life{{1000, 0, 5}, {0, 0, 5}, {5000, 3, 2}};
  const MemoryPlan p = plan_memory(life);
  CHECK(p.total == 1024);
}
