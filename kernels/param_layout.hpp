// Where each parameter's values sit inside its slice of the flat buffers. The plain layout is
// PyTorch's (what checkpoints, exports and every other backend use). The oneDNN backend may keep
// convolution weights in the blocked layout its kernels read (OIhw16i16o on AVX-512, OIhw8i8o on
// AVX2): the weights are then not reordered into it before every step, nor their gradients back
// out of it after. Parameters, their gradients and everything updated with them (momentum, gossip
// corrections) share one layout, so that the optimizer and the exchanges still work element by
// element; only what leaves or enters a run converts.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/graph.hpp"

namespace gg::kernels {

struct ParamLayout {
  // One entry per parameter (Graph::params() order), or none at all for an all-plain layout:
  // 0 = plain; b > 0 = a convolution weight {O, I, kH, kW} with O and I multiples of b, stored as
  // [O/b][I/b][kH][kW][b inputs][b outputs].
  std::vector<int> block;

  bool plain() const;
  int block_of(int param) const { return block.empty() ? 0 : block[static_cast<size_t>(param)]; }
  // Identifies the layout (equal layouts, equal numbers), to check that ranks agree.
  uint64_t fingerprint() const;
};

// Convolution weights whose output and input channels are multiples of `b` in blocks of `b`
// (b = 0: all plain).
ParamLayout blocked_conv_layout(const Graph& g, int b);

// Between whole flat parameter-sized buffers (g.param_count() floats each, not overlapping).
void to_layout(const Graph& g, const ParamLayout& l, const float* plain, float* native);
void to_plain(const Graph& g, const ParamLayout& l, const float* native, float* plain);
// In place, through one temporary copy.
void make_native(const Graph& g, const ParamLayout& l, float* v);
std::vector<float> plain_copy(const Graph& g, const ParamLayout& l, const float* native);

}  // namespace gg::kernels
