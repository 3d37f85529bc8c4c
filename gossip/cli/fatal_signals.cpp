// Why not UCX's handler: MPICH's ch4:ucx device lets UCX catch the fatal signals, and UCX's
// handler prints its backtrace with functions that allocate. A crash inside malloc (a corrupted
// heap) then deadlocks on malloc's own lock, and the process hangs for ever instead of dying: seen
// with a use-after-free in the virtual ranks (fixed in beb62b0). UCX installs its handlers when
// its library loads, before main; ours, installed first thing in main, replace them. Ours
// allocates nothing: backtrace() is loaded at start-up, backtrace_symbols_fd() writes straight
// to stderr.
#include "gossip/cli/fatal_signals.hpp"

#include <execinfo.h>
#include <unistd.h>

#include <csignal>
#include <cstring>

namespace gg::gossip {
namespace {

constexpr int kSignals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};

const char* signal_name(int sig) {
  switch (sig) {
    case SIGSEGV:
      return "SIGSEGV (invalid memory access)";
    case SIGBUS:
      return "SIGBUS (bus error)";
    case SIGFPE:
      return "SIGFPE (arithmetic exception)";
    case SIGILL:
      return "SIGILL (illegal instruction: built for another CPU?)";
    case SIGABRT:
      return "SIGABRT (aborted)";
  }
  return "a fatal signal";
}

void put(const char* s) {
  const ssize_t ignored = ::write(STDERR_FILENO, s, std::strlen(s));
  (void)ignored;
}

void on_fatal_signal(int sig) {
  put("gossipgrad: fatal ");
  put(signal_name(sig));
  put(": a bug in gossipgrad or a library it calls; the backtrace follows (please report it with "
      "the command line)\n");
  void* frames[64];
  backtrace_symbols_fd(frames, backtrace(frames, 64), STDERR_FILENO);
  // SA_RESETHAND restored the default action: the process ends by the signal itself.
  ::raise(sig);
}

}  // namespace

void install_fatal_signal_handlers() {
  void* warm[1];
  backtrace(warm, 1);  // its first call loads libgcc, which allocates: not in the handler
  struct sigaction sa = {};
  sa.sa_handler = on_fatal_signal;
  sa.sa_flags = SA_RESETHAND | SA_NODEFER;
  sigemptyset(&sa.sa_mask);
  for (int sig : kSignals) sigaction(sig, &sa, nullptr);
}

}  // namespace gg::gossip
