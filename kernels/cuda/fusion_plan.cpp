#include "kernels/cuda/fusion_plan.hpp"

namespace gg::kernels::cuda {
namespace {

// The node that reads t, when t has exactly one reader and is not the output; else -1.
int sole_reader(const Graph& g, const std::vector<int>& readers, int t) {
  if (readers[static_cast<size_t>(t)] != 1 || t == g.output()) return -1;
  for (size_t id = static_cast<size_t>(t) + 1; id < g.nodes().size(); ++id)
    for (int in : g.nodes()[id].inputs)
      if (in == t) return static_cast<int>(id);
  return -1;
}

}  // namespace

FusionPlan plan_fusion(const Graph& g, bool fuse) {
  const auto& nodes = g.nodes();
  FusionPlan p;
  p.group_of.assign(nodes.size(), -1);
  std::vector<int> readers(nodes.size(), 0);
  for (const Node& n : nodes)
    for (int in : n.inputs) readers[static_cast<size_t>(in)]++;
  for (size_t id = 0; fuse && id < nodes.size(); ++id) {
    if (nodes[id].op != Op::BatchNorm) continue;
    BnFusion f;
    f.bn = static_cast<int>(id);
    const int r = sole_reader(g, readers, f.bn);
    if (r < 0 || p.group_of[static_cast<size_t>(r)] >= 0) continue;
    if (nodes[static_cast<size_t>(r)].op == Op::Relu) {
      f.relu = r;
    } else if (nodes[static_cast<size_t>(r)].op == Op::Add) {
      const int relu = sole_reader(g, readers, r);
      if (relu < 0 || nodes[static_cast<size_t>(relu)].op != Op::Relu ||
          p.group_of[static_cast<size_t>(relu)] >= 0)
        continue;
      f.add = r;
      f.relu = relu;
      const auto& in = nodes[static_cast<size_t>(r)].inputs;
      f.res = in[0] == f.bn ? in[1] : in[0];
    } else {
      continue;
    }
    for (int member : {f.bn, f.add, f.relu})
      if (member >= 0) p.group_of[static_cast<size_t>(member)] = static_cast<int>(p.groups.size());
    p.groups.push_back(f);
  }
  // First writers: the loss writes the output's gradient before any node.
  std::vector<bool> written(nodes.size(), false);
  written[static_cast<size_t>(g.output())] = true;
  auto first_write = [&](int t) {
    const bool was = written[static_cast<size_t>(t)];
    written[static_cast<size_t>(t)] = true;
    return was;
  };
  p.acc.resize(nodes.size());
  for (int id = static_cast<int>(nodes.size()) - 1; id >= 0; --id) {
    const Node& n = nodes[static_cast<size_t>(id)];
    p.acc[static_cast<size_t>(id)].assign(n.inputs.size(), false);
    if (const int gi = p.group_of[static_cast<size_t>(id)]; gi >= 0) {
      BnFusion& f = p.groups[static_cast<size_t>(gi)];
      if (id != f.relu) continue;  // the group writes at its ReLU
      const int x = nodes[static_cast<size_t>(f.bn)].inputs[0];
      if (x != 0) f.acc_x = first_write(x);
      if (f.res > 0) f.acc_res = first_write(f.res);
      continue;
    }
    for (size_t i = 0; i < n.inputs.size(); ++i)
      if (n.inputs[i] != 0) p.acc[static_cast<size_t>(id)][i] = first_write(n.inputs[i]);
  }
  return p;
}

}  // namespace gg::kernels::cuda
