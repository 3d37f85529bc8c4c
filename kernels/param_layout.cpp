#include "kernels/param_layout.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace gg::kernels {

bool ParamLayout::plain() const {
  return std::all_of(block.begin(), block.end(), [](int b) { return b == 0; });
}

uint64_t ParamLayout::fingerprint() const {
  if (plain()) return 0;
  uint64_t h = 1469598103934665603ull;  // FNV-1a over (index, block) pairs
  for (size_t i = 0; i < block.size(); ++i) {
    for (uint64_t v : {static_cast<uint64_t>(i), static_cast<uint64_t>(block[i])}) {
      h ^= v;
      h *= 1099511628211ull;
    }
  }
  return h;
}

ParamLayout blocked_conv_layout(const Graph& g, int b) {
  ParamLayout l;
  if (b <= 0) return l;
  l.block.assign(g.params().size(), 0);
  for (const Node& n : g.nodes()) {
    if (n.op != Op::Conv || n.params.empty()) continue;
    const Dims& d = g.params()[static_cast<size_t>(n.params[0])].dims;
    if (d.size() == 4 && d[0] % b == 0 && d[1] % b == 0)
      l.block[static_cast<size_t>(n.params[0])] = b;
  }
  if (l.plain()) l.block.clear();
  return l;
}

namespace {

// Calls f(plain index, blocked index) for every element of a blocked convolution weight.
template <class F>
void each_element(const Dims& d, int b, F f) {
  const int64_t O = d[0], I = d[1], K = d[2] * d[3], OB = O / b, IB = I / b, bb = int64_t{b} * b;
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t ob = 0; ob < OB; ++ob)
    for (int64_t ib = 0; ib < IB; ++ib)
      for (int64_t s = 0; s < K; ++s) {
        const int64_t blk = ((ob * IB + ib) * K + s) * bb;
        for (int64_t ii = 0; ii < b; ++ii)
          for (int64_t oo = 0; oo < b; ++oo)
            f(((ob * b + oo) * I + ib * b + ii) * K + s, blk + ii * b + oo);
      }
}

void check(const Graph& g, const ParamLayout& l) {
  if (!l.block.empty() && l.block.size() != g.params().size())
    throw std::invalid_argument("parameter layout for " + std::to_string(l.block.size()) +
                                " parameters, the network has " +
                                std::to_string(g.params().size()));
}

// Copies every parameter from `from` to `to`, through the blocks where it is blocked, towards
// the blocked layout or back.
void convert(const Graph& g, const ParamLayout& l, const float* from, float* to, bool to_blocks) {
  check(g, l);
  for (size_t p = 0; p < g.params().size(); ++p) {
    const TensorSpec& t = g.params()[p];
    const float* src = from + t.offset;
    float* dst = to + t.offset;
    const int b = l.block_of(static_cast<int>(p));
    if (b == 0)
      std::copy(src, src + t.size(), dst);
    else if (to_blocks)
      each_element(t.dims, b, [&](int64_t pi, int64_t bi) { dst[bi] = src[pi]; });
    else
      each_element(t.dims, b, [&](int64_t pi, int64_t bi) { dst[pi] = src[bi]; });
  }
}

}  // namespace

void to_layout(const Graph& g, const ParamLayout& l, const float* plain, float* native) {
  convert(g, l, plain, native, true);
}

void to_plain(const Graph& g, const ParamLayout& l, const float* native, float* plain) {
  convert(g, l, native, plain, false);
}

void make_native(const Graph& g, const ParamLayout& l, float* v) {
  if (l.plain()) return;
  const std::vector<float> plain(v, v + g.param_count());
  to_layout(g, l, plain.data(), v);
}

std::vector<float> plain_copy(const Graph& g, const ParamLayout& l, const float* native) {
  std::vector<float> out(static_cast<size_t>(g.param_count()));
  to_plain(g, l, native, out.data());
  return out;
}

}  // namespace gg::kernels
