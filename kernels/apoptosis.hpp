// Neuron apoptosis (arXiv:1610.00790): which output units of a Graph (convolution channels, fully
// connected neurons) can be removed, how important each one is, and the physically smaller
// network without the removed ones, with every parameter-shaped array mapped onto it.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kernels/graph.hpp"
#include "kernels/npz.hpp"

namespace gg::kernels {

// A layer whose output units can be removed: a convolution's output channels or a fully
// connected layer's neurons. Its output reaches only per-channel layers (batch norm, ReLU, pools,
// dropout) and then the convolutions / fully connected layers that read it; a unit that reaches
// an add, a concat, an LRN or the graph's output never qualifies, so residual and inception
// blocks keep the channels they join.
struct PrunableLayer {
  int node = -1;
  std::vector<int> batch_norms;  // between the layer and its consumers: their channels go too
  std::vector<int> consumers;    // conv / fully connected nodes whose input channels/columns go
  int64_t units = 0;
};

// conv / fc: which layer kinds to consider. In node order.
std::vector<PrunableLayer> prunable_layers(const Graph& g, bool conv, bool fc);

// Units to remove, by node id: sorted, distinct indices into the node's current outputs.
using Removal = std::map<int, std::vector<int64_t>>;

// The network without the removed units, and where each element of its flat buffers comes from
// in the original's (node ids, names and parameter order are the original's).
struct Shrink {
  Graph graph;
  std::vector<int64_t> param_source;   // new flat parameter index -> old index
  std::vector<int64_t> buffer_source;  // new flat buffer (running statistics) index -> old index
  // Any array laid out like the parameters (weights, gradients, momentum) in the new layout.
  std::vector<float> params(const std::vector<float>& old) const;
  std::vector<float> buffers(const std::vector<float>& old) const;
};

// Throws std::invalid_argument when a node of `r` is not prunable, an index is out of range or
// repeated, or every unit of a layer would go.
Shrink plan_shrink(const Graph& g, const Removal& r);

// The same graph with other output counts for some conv / fully connected nodes, by node id.
Graph with_widths(const Graph& g, const std::map<int, int64_t>& widths);

// Output counts of the conv / fully connected layers of `g` that differ from `base` (same model,
// before any shrink), by node name: what describes a shrunk architecture (checkpoint meta.json).
std::map<std::string, int64_t> changed_widths(const Graph& base, const Graph& g);
// `base` with those widths; throws std::invalid_argument for a name that is not a prunable
// layer or a width out of [1, the base's width].
Graph apply_widths(const Graph& base, const std::map<std::string, int64_t>& widths);
// The widths the weights in `w` were saved at (read off the first dimension of each prunable
// layer's weight), for loading the weights of a shrunk model into `base`'s architecture.
std::map<std::string, int64_t> widths_in_weights(const Graph& base, const NpzEntries& w);

// Per prunable layer, per unit: the L2 norm of its outgoing weights (its input channel / columns
// in every consumer). A unit whose outgoing weights are all zero contributes nothing downstream.
std::vector<std::vector<double>> outgoing_norms(const Graph& g, const std::vector<float>& params,
                                                const std::vector<PrunableLayer>& layers);

struct ApoptosisRule {
  // A unit is a candidate when its score is below `threshold`: the score itself (absolute), or
  // divided by the mean score of its layer (relative).
  bool relative = true;
  double threshold = 0.5;
  double max_share = 0.25;  // at most floor(max_share * units) of a layer go per decision
  int64_t min_keep = 4;     // a layer never shrinks below this many units
};

// The lowest-scoring candidates of each layer (ties: lower index first) within the rule's caps.
// A pure function of its inputs: ranks holding the same scores remove the same units.
Removal choose_removal(const std::vector<PrunableLayer>& layers,
                       const std::vector<std::vector<double>>& scores, const ApoptosisRule& rule);

}  // namespace gg::kernels
