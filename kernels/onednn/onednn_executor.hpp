// The oneDNN CPU backend: primitives created once with layouts chosen by oneDNN, blocked layouts
// kept between layers, reorders only at the edges, and no allocation inside a step. In bf16,
// activations and convolution / inner-product arithmetic are bf16 over fp32 master weights.
#pragma once

#include <memory>

#include "kernels/executor.hpp"
#include "kernels/onednn/isa.hpp"  // onednn_weight_block

namespace gg::kernels {

std::unique_ptr<Executor> make_onednn_executor(const Graph& g, int64_t batch, ParamStore& store,
                                               const std::vector<Bucket>& buckets,
                                               Precision precision);

// Convolution weights in onednn_weight_block()'s blocks where their channels allow.
ParamLayout onednn_param_layout(const Graph& g);

}  // namespace gg::kernels
