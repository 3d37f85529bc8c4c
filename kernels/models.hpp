// Model zoo: builds the Graph of a named network and initialises its parameters the way
// torchvision does, so that names and shapes match PyTorch's state_dict.
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
};

// Names build_model accepts.
std::vector<std::string> model_names();

// Throws std::invalid_argument naming the problem for unknown names or unusable inputs.
Graph build_model(const ModelSpec& spec);

// Kaiming-normal (fan_out, ReLU) convolutions, PyTorch's default uniform fully connected layers,
// batch norm weight 1 / bias 0, running mean 0 / var 1. Deterministic in `seed`.
void init_params(const Graph& g, ParamStore& store, uint64_t seed);

}  // namespace gg::kernels
