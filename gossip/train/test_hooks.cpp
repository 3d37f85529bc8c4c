#include "gossip/train/test_hooks.hpp"

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <utility>

namespace gg::gossip {
namespace {

class TestHook : public StepHook {
 public:
  TestHook(const Config& c, const mpi::Comm& comm, Trainer& trainer)
      : c_(c), rank_(comm.rank()), trainer_(trainer) {}

  void before_step(int64_t s, shuffle::Batch&) override {
    for (const auto& [spec, sig] : {std::pair{c_.fault.kill, SIGKILL}, {c_.fault.stall, SIGSTOP}}) {
      if (spec.empty()) continue;
      const auto [rank, step] = parse_fault_kill(spec);
      if (rank != rank_ || step != s) continue;
      std::fprintf(stderr, "gossipgrad: rank %d: fault hook: %s at step %lld\n", rank,
                   sig == SIGKILL ? "SIGKILL" : "SIGSTOP", static_cast<long long>(s));
      std::fflush(stderr);
      std::fflush(stdout);
      std::raise(sig);
    }
    // Weights that blew up: every logit, hence the loss, becomes NaN (a NaN input would not do:
    // ReLU maps NaN to 0).
    if (c_.fault.nan == s && rank_ == 0) {
      std::fill(trainer_.store().params.begin(), trainer_.store().params.end(),
                std::numeric_limits<float>::quiet_NaN());
      trainer_.store_written(kernels::kParams);
    }
    // Bad weights that leave the loss finite: training forwards normalise with the batch's own
    // statistics, so only the guard's look at the weights (and checkpoints) can catch these.
    if (c_.fault.nan_stats == s && rank_ == 0) {
      std::fill(trainer_.store().buffers.begin(), trainer_.store().buffers.end(),
                std::numeric_limits<float>::quiet_NaN());
      trainer_.store_written(kernels::kBuffers);
    }
  }

 private:
  const Config& c_;
  const int rank_;
  Trainer& trainer_;
};

}  // namespace

std::unique_ptr<StepHook> make_test_hook(const Config& c, const mpi::Comm& comm, Trainer& trainer,
                                         bool resumed) {
  if (c.fault.kill.empty() && c.fault.stall.empty() && c.fault.nan < 0 && c.fault.nan_stats < 0)
    return nullptr;
  // Under gossipgrad supervise the attempt tells a restart (> 0), whose hooks fired already,
  // from the job as launched (0), also one launched with checkpoint.resume. Without it, a resumed
  // run is taken for a restart by hand.
  const char* attempt = std::getenv("GG_SUPERVISE_ATTEMPT");
  if (attempt != nullptr ? std::string(attempt) != "0" : resumed) return nullptr;
  return std::make_unique<TestHook>(c, comm, trainer);
}

}  // namespace gg::gossip
