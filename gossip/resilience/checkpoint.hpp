// A checkpoint folder: model.npz (the ranks' average model with torchvision state_dict names,
// running statistics and num_batches_tracked included) and meta.json (what built the model and
// where training stood). Every file appears complete or not at all (temporary name + rename).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "kernels/graph.hpp"
#include "kernels/models.hpp"

namespace gg::gossip {

struct CheckpointMeta {
  kernels::ModelSpec model;
  int64_t epoch = 0;  // epochs completed (the last one possibly partly, with train.max_steps)
  int64_t step = 0;   // optimizer steps done
  int ranks = 1;
  std::optional<double> top1;  // test top-1 of the saved model, when measured
  // The input normalisation training used: x = (pixel / 255 - mean) / std.
  double input_mean = 0;
  double input_std = 1;
  // Apoptosis: out channels / features of the layers that shrank, by layer name (absent from
  // meta.json when none did); kernels::apply_widths(build_model(model), widths) is the graph.
  std::map<std::string, int64_t> widths;
};

constexpr const char* kCheckpointModel = "model.npz";
constexpr const char* kCheckpointMeta = "meta.json";

// Whether `dir` already holds (part of) a checkpoint: the average model or full ones.
bool holds_checkpoint(const std::string& dir);

// Writes model.npz, then meta.json, creating `dir` if needed. Rank 0 only.
void write_checkpoint(const std::string& dir, const CheckpointMeta& meta, const kernels::Graph& g,
                      const std::vector<float>& params, const std::vector<float>& buffers);

// Reads meta.json. Throws UsageError when `dir` holds no checkpoint, std::runtime_error naming
// the file when meta.json is malformed.
CheckpointMeta read_checkpoint_meta(const std::string& dir);

}  // namespace gg::gossip
