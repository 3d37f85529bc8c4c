// A convolution that also gives the batch-norm statistics of its output, summed in its epilogue:
// cuDNN's graph API (through the header-only cudnn-frontend: conv_fprop + genstats), the pattern
// NVIDIA's ResNet-50 training fuses, so the statistics pass over the convolution's output is not
// run. Channels-last tensors, bf16 or fp16 in and out, fp32 sums. Where cuDNN has no plan for a
// shape on the GPU at hand, or the build has no cudnn-frontend (GG_CUDNN_FRONTEND_DIR), the
// constructor says why in one line and the caller runs the convolution and the statistics apart.
#pragma once

#include <cudnn.h>

#include <cstdint>
#include <memory>
#include <string>

namespace gg::kernels::cuda {

struct ConvStatsShape {
  int64_t n = 0, c = 0, h = 0, w = 0;  // input, NHWC in memory
  int64_t k = 0, r = 1, s = 1;         // filters: k x c x r x s, KRSC in memory
  int64_t pad_h = 0, pad_w = 0, stride_h = 1, stride_w = 1;
  bool bf16 = true;  // else fp16
  int64_t out_h() const { return (h + 2 * pad_h - r) / stride_h + 1; }
  int64_t out_w() const { return (w + 2 * pad_w - s) / stride_w + 1; }
};

// Whether this build has cudnn-frontend (the graph API's C++ wrapper).
bool conv_stats_built();

class ConvStats {
 public:
  // Builds the graph and its plan on `handle`'s device; std::runtime_error naming the shape and
  // cuDNN's reason when there is none.
  ConvStats(cudnnHandle_t handle, const ConvStatsShape& shape);
  ~ConvStats();
  ConvStats(const ConvStats&) = delete;
  ConvStats& operator=(const ConvStats&) = delete;
  int64_t workspace_bytes() const;
  // y = conv(x, w) and, per output channel, sum[k] = sum of y, sq[k] = sum of y^2 (fp32), on the
  // handle's stream. `workspace` holds workspace_bytes().
  void run(cudnnHandle_t handle, const void* x, const void* w, void* y, float* sum, float* sq,
           void* workspace) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gg::kernels::cuda
