// The CUDA backend's failure modes that a CPU-only machine can check: a build without CUDA
// refuses "cuda" in one line, and a build with it refuses to compile a net in one line when no
// device is present.
#include <catch2/catch.hpp>
#include <stdexcept>
#include <string>

#include "kernels/executor.hpp"
#include "kernels/models.hpp"
#include "kernels/net.hpp"
#ifdef GG_HAVE_CUDA
#include "kernels/cuda/cuda_executor.hpp"
#endif

using namespace gg::kernels;

namespace {
bool one_line(const std::string& s) { return !s.empty() && s.find('\n') == std::string::npos; }
}  // namespace

TEST_CASE("the cuda backend name parses exactly when the build has CUDA") {
  if (cuda_built()) {
    CHECK(parse_backend("cuda") == Backend::Cuda);
    CHECK(std::string(backend_name(Backend::Cuda)) == "cuda");
    return;
  }
  try {
    parse_backend("cuda");
    FAIL("parse_backend(\"cuda\") accepted cuda in a build without CUDA");
  } catch (const std::invalid_argument& e) {
    const std::string m = e.what();
    CHECK(one_line(m));
    CHECK(m.find("built without CUDA") != std::string::npos);
  }
}

TEST_CASE("unknown backends are refused with the list of known ones") {
  try {
    parse_backend("tpu");
    FAIL("accepted tpu");
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()).find("reference, onednn or cuda") != std::string::npos);
  }
}

TEST_CASE("compiling for the CUDA backend with no GPU fails with one line naming the device") {
#ifdef GG_HAVE_CUDA
  std::string why;
  if (cuda_device_count(&why) > 0) {
    WARN("a CUDA device is present: the no-device path is not exercised here");
    return;
  }
  CHECK(one_line(why));
  ModelSpec spec;
  spec.name = "cnn";
  Net net(build_model(spec), Backend::Cuda, 1 << 20);
  try {
    net.at_batch(2);
    FAIL("compiled a CUDA executor without a device");
  } catch (const std::runtime_error& e) {
    const std::string m = e.what();
    CHECK(one_line(m));
    CHECK(m.find("no CUDA device") != std::string::npos);
  }
  try {
    bind_device(Backend::Cuda, 0);
    FAIL("bound a device that is not there");
  } catch (const std::runtime_error& e) {
    CHECK(one_line(e.what()));
    CHECK(std::string(e.what()).find("no CUDA device") != std::string::npos);
  }
#else
  CHECK_THROWS_AS(bind_device(Backend::Cuda, 0), std::invalid_argument);
#endif
}
