// A network's weights as named arrays with torchvision's state_dict names: every parameter, the
// batch-norm running statistics and, per batch norm, `<bn>.num_batches_tracked` (int64), so
// that PyTorch's load_state_dict(strict=True) takes an exported file, and torchvision's
// state_dict saved with numpy loads here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/executor.hpp"
#include "kernels/graph.hpp"
#include "kernels/npz.hpp"

namespace gg::kernels {

// The arrays of a state_dict, in the graph's order. `batches_tracked` becomes every
// num_batches_tracked (PyTorch counts the training forwards each batch norm has seen).
// `params` and `buffers` are laid out like ParamStore's.
NpzEntries export_weights(const Graph& g, const std::vector<float>& params,
                          const std::vector<float>& buffers, int64_t batches_tracked);
NpzEntries export_weights(const Graph& g, const ParamStore& s, int64_t batches_tracked);

// Copies every parameter and running statistic the graph expects from `arrays` into `s`. Extra
// `*.num_batches_tracked` entries are accepted and ignored. Throws std::invalid_argument naming
// `source` and the first missing, mis-shaped, wrongly typed or unknown name; `s` is untouched
// then.
void import_weights(const Graph& g, ParamStore& s, const NpzEntries& arrays,
                    const std::string& source);

// export_weights + write_npz, and read_npz + import_weights. save_weights refuses weights that
// hold a NaN or inf (a model that diverged): std::runtime_error naming the path and the tensor,
// nothing written.
void save_weights(const std::string& path, const Graph& g, const std::vector<float>& params,
                  const std::vector<float>& buffers, int64_t batches_tracked);
void load_weights(const std::string& path, const Graph& g, ParamStore& s);

}  // namespace gg::kernels
