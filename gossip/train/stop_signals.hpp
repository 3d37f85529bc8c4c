// SIGTERM (a scheduler's preemption, `gossipgrad supervise` passing one on) and SIGINT (Ctrl-C)
// ask a training run to stop: the ranks agree at the next step boundary, write a full checkpoint
// where checkpoint.dir is set, and exit with 128 + the signal's number. A repeated signal (the
// scheduler and mpirun may both send one) counts once; a third one kills as the default would.
#pragma once

#include <stdexcept>
#include <string>

namespace gg::gossip {

// Installs the handlers for its lifetime (the previous ones come back after it).
class StopSignals {
 public:
  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
  // The signal that asked to stop (SIGTERM or SIGINT), 0 when none did.
  static int requested();
};

// The run stopped at a step boundary because of `signal`; what() is the line to print.
struct StopRequested : std::runtime_error {
  StopRequested(int signal, const std::string& what) : std::runtime_error(what), signal(signal) {}
  int signal;
};

const char* signal_name(int signal);  // "SIGTERM", "SIGINT"

}  // namespace gg::gossip
