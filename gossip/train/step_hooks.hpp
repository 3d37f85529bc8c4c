// The hooks of a training run, in the order the loop calls them after a step: the sample log
// (log.samples), the NaN guard, apoptosis, progress and metrics, evaluation with the average-model
// checkpoint, and the periodic full checkpoints (with train.stop_at).
#pragma once

#include "gossip/train/hooks.hpp"
#include "gossip/train/job.hpp"

namespace gg::gossip {

// Every hook this group's config asks for, simulated failures and test hooks included.
StepHooks make_step_hooks(Group& g, JobState& job);

// Seconds as "1h02m" or "3m07s" ("?" when not finite).
std::string format_duration(double seconds);

}  // namespace gg::gossip
