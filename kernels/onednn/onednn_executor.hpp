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

namespace onednn {
// Whether a 3x3 stride-1 fp32 convolution from `in_channels` to `out_channels` over a `height` x
// `width` output may run by Winograd (oneDNN's convolution_auto picks; else direct). Measured in
// training steps (bench/compute/peak_bench.cpp --algorithms alone; docs/models.md in the step):
// narrow layers (fewer than 32 inputs or 64 outputs, e.g. resnet8's 16- and 32-channel stages
// and every stem) and outputs under 7 x 7 (where oneDNN's own choice took Winograd for the
// backward passes: 2x slower at 2 x 2) run faster direct.
bool winograd_pays(int64_t in_channels, int64_t out_channels, int64_t height, int64_t width);
}  // namespace onednn

}  // namespace gg::kernels
