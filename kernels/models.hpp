// Model zoo: builds the Graph of a named network and initialises its parameters the way
// torchvision does, so that names, shapes and parameter order match PyTorch's state_dict.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/executor.hpp"
#include "kernels/graph.hpp"

namespace gg::kernels {

struct ModelSpec {
  std::string name = "resnet8";  // see model_names()
  Dims input = {1, 28, 28};
  int64_t classes = 10;
  int64_t width = 16;      // channels of the first stage (small nets only)
  bool batch_norm = true;  // small nets only: false drops every batch norm (conv gets a bias)
  uint64_t seed = 0;       // dropout masks (googlenet); give each rank its own
};

// Names build_model accepts: the small nets for 28x28/32x32 inputs (resnet8, cnn) and
// torchvision's resnet18/34/50/101/152 (v1.5) and googlenet (no aux heads, no input transform).
std::vector<std::string> model_names();

// The spec `gossipgrad info` shows a model at when no input or class count is given: ImageNet's
// {3,224,224} and 1000 classes for the torchvision models, {1,28,28} and 10 for the small nets.
ModelSpec default_spec(const std::string& name);

// Throws std::invalid_argument naming the problem for unknown names or unusable inputs (an input
// too small for the net's strides names the smallest one that fits).
Graph build_model(const ModelSpec& spec);

// torchvision's ResNet with any number of blocks per stage and any stem width (64 in
// torchvision): BasicBlock or, with `bottleneck`, Bottleneck v1.5 (stride on the 3x3 conv).
struct ResNetShape {
  std::vector<int> blocks = {3, 4, 6, 3};
  bool bottleneck = true;
  int64_t width = 64;
};
Graph build_resnet(const ModelSpec& spec, const ResNetShape& shape);

// torchvision's GoogLeNet with every channel count divided by `width_divisor` (at least one
// channel each): 1 is the real net, larger divisors give small nets of the same structure.
Graph build_googlenet(const ModelSpec& spec, int64_t width_divisor = 1);

// Per g.weight_init(): Kaiming-normal (fan_out, ReLU) convolutions and PyTorch's default uniform
// fully connected layers (ResNet, small nets), or truncated normal std 0.01 conv and fully
// connected weights (GoogLeNet); batch norm weight 1 / bias 0, running mean 0 / var 1.
// Deterministic in `seed`.
void init_params(const Graph& g, ParamStore& store, uint64_t seed);

}  // namespace gg::kernels
