// What parse_train_args cannot know: whether this machine can run the config. `gossipgrad
// train` calls both on every rank before any rank starts, so that a usage error stops the job
// with one line and no file written; `--dry-run` turns them into warnings.
#pragma once

#include "gossip/config/config.hpp"

namespace gg::gossip {

// This build and this CPU can run train.backend and train.precision; throws UsageError.
void check_this_machine(const Config& c);

// Every file the run reads exists and no file it writes is clobbered: the data folder,
// train.init_from (an .npz of finite float arrays), checkpoint.resume, checkpoint.dir (no earlier
// checkpoint unless resumed or log.overwrite), log.timeline and log.metrics (unless
// log.overwrite); every output can be written (log.samples included) and is none of the inputs
// (the config, the data, init_from, resume) nor another output, nor inside an input folder.
// Throws UsageError.
void check_run_files(const Config& c);

}  // namespace gg::gossip
