// A crash ends the process at once: one line and a backtrace on stderr, then the signal's own
// default action (so mpirun and supervise see a rank killed by it). See fatal_signals.cpp.
#pragma once

namespace gg::gossip {

// First thing in main: handlers for SIGSEGV, SIGBUS, SIGFPE, SIGILL and SIGABRT in place of
// UCX's (installed when its library loaded).
void install_fatal_signal_handlers();

}  // namespace gg::gossip
