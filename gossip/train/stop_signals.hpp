// SIGTERM (a scheduler's preemption, `gossipgrad supervise` passing one on) and SIGINT (Ctrl-C)
// ask a training run to stop: the ranks agree at the next step boundary, write a full checkpoint
// where checkpoint.dir is set, and exit with 128 + the signal's number. A repeated signal (the
// scheduler and mpirun may both send one) counts once; a third one ends the process at once, and
// so does a stop that the rank has not taken up within the grace period (a rank stuck in a wait).
#pragma once

#include <atomic>
#include <stdexcept>
#include <string>
#include <thread>

namespace gg::gossip {

// Installs the handlers for its lifetime (the previous ones come back after it), with a watchdog
// thread for the grace period.
class StopSignals {
 public:
  explicit StopSignals(double grace_seconds);
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
  // The signal that asked to stop (SIGTERM or SIGINT), 0 when none did.
  static int requested();
  // The ranks agreed to stop and are writing the checkpoint: the watchdog stands down.
  void taken_up() { taken_up_ = true; }

 private:
  void watch();
  double grace_;
  std::atomic<bool> done_{false}, taken_up_{false};
  std::thread watchdog_;
};

// The run stopped at a step boundary because of `signal`; what() is the line to print.
struct StopRequested : std::runtime_error {
  StopRequested(int signal, const std::string& what) : std::runtime_error(what), signal(signal) {}
  int signal;
};

const char* signal_name(int signal);  // "SIGTERM", "SIGINT"

}  // namespace gg::gossip
