// Tests for the CUDA executor's fusion plan (kernels/cuda/fusion_plan.hpp), plain C++ that runs
// here without a GPU: on ResNet-18, ResNet-50 and GoogLeNet, which batch norms join which ReLU
// and residual add, that nothing outside a group reads what the group never forms, and that every
// gradient has exactly one first writer, fused or not.
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "kernels/cuda/fusion_plan.hpp"
#include "kernels/graph.hpp"
#include "kernels/models.hpp"

using namespace gg::kernels;
using gg::kernels::cuda::FusionPlan;
using gg::kernels::cuda::plan_fusion;

namespace {

Graph model(const std::string& name, int res = 64) {
  ModelSpec spec;
  spec.name = name;
  spec.input = {3, res, res};
  spec.classes = 10;
  return build_model(spec);
}

int count(const Graph& g, Op op) {
  int n = 0;
  for (const Node& x : g.nodes()) n += x.op == op;
  return n;
}

// Every value but the input and the output has one first writer among its readers' backward
// writes (a group's at its ReLU), every other write adds; the output's writes all add.
void check_writers(const Graph& g, const FusionPlan& p) {
  const auto& nodes = g.nodes();
  std::vector<int> first(nodes.size(), 0), readers(nodes.size(), 0);
  for (size_t id = 0; id < nodes.size(); ++id) {
    const int gi = p.group_of[id];
    if (gi >= 0) {
      const auto& f = p.groups[static_cast<size_t>(gi)];
      if (static_cast<int>(id) != f.relu) continue;
      const int x = nodes[static_cast<size_t>(f.bn)].inputs[0];
      if (x != 0) readers[static_cast<size_t>(x)]++, first[static_cast<size_t>(x)] += !f.acc_x;
      if (f.res > 0)
        readers[static_cast<size_t>(f.res)]++, first[static_cast<size_t>(f.res)] += !f.acc_res;
      continue;
    }
    for (size_t i = 0; i < nodes[id].inputs.size(); ++i) {
      const int t = nodes[id].inputs[i];
      if (t == 0) continue;
      readers[static_cast<size_t>(t)]++;
      first[static_cast<size_t>(t)] += !p.acc[id][i];
    }
  }
  for (size_t t = 1; t < nodes.size(); ++t) {
    if (readers[t] == 0 || p.absorbed(static_cast<int>(t))) continue;
    INFO(nodes[t].name << " (" << readers[t] << " readers)");
    CHECK(first[t] == (static_cast<int>(t) == g.output() ? 0 : 1));
  }
}

// Nothing outside a group reads a value the group never forms.
void check_absorbed_unread(const Graph& g, const FusionPlan& p) {
  const auto& nodes = g.nodes();
  for (size_t id = 0; id < nodes.size(); ++id)
    for (int in : nodes[id].inputs)
      if (p.absorbed(in)) {
        INFO(nodes[id].name << " reads " << nodes[static_cast<size_t>(in)].name);
        CHECK(p.group_of[id] == p.group_of[static_cast<size_t>(in)]);
      }
  for (size_t id = 0; id < nodes.size(); ++id)
    if (p.absorbed(static_cast<int>(id))) CHECK(static_cast<int>(id) != g.output());
}

}  // namespace

TEST_CASE("ResNet-50's batch norms fuse with every ReLU and residual add that read them") {
  const Graph g = model("resnet50");
  const FusionPlan p = plan_fusion(g, true);
  // The stem, 16 bottlenecks of 3 batch norms each, 4 of them with a projection shortcut whose
  // batch norm stays alone (its add is fused with the block's last batch norm already).
  REQUIRE(count(g, Op::BatchNorm) == 53);
  CHECK(p.groups.size() == 49);
  int with_add = 0, projection = 0;
  for (const auto& f : p.groups) {
    CHECK(g.node(f.relu).op == Op::Relu);
    CHECK_FALSE(f.acc_x);  // a batch norm's input is a convolution it alone reads
    if (f.add < 0) continue;
    ++with_add;
    CHECK(g.node(f.add).op == Op::Add);
    // The shortcut's gradient is written first by the fused pass: a projection's batch norm
    // reads nothing else, an identity's block input is read later by the block's first conv.
    CHECK_FALSE(f.acc_res);
    projection += g.node(f.res).op == Op::BatchNorm;
  }
  CHECK(with_add == 16);
  CHECK(projection == 4);
  check_absorbed_unread(g, p);
  check_writers(g, p);
}

TEST_CASE("the plan on ResNet-18 and GoogLeNet, fused and not") {
  for (const std::string name : {"resnet18", "googlenet", "resnet8", "cnn"}) {
    SECTION(name) {
      const Graph g = name == "cnn" ? model(name, 28) : model(name);
      for (const bool fuse : {true, false}) {
        const FusionPlan p = plan_fusion(g, fuse);
        if (!fuse) {
          CHECK(p.groups.empty());
        } else if (name == "googlenet") {
          // Every convolution's batch norm feeds a ReLU alone (no residual adds).
          CHECK(static_cast<int>(p.groups.size()) == count(g, Op::BatchNorm));
          for (const auto& f : p.groups) CHECK(f.add < 0);
        } else if (name == "resnet18") {
          CHECK(static_cast<int>(p.groups.size()) == count(g, Op::BatchNorm) - 3);
        }
        check_absorbed_unread(g, p);
        check_writers(g, p);
      }
    }
  }
}

TEST_CASE("a batch norm read twice, or whose add is read twice, stays alone") {
  Graph g({2, 4, 4});
  const int bn = g.batch_norm("bn", g.conv("c", g.input(), {3, 3, 1, 1, false}));
  const int a = g.relu(bn), b = g.relu(bn);  // the batch norm has two readers
  const int bn3 = g.batch_norm("bn3", g.conv("c3", a, {3, 3, 1, 1, false}));
  const int s = g.add(bn3, b);
  const int r1 = g.relu(s), r2 = g.relu(s);  // the add has two readers
  const int bn4 = g.batch_norm("bn4", g.conv("c4", r1, {3, 3, 1, 1, false}));
  const int r3 = g.relu(bn4);
  g.set_output(g.fully_connected("fc", g.global_avg_pool(g.add(r3, r2)), {4, true}));
  const FusionPlan p = plan_fusion(g, true);
  REQUIRE(p.groups.size() == 1);
  CHECK(p.groups[0].bn == bn4);
  CHECK(p.groups[0].relu == r3);
  for (int alone : {bn, bn3, s}) CHECK(p.group_of[static_cast<size_t>(alone)] == -1);
  check_absorbed_unread(g, p);
  check_writers(g, p);
}

TEST_CASE("a residual that is the batch norm's own input gets both gradients from the fused pass") {
  Graph g({2, 4, 4});
  const int c = g.conv("c", g.input(), {3, 3, 1, 1, false});
  const int bn = g.batch_norm("bn", c);
  const int r = g.relu(g.add(bn, c));
  g.set_output(g.fully_connected("fc", g.global_avg_pool(r), {4, true}));
  const FusionPlan p = plan_fusion(g, true);
  REQUIRE(p.groups.size() == 1);
  const auto& f = p.groups[0];
  CHECK(f.res == c);
  // The fused pass writes c's gradient twice: dx first (the first write), then += the residual's.
  CHECK_FALSE(f.acc_x);
  CHECK(f.acc_res);
  check_absorbed_unread(g, p);
  check_writers(g, p);
}
