// Element-wise passes of the oneDNN executor (kernels/onednn/eltwise.cpp), over whole tensors of
// f32 or bf16 in any one layout (a blocked layout's padding holds zeros, which stay zeros), split
// over the OpenMP threads.
#pragma once

#include <oneapi/dnnl/dnnl.hpp>
#include <vector>

namespace gg::kernels {

// y = relu(x), in place when x == y. NaN stays NaN as in PyTorch, where oneDNN's eltwise_relu,
// fused into batch norm or not, gives 0 and so hid a NaN from the loss. With `report`, returns
// whether an element was NaN; else false.
bool relu_keeping_nan(const dnnl::memory& x, const dnnl::memory& y, bool report);

// y = relu(a + b), NaN kept: a residual add and the ReLU that is its only reader in one pass
// (oneDNN's sum and then relu_keeping_nan wrote and read the tensor once more), with the same
// numbers as those two passes: the sum rounds once (bf16: to nearest even, as oneDNN's sum
// rounds). a, b and y share one layout. With `report`, returns whether an element was NaN.
bool add_relu_keeping_nan(const dnnl::memory& a, const dnnl::memory& b, const dnnl::memory& y,
                          bool report);

// The gradient of a ReLU computed in place whose output two layers read: dx = y <= 0 ? +0 : a + b
// (a, b: the readers' gradients), one pass instead of oneDNN's sum and then its ReLU backward. A
// NaN in y passes the gradient, as oneDNN's ReLU backward from the output and PyTorch's do; bf16
// sums are rounded once, to nearest even, as oneDNN's sum rounds.
void relu_backward_sum2(const dnnl::memory& y, const dnnl::memory& a, const dnnl::memory& b,
                        const dnnl::memory& dx);

// dst = srcs[0] + srcs[1] + ... (f32, at least two, all in dst's layout), summed left to right:
// the same bits as oneDNN's f32 sum primitive, whose simple:any loop (what it runs for f32 on
// every layout) takes about 1.5x our time on the gradients of GoogLeNet's inception inputs, four
// readers each. (For bf16 oneDNN has a JIT sum on every CPU that runs bf16.)
void sum_of(const std::vector<dnnl::memory>& srcs, const dnnl::memory& dst);

}  // namespace gg::kernels
