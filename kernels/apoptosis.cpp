#include "kernels/apoptosis.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

namespace gg::kernels {
namespace {

// Ops that treat every channel on its own and keep channel indices (so a removed channel can be
// dropped from their output without touching the others).
bool per_channel(Op op) {
  return op == Op::BatchNorm || op == Op::Relu || op == Op::MaxPool || op == Op::AvgPool ||
         op == Op::GlobalAvgPool || op == Op::Dropout;
}

std::vector<std::vector<int>> readers(const Graph& g) {
  std::vector<std::vector<int>> r(g.nodes().size());
  for (size_t id = 0; id < g.nodes().size(); ++id)
    for (int in : g.nodes()[id].inputs) r[in].push_back(static_cast<int>(id));
  return r;
}

// Whether the outputs of `node` may be removed; fills the batch norms and consumers if so.
bool trace(const Graph& g, const std::vector<std::vector<int>>& rd, int node, PrunableLayer& out) {
  std::vector<int> frontier = {node};
  while (!frontier.empty()) {
    const int x = frontier.back();
    frontier.pop_back();
    if (x == g.output()) return false;
    for (int m : rd[x]) {
      const Op op = g.node(m).op;
      if (op == Op::Conv || op == Op::FullyConnected) {
        out.consumers.push_back(m);
      } else if (per_channel(op)) {
        if (op == Op::BatchNorm) out.batch_norms.push_back(m);
        frontier.push_back(m);
      } else {
        return false;  // add, concat, LRN: the channel is joined with or mixed into others
      }
    }
  }
  std::sort(out.consumers.begin(), out.consumers.end());
  std::sort(out.batch_norms.begin(), out.batch_norms.end());
  return !out.consumers.empty();
}

// Elements per unit in a consumer's input: H*W for a {C,H,W} input, 1 for a {F} input.
int64_t unit_span(const Graph& g, int consumer) {
  const Dims& in = g.node(g.node(consumer).inputs[0]).out;
  return in.size() == 3 ? in[1] * in[2] : 1;
}

std::vector<int64_t> all(int64_t n) {
  std::vector<int64_t> v(n);
  std::iota(v.begin(), v.end(), 0);
  return v;
}

}  // namespace

std::vector<PrunableLayer> prunable_layers(const Graph& g, bool conv, bool fc) {
  const auto rd = readers(g);
  std::vector<PrunableLayer> layers;
  for (size_t id = 0; id < g.nodes().size(); ++id) {
    const Node& n = g.nodes()[id];
    if (!((conv && n.op == Op::Conv) || (fc && n.op == Op::FullyConnected))) continue;
    PrunableLayer l;
    l.node = static_cast<int>(id);
    l.units = n.out[0];
    if (trace(g, rd, l.node, l)) layers.push_back(std::move(l));
  }
  return layers;
}

std::vector<float> Shrink::params(const std::vector<float>& old) const {
  std::vector<float> v(param_source.size());
  for (size_t i = 0; i < v.size(); ++i) v[i] = old.at(param_source[i]);
  return v;
}

std::vector<float> Shrink::buffers(const std::vector<float>& old) const {
  std::vector<float> v(buffer_source.size());
  for (size_t i = 0; i < v.size(); ++i) v[i] = old.at(buffer_source[i]);
  return v;
}

Graph with_widths(const Graph& g, const std::map<int, int64_t>& widths) {
  Graph out(g.input_dims());
  out.set_weight_init(g.weight_init());
  for (size_t id = 1; id < g.nodes().size(); ++id) {
    const Node& n = g.nodes()[id];
    const auto w = widths.find(static_cast<int>(id));
    const int x = n.inputs.empty() ? -1 : n.inputs[0];
    int made = -1;
    switch (n.op) {
      case Op::Input:
        throw std::logic_error("with_widths: a second input node");
      case Op::Conv: {
        ConvAttr a = n.conv;
        if (w != widths.end()) a.out_channels = w->second;
        made = out.conv(n.name, x, a);
        break;
      }
      case Op::FullyConnected: {
        FcAttr a = n.fc;
        if (w != widths.end()) a.out_features = w->second;
        made = out.fully_connected(n.name, x, a);
        break;
      }
      case Op::BatchNorm:
        made = out.batch_norm(n.name, x, n.bn);
        break;
      case Op::Relu:
        made = out.relu(x);
        break;
      case Op::MaxPool:
        made = out.max_pool(x, n.pool, n.name);
        break;
      case Op::AvgPool:
        made = out.avg_pool(x, n.pool, n.name);
        break;
      case Op::GlobalAvgPool:
        made = out.global_avg_pool(x, n.name);
        break;
      case Op::Add:
        made = out.add(n.inputs[0], n.inputs[1]);
        break;
      case Op::Concat:
        made = out.concat(n.inputs, n.name);
        break;
      case Op::Dropout:
        made = out.dropout(x, n.dropout, n.name);
        break;
      case Op::Lrn:
        made = out.lrn(x, n.lrn, n.name);
        break;
    }
    if (made != static_cast<int>(id)) throw std::logic_error("with_widths: node ids moved");
    if (w != widths.end() && n.op != Op::Conv && n.op != Op::FullyConnected)
      throw std::invalid_argument("with_widths: " + n.name + " is not a conv or fully connected");
  }
  if (g.output() >= 0) out.set_output(g.output());
  return out;
}

Shrink plan_shrink(const Graph& g, const Removal& r) {
  const auto layers = prunable_layers(g, true, true);
  std::map<int, int64_t> widths;
  // kept[node]: the original output channels (features) each node keeps, in order.
  std::vector<std::vector<int64_t>> kept(g.nodes().size());
  for (size_t id = 0; id < g.nodes().size(); ++id) kept[id] = all(g.nodes()[id].out[0]);
  for (const auto& [node, units] : r) {
    const bool ok = std::any_of(layers.begin(), layers.end(),
                                [&](const PrunableLayer& l) { return l.node == node; });
    if (!ok)
      throw std::invalid_argument("apoptosis: node " + std::to_string(node) +
                                  " is not a prunable layer");
    const Node& n = g.node(node);
    std::vector<char> gone(n.out[0], 0);
    for (int64_t u : units) {
      if (u < 0 || u >= n.out[0] || gone[u])
        throw std::invalid_argument("apoptosis: " + n.name + ": unit " + std::to_string(u) +
                                    " is out of range or repeated");
      gone[u] = 1;
    }
    if (static_cast<int64_t>(units.size()) >= n.out[0])
      throw std::invalid_argument("apoptosis: " + n.name + ": every unit would be removed");
    kept[node].clear();
    for (int64_t u = 0; u < n.out[0]; ++u)
      if (!gone[u]) kept[node].push_back(u);
    widths[node] = static_cast<int64_t>(kept[node].size());
  }
  // Per-channel layers carry their input's channels (node order is a topological order).
  for (size_t id = 0; id < g.nodes().size(); ++id)
    if (per_channel(g.nodes()[id].op)) kept[id] = kept[g.nodes()[id].inputs[0]];

  Shrink s{with_widths(g, widths), {}, {}};
  s.param_source.reserve(s.graph.param_count());
  s.buffer_source.reserve(s.graph.buffer_count());
  const auto& old_params = g.params();
  for (size_t i = 0; i < old_params.size(); ++i) {
    const TensorSpec& t = old_params[i];
    const Node& n = g.node(t.node);
    const std::vector<int64_t>& rows = kept[t.node];
    if (t.dims.size() == 1) {  // biases, batch-norm scale and shift: one per output channel
      for (int64_t o : rows) s.param_source.push_back(t.offset + o);
      continue;
    }
    // Weights {O, I, ...}: kept rows, and kept input channels (columns) of each.
    const int in = n.inputs[0];
    const int64_t span = n.op == Op::Conv ? t.dims[2] * t.dims[3] : unit_span(g, t.node);
    const int64_t row = t.size() / t.dims[0];
    for (int64_t o : rows)
      for (int64_t c : kept[in])
        for (int64_t k = 0; k < span; ++k)
          s.param_source.push_back(t.offset + o * row + c * span + k);
  }
  for (const TensorSpec& t : g.buffers())
    for (int64_t c : kept[t.node]) s.buffer_source.push_back(t.offset + c);
  if (static_cast<int64_t>(s.param_source.size()) != s.graph.param_count() ||
      static_cast<int64_t>(s.buffer_source.size()) != s.graph.buffer_count())
    throw std::logic_error("apoptosis: shrunk layout does not match the shrunk graph");
  return s;
}

std::map<std::string, int64_t> changed_widths(const Graph& base, const Graph& g) {
  if (base.nodes().size() != g.nodes().size())
    throw std::invalid_argument("changed_widths: the graphs are different models");
  std::map<std::string, int64_t> w;
  for (size_t id = 0; id < g.nodes().size(); ++id) {
    const Node& a = base.nodes()[id];
    const Node& b = g.nodes()[id];
    if (a.name != b.name || a.op != b.op)
      throw std::invalid_argument("changed_widths: the graphs are different models");
    if ((b.op == Op::Conv || b.op == Op::FullyConnected) && a.out[0] != b.out[0])
      w[b.name] = b.out[0];
  }
  return w;
}

Graph apply_widths(const Graph& base, const std::map<std::string, int64_t>& widths) {
  const auto layers = prunable_layers(base, true, true);
  std::map<int, int64_t> by_id;
  for (const auto& [name, width] : widths) {
    const auto l = std::find_if(layers.begin(), layers.end(), [&](const PrunableLayer& p) {
      return base.node(p.node).name == name;
    });
    if (l == layers.end())
      throw std::invalid_argument("shrunk width for '" + name +
                                  "', which is not a prunable layer of the model");
    if (width < 1 || width > l->units)
      throw std::invalid_argument("shrunk width " + std::to_string(width) + " of '" + name +
                                  "' is out of [1, " + std::to_string(l->units) + "]");
    by_id[l->node] = width;
  }
  return with_widths(base, by_id);
}

std::map<std::string, int64_t> widths_in_weights(const Graph& base, const NpzEntries& w) {
  std::map<std::string, int64_t> widths;
  for (const PrunableLayer& l : prunable_layers(base, true, true)) {
    const Node& n = base.node(l.node);
    const NpyArray* a = find_array(w, base.params()[n.params[0]].name);
    if (a && !a->shape.empty() && a->shape[0] != l.units) widths[n.name] = a->shape[0];
  }
  return widths;
}

std::vector<std::vector<double>> outgoing_norms(const Graph& g, const std::vector<float>& params,
                                                const std::vector<PrunableLayer>& layers) {
  std::vector<std::vector<double>> norms;
  for (const PrunableLayer& l : layers) {
    std::vector<double> sq(l.units, 0.0);
    for (int c : l.consumers) {
      const TensorSpec& t = g.params()[g.node(c).params[0]];
      const int64_t span = g.node(c).op == Op::Conv ? t.dims[2] * t.dims[3] : unit_span(g, c);
      const int64_t row = t.size() / t.dims[0];
      for (int64_t o = 0; o < t.dims[0]; ++o)
        for (int64_t u = 0; u < l.units; ++u) {
          const float* w = params.data() + t.offset + o * row + u * span;
          for (int64_t k = 0; k < span; ++k) sq[u] += static_cast<double>(w[k]) * w[k];
        }
    }
    for (double& v : sq) v = std::sqrt(v);
    norms.push_back(std::move(sq));
  }
  return norms;
}

Removal choose_removal(const std::vector<PrunableLayer>& layers,
                       const std::vector<std::vector<double>>& scores, const ApoptosisRule& rule) {
  if (scores.size() != layers.size())
    throw std::invalid_argument("choose_removal: one score vector per layer expected");
  Removal r;
  for (size_t i = 0; i < layers.size(); ++i) {
    const PrunableLayer& l = layers[i];
    const std::vector<double>& s = scores[i];
    if (static_cast<int64_t>(s.size()) != l.units)
      throw std::invalid_argument("choose_removal: one score per unit expected");
    double scale = 1.0;
    if (rule.relative) {
      const double mean = std::accumulate(s.begin(), s.end(), 0.0) / static_cast<double>(l.units);
      if (!(mean > 0)) continue;
      scale = 1.0 / mean;
    }
    std::vector<int64_t> cand;
    for (int64_t u = 0; u < l.units; ++u)
      if (s[u] * scale < rule.threshold) cand.push_back(u);
    std::stable_sort(cand.begin(), cand.end(), [&](int64_t a, int64_t b) { return s[a] < s[b]; });
    const int64_t cap = std::min<int64_t>(
        static_cast<int64_t>(std::floor(rule.max_share * static_cast<double>(l.units))),
        l.units - std::max<int64_t>(1, rule.min_keep));
    if (cap <= 0 || cand.empty()) continue;
    cand.resize(std::min<int64_t>(cap, static_cast<int64_t>(cand.size())));
    std::sort(cand.begin(), cand.end());
    r[l.node] = std::move(cand);
  }
  return r;
}

}  // namespace gg::kernels
