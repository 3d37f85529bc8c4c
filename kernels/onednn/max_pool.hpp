// Max pooling for training over a channel-blocked f32 tensor (oneDNN's nChw8c / nChw16c: n,
// channel block, h, w, `block` channels), with the window's argmax kept per output as a byte. The
// executor runs these loops instead of oneDNN 2.6's training max pool (with its workspace), which
// is slow: for GoogLeNet's 13 pools at batch 16 on the Xeon VM (2 threads, forward + backward,
// medians), 96 ms a step against 42 with AVX-512, 328 against 64 capped to AVX2 (gg_bench_pool,
// bench/results/compute-avx2.md).
#pragma once

#include <cstdint>

#include "kernels/graph.hpp"

namespace gg::kernels {

struct BlockedPool {
  int64_t n = 0, blocks = 0;  // images, channel blocks (channels rounded up to `block`)
  int64_t h = 0, w = 0, oh = 0, ow = 0;
  int k = 0, stride = 0, pad = 0;  // square window; pad is the top / left padding
  int block = 8;                   // 8 or 16
};

// The pool of graph node `pool` (Op::MaxPool) over `input` (its input's per-sample dims) for a
// batch of `batch`, in blocks of `block` channels.
BlockedPool blocked_pool(const Node& pool, const Dims& input, int64_t batch, int block);

// y = the max over each window of x (positions outside the input are left out; the first of
// equal maxima wins, as in oneDNN and PyTorch), `arg` = its position in the window (kh * k + kw),
// or 255 where a window holds no input position.
void blocked_max_pool_forward(const float* x, float* y, uint8_t* arg, const BlockedPool& s);
// dx = the sum over outputs of dy routed to each window's argmax (dx is overwritten).
void blocked_max_pool_backward(const float* dy, const uint8_t* arg, float* dx,
                               const BlockedPool& s);

}  // namespace gg::kernels
