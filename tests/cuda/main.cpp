// Catch2's main for the GPU tests: where no CUDA device is present it says so and exits 77,
// which ctest reports as skipped (SKIP_RETURN_CODE), so CPU-only machines stay green.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <cstdio>
#include <string>

#include "kernels/cuda/cuda_executor.hpp"

int main(int argc, char** argv) {
  std::string why;
  if (gg::kernels::cuda_device_count(&why) == 0) {
    std::printf("SKIPPED: no CUDA device (%s)\n", why.c_str());
    return 77;
  }
  std::printf("GPU: %s\n", gg::kernels::cuda_describe().c_str());
  return Catch::Session().run(argc, argv);
}
