// The oneDNN CPU backend: primitives created once with layouts chosen by oneDNN, blocked layouts
// kept between layers, reorders only at the edges, and no allocation inside a step. In bf16,
// activations and convolution / inner-product arithmetic are bf16 over fp32 master weights.
#pragma once

#include <memory>

#include "kernels/executor.hpp"

namespace gg::kernels {

std::unique_ptr<Executor> make_onednn_executor(const Graph& g, int64_t batch, ParamStore& store,
                                               const std::vector<Bucket>& buckets,
                                               Precision precision);

// The block of the convolution weights oneDNN's fp32 kernels read on this CPU (its effective ISA,
// which ONEDNN_MAX_CPU_ISA may cap): 16 on AVX-512 (OIhw16i16o), 8 on AVX2 (OIhw8i8o), 0 (plain)
// on others.
int onednn_weight_block();

// Convolution weights in onednn_weight_block()'s blocks where their channels allow.
ParamLayout onednn_param_layout(const Graph& g);

}  // namespace gg::kernels
