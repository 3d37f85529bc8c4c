// The reference backend: plain, single-threaded C++ loops over NCHW tensors. Slow and obvious on
// purpose: it is the oracle the tests hold the fast backends to.
#pragma once

#include <memory>

#include "kernels/executor.hpp"

namespace gg::kernels {

std::unique_ptr<Executor> make_reference_executor(const Graph& g, int64_t batch, ParamStore& store,
                                                  const std::vector<Bucket>& buckets);

}  // namespace gg::kernels
