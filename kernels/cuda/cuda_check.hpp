// Checked CUDA, cuDNN and cuBLAS calls: a failing call throws std::runtime_error with one line
// naming the call, the library's message, and where it was made.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <stdexcept>
#include <string>

namespace gg::kernels::cuda {

[[noreturn]] inline void fail(const char* lib, const char* call, const char* what, const char* file,
                              int line) {
  std::string m = "CUDA backend: ";
  m += lib;
  m += " call ";
  m += call;
  m += " failed: ";
  m += what;
  m += " (";
  m += file;
  m += ':';
  m += std::to_string(line);
  m += ')';
  throw std::runtime_error(m);
}

inline const char* cublas_message(cublasStatus_t s) { return cublasGetStatusString(s); }

}  // namespace gg::kernels::cuda

#define GG_CUDA_CHECK(call)                                                                    \
  do {                                                                                         \
    const cudaError_t gg_e_ = (call);                                                          \
    if (gg_e_ != cudaSuccess)                                                                  \
      ::gg::kernels::cuda::fail("CUDA", #call, cudaGetErrorString(gg_e_), __FILE__, __LINE__); \
  } while (0)

#define GG_CUDNN_CHECK(call)                                                                     \
  do {                                                                                           \
    const cudnnStatus_t gg_s_ = (call);                                                          \
    if (gg_s_ != CUDNN_STATUS_SUCCESS)                                                           \
      ::gg::kernels::cuda::fail("cuDNN", #call, cudnnGetErrorString(gg_s_), __FILE__, __LINE__); \
  } while (0)

#define GG_CUBLAS_CHECK(call)                                                                \
  do {                                                                                       \
    const cublasStatus_t gg_s_ = (call);                                                     \
    if (gg_s_ != CUBLAS_STATUS_SUCCESS)                                                      \
      ::gg::kernels::cuda::fail("cuBLAS", #call, ::gg::kernels::cuda::cublas_message(gg_s_), \
                                __FILE__, __LINE__);                                         \
  } while (0)
