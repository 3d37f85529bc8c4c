// Which layers the CUDA executor runs fused, and who writes each gradient first in backward. Plain
// C++ over the graph (no CUDA), so that the host tests check the plan on the models' graphs
// (tests/kernels/test_fusion_plan.cpp) where no GPU is at hand.
#pragma once

#include <vector>

#include "kernels/graph.hpp"

namespace gg::kernels::cuda {

// A batch norm fused with the ReLU that reads it, through a residual add or not. Forward, the
// batch norm's node computes the statistics and the ReLU's node y = relu(bn(x) [+ res]) in one
// pass; backward, the ReLU's node runs the batch norm's backward on the ReLU's gated gradient and
// hands the residual its gradient. The batch norm's and the add's outputs and gradients are never
// formed (absorbed).
struct BnFusion {
  int bn = -1, add = -1, relu = -1;
  int res = -1;                         // the add's other input (-1: no add)
  bool acc_x = false, acc_res = false;  // whether another reader wrote those gradients first
};

struct FusionPlan {
  std::vector<BnFusion> groups;
  std::vector<int> group_of;  // per node: the group it belongs to, or -1
  // Per node and input: whether its backward adds into that input's gradient because another
  // reader wrote it first (backward visits nodes last to first; a group writes at its ReLU). The
  // network input (node 0) gets no gradient: false.
  std::vector<std::vector<bool>> acc;

  // A group's batch norm or add.
  bool absorbed(int id) const {
    const int f = group_of[static_cast<size_t>(id)];
    return f >= 0 && groups[static_cast<size_t>(f)].relu != id;
  }
};

// The groups (none when fuse is false: every layer alone) and the first writers. A batch norm
// joins a group when it is read only by a ReLU, or only by an add read only by a ReLU, none of
// them the graph's output.
FusionPlan plan_fusion(const Graph& g, bool fuse);

}  // namespace gg::kernels::cuda
