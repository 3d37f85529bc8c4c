// Test hooks: faults a test asks for with fault.kill (SIGKILL), fault.stall (SIGSTOP) and
// fault.nan (every weight of rank 0 set to NaN), each before the step it names. They live here,
// behind the StepHook seam, and not in the step: the loop installs them only when one is set.
#pragma once

#include <memory>

#include "gossip/comm/mpi.hpp"
#include "gossip/config/config.hpp"
#include "gossip/train/hooks.hpp"
#include "gossip/train/trainer.hpp"

namespace gg::gossip {

// nullptr when the config sets no test hook, or when they fired already: in a restart by
// gossipgrad supervise (GG_SUPERVISE_ATTEMPT > 0) and, without supervise, in a run that resumed.
// A supervised job launched with checkpoint.resume (attempt 0) keeps them.
std::unique_ptr<StepHook> make_test_hook(const Config& c, const mpi::Comm& comm, Trainer& trainer,
                                         bool resumed);

}  // namespace gg::gossip
