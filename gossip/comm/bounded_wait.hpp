// The exchange engines' own waits (the compute thread for its communication threads) are bounded
// too: a wait during which the engine completes nothing for longer than its limit fails with a
// line naming what was awaited, instead of hanging the job. The communication threads' waits on
// partners time out first (transport.hpp); this bound catches an engine that waits for work it
// never queued.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <stdexcept>
#include <string>

namespace gg::gossip {

// Waits on `cv` (under `lock`) until done(). With limit_s > 0, throws std::runtime_error when
// `progress` (a counter the engine moves whenever it completes anything, read under the lock)
// stays the same for longer than limit_s; limit_s 0: no bound.
template <class Done>
void wait_with_progress(std::unique_lock<std::mutex>& lock, std::condition_variable& cv,
                        const uint64_t& progress, double limit_s, const std::string& what,
                        Done done) {
  if (limit_s <= 0) return cv.wait(lock, done);
  const auto limit = std::chrono::duration<double>(limit_s);
  uint64_t seen = progress;
  auto since = std::chrono::steady_clock::now();
  while (!done()) {
    cv.wait_for(lock, std::chrono::milliseconds(200));
    if (progress != seen) {
      seen = progress;
      since = std::chrono::steady_clock::now();
    } else if (!done() && std::chrono::steady_clock::now() - since > limit) {
      char limit_text[32];
      std::snprintf(limit_text, sizeof limit_text, "%g", limit_s);
      throw std::runtime_error("gossip exchange: waited more than " + std::string(limit_text) +
                               " s for " + what +
                               " with nothing completing; a rank died or hangs (gossip.timeout_s)");
    }
  }
}

}  // namespace gg::gossip
