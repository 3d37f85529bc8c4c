// A timeline of a training run as Chrome trace events (the JSON that Perfetto and
// chrome://tracing open): one complete event ("ph":"X") per phase, with microseconds from one
// steady clock, the rank as pid and the thread as tid. Threads record concurrently; the events
// of every rank are gathered into one file at the end.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "gossip/comm/mpi.hpp"

namespace gg::gossip {

class Timeline {
 public:
  using Clock = std::chrono::steady_clock;

  explicit Timeline(bool enabled = false) : enabled_(enabled), origin_(Clock::now()) {}
  bool enabled() const { return enabled_; }

  // [begin, end) of `name` (category `cat`: "compute", "comm", "data", "optimizer", "wait") on
  // the calling thread. `args` is a JSON object's text or empty.
  void record(std::string name, const char* cat, Clock::time_point begin, Clock::time_point end,
              std::string args = {});
  // Names the calling thread in the trace ("compute", "comm 0", ...).
  void name_thread(const std::string& name);

  // Records from construction to destruction; does nothing when the timeline is off.
  class Span {
   public:
    Span(Timeline* t, std::string name, const char* cat)
        : t_(t && t->enabled() ? t : nullptr), name_(std::move(name)), cat_(cat) {
      if (t_) begin_ = Clock::now();
    }
    ~Span() {
      if (t_) t_->record(std::move(name_), cat_, begin_, Clock::now());
    }
    Span(const Span&) = delete;
    Span& operator=(const Span&) = delete;

   private:
    Timeline* t_;
    std::string name_;
    const char* cat_;
    Clock::time_point begin_;
  };

  // Collective: rank 0 writes every rank's events to `path` (temporary name, then rename).
  // The clocks of the ranks are aligned at this timeline's construction, after a barrier.
  void write(const mpi::Comm& world, const std::string& path) const;

  // This rank's events as JSON objects separated by commas (for tests and gathering).
  std::string events_json(int pid) const;

 private:
  struct Event {
    std::string name;
    const char* cat;
    int64_t ts_us, dur_us;
    int tid;
    std::string args;
  };
  static int thread_index();

  bool enabled_;
  Clock::time_point origin_;
  mutable std::mutex mu_;
  std::vector<Event> events_;
  std::vector<std::pair<int, std::string>> thread_names_;
};

}  // namespace gg::gossip
