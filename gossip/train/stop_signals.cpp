#include "gossip/train/stop_signals.hpp"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <thread>

namespace gg::gossip {
namespace {

volatile std::sig_atomic_t g_signal = 0;  // the first stop signal
volatile std::sig_atomic_t g_count = 0;   // stop signals received
struct sigaction g_old_term, g_old_int;

void on_stop_signal(int sig) {
  if (g_signal == 0) g_signal = sig;
  g_count = g_count + 1;
  if (g_count >= 3) _exit(128 + sig);  // a job that does not stop: at once
}

}  // namespace

StopSignals::StopSignals(double grace_seconds) : grace_(grace_seconds) {
  g_signal = 0;
  g_count = 0;
  struct sigaction sa = {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // MPI and file calls in flight go on; the loop checks at the boundary
  sigaction(SIGTERM, &sa, &g_old_term);
  sigaction(SIGINT, &sa, &g_old_int);
  watchdog_ = std::thread([this] { watch(); });
}

StopSignals::~StopSignals() {
  done_ = true;
  watchdog_.join();
  sigaction(SIGTERM, &g_old_term, nullptr);
  sigaction(SIGINT, &g_old_int, nullptr);
}

// A rank stuck in a wait (a hung partner, a stalled loader) never reaches the step boundary: the
// stop would wait for it forever. So a stop not taken up within the grace period ends the
// process, without a checkpoint.
void StopSignals::watch() {
  using Clock = std::chrono::steady_clock;
  Clock::time_point since{};
  while (!done_) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const int sig = g_signal;
    if (sig == 0 || taken_up_) continue;
    if (since == Clock::time_point{}) since = Clock::now();
    if (Clock::now() - since < std::chrono::duration<double>(grace_)) continue;
    std::fprintf(stderr,
                 "gossipgrad: %s, but this rank did not reach the end of its step within %g s "
                 "(a hung partner or loader): exiting without a checkpoint\n",
                 signal_name(sig), grace_);
    std::fflush(stderr);
    std::fflush(stdout);
    std::_Exit(128 + sig);
  }
}

int StopSignals::requested() { return g_signal; }

const char* signal_name(int signal) { return signal == SIGINT ? "SIGINT" : "SIGTERM"; }

}  // namespace gg::gossip
