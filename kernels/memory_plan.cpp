#include "kernels/memory_plan.hpp"

#include <algorithm>
#include <numeric>
#include <utility>

namespace gg::kernels {

MemoryPlan plan_memory(const std::vector<Lifetime>& buffers, size_t align) {
  MemoryPlan plan;
  plan.offsets.assign(buffers.size(), 0);
  std::vector<size_t> order(buffers.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return buffers[a].bytes > buffers[b].bytes; });
  auto round_up = [align](size_t n) { return (n + align - 1) / align * align; };
  std::vector<size_t> placed;
  std::vector<std::pair<size_t, size_t>> busy;  // [begin, end) taken during a lifetime
  for (size_t i : order) {
    const Lifetime& t = buffers[i];
    if (!t.used()) continue;
    busy.clear();
    for (size_t j : placed) {
      const Lifetime& o = buffers[j];
      if (o.first <= t.last && t.first <= o.last)
        busy.emplace_back(plan.offsets[j], plan.offsets[j] + round_up(o.bytes));
    }
    std::sort(busy.begin(), busy.end());
    size_t at = 0;
    const size_t need = round_up(t.bytes);
    for (const auto& [b, e] : busy) {
      if (b >= at + need) break;
      at = std::max(at, e);
    }
    plan.offsets[i] = at;
    plan.total = std::max(plan.total, at + need);
    placed.push_back(i);
  }
  return plan;
}

}  // namespace gg::kernels
