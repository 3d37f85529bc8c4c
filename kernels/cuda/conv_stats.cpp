#include "kernels/cuda/conv_stats.hpp"

#include <stdexcept>
#include <unordered_map>

#ifdef GG_HAVE_CUDNN_FRONTEND
#define CUDNN_FRONTEND_SKIP_JSON_LIB
#include <cudnn_frontend.h>
#endif

namespace gg::kernels::cuda {

namespace {
std::string shape_text(const ConvStatsShape& s) {
  return std::to_string(s.n) + "x" + std::to_string(s.c) + "x" + std::to_string(s.h) + "x" +
         std::to_string(s.w) + " * " + std::to_string(s.k) + "x" + std::to_string(s.c) + "x" +
         std::to_string(s.r) + "x" + std::to_string(s.s) + " stride " + std::to_string(s.stride_h) +
         (s.bf16 ? " bf16" : " fp16");
}
}  // namespace

#ifdef GG_HAVE_CUDNN_FRONTEND

namespace fe = cudnn_frontend;

bool conv_stats_built() { return true; }

struct ConvStats::Impl {
  fe::graph::Graph graph;
  int64_t workspace = 0;
};

namespace {
// The graph's tensors, by the uids execute() binds.
enum Uid : int64_t { kX = 1, kW, kY, kSum, kSq };

void check(fe::error_t e, const ConvStatsShape& s, const char* step) {
  if (e.is_bad())
    throw std::runtime_error("cuDNN graph (convolution + statistics) for " + shape_text(s) + ": " +
                             step + ": " + e.get_message());
}
}  // namespace

ConvStats::ConvStats(cudnnHandle_t handle, const ConvStatsShape& s) : impl_(new Impl) {
  fe::graph::Graph& g = impl_->graph;
  const fe::DataType_t io = s.bf16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF;
  g.set_io_data_type(io)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  // Channels-last: dims are NCHW, strides say NHWC (KRSC for the filters).
  const auto x = g.tensor(fe::graph::Tensor_attributes()
                              .set_name("x")
                              .set_uid(kX)
                              .set_dim({s.n, s.c, s.h, s.w})
                              .set_stride({s.c * s.h * s.w, 1, s.c * s.w, s.c}));
  const auto w = g.tensor(fe::graph::Tensor_attributes()
                              .set_name("w")
                              .set_uid(kW)
                              .set_dim({s.k, s.c, s.r, s.s})
                              .set_stride({s.c * s.r * s.s, 1, s.c * s.s, s.c}));
  const auto y = g.conv_fprop(x, w,
                              fe::graph::Conv_fprop_attributes()
                                  .set_name("conv")
                                  .set_padding({s.pad_h, s.pad_w})
                                  .set_stride({s.stride_h, s.stride_w})
                                  .set_dilation({1, 1}));
  y->set_output(true).set_uid(kY).set_data_type(io);
  auto [sum, sq] = g.genstats(y, fe::graph::Genstats_attributes().set_name("stats"));
  sum->set_output(true).set_uid(kSum).set_data_type(fe::DataType_t::FLOAT);
  sq->set_output(true).set_uid(kSq).set_data_type(fe::DataType_t::FLOAT);
  check(g.validate(), s, "validate");
  check(g.build_operation_graph(handle), s, "operation graph");
  check(g.create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK}), s, "plans");
  check(g.check_support(handle), s, "support");
  check(g.build_plans(handle), s, "build");
  check(g.get_workspace_size(impl_->workspace), s, "workspace");
}

int64_t ConvStats::workspace_bytes() const { return impl_->workspace; }

void ConvStats::run(cudnnHandle_t handle, const void* x, const void* w, void* y, float* sum,
                    float* sq, void* workspace) const {
  std::unordered_map<int64_t, void*> pack = {
      {kX, const_cast<void*>(x)}, {kW, const_cast<void*>(w)}, {kY, y}, {kSum, sum}, {kSq, sq}};
  fe::error_t e = impl_->graph.execute(handle, pack, workspace);
  if (e.is_bad())
    throw std::runtime_error("cuDNN graph (convolution + statistics): execute: " + e.get_message());
}

#else  // no cudnn-frontend in this build

bool conv_stats_built() { return false; }

struct ConvStats::Impl {};

ConvStats::ConvStats(cudnnHandle_t, const ConvStatsShape& s) {
  throw std::runtime_error("convolution + statistics for " + shape_text(s) +
                           ": this gossipgrad was built without cudnn-frontend (configure with "
                           "GG_CUDNN_FRONTEND_DIR: bench/compute/cudnn_frontend.sh fetches it)");
}

int64_t ConvStats::workspace_bytes() const { return 0; }

void ConvStats::run(cudnnHandle_t, const void*, const void*, void*, float*, float*, void*) const {}

#endif

ConvStats::~ConvStats() = default;

}  // namespace gg::kernels::cuda
