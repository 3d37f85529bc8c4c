#include "gossip/train/stop_signals.hpp"

#include <csignal>

namespace gg::gossip {
namespace {

volatile std::sig_atomic_t g_signal = 0;  // the first stop signal
volatile std::sig_atomic_t g_count = 0;   // stop signals received
struct sigaction g_old_term, g_old_int;

void on_stop_signal(int sig) {
  if (g_signal == 0) g_signal = sig;
  g_count = g_count + 1;
  if (g_count >= 3) {  // a job that does not stop: the default action, at once
    std::signal(sig, SIG_DFL);
    std::raise(sig);
  }
}

}  // namespace

StopSignals::StopSignals() {
  g_signal = 0;
  g_count = 0;
  struct sigaction sa = {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // MPI and file calls in flight go on; the loop checks at the boundary
  sigaction(SIGTERM, &sa, &g_old_term);
  sigaction(SIGINT, &sa, &g_old_int);
}

StopSignals::~StopSignals() {
  sigaction(SIGTERM, &g_old_term, nullptr);
  sigaction(SIGINT, &g_old_int, nullptr);
}

int StopSignals::requested() { return g_signal; }

const char* signal_name(int signal) { return signal == SIGINT ? "SIGINT" : "SIGTERM"; }

}  // namespace gg::gossip
