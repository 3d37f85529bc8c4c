// The exchange engine's queue: the buckets handed over by backward, waiting for a communication
// thread, and the bookkeeping the compute thread waits on (which step runs, how many of its
// buckets are done, the first error). Every wait of the compute thread is bounded by the
// engine's progress (bounded_wait.hpp). Which algorithm runs is not its business.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "gossip/comm/exchange_options.hpp"
#include "gossip/comm/timeline.hpp"
#include "partners/schedule.hpp"

namespace gg::gossip {

class BucketQueue {
 public:
  // One bucket's exchange in one step, with that step's partners.
  struct Job {
    int64_t step;
    int bucket;
    partners::Partners peers;
    Timeline::Clock::time_point started{};
  };
  // `limit_s`: the bound of the compute thread's waits without progress (0: none).
  BucketQueue(size_t buckets, Threading threading, double limit_s);

  // The compute thread, at a step's start: its number and partners.
  void begin(int64_t step, const partners::Partners& peers);
  // The compute thread: bucket b is ready. With `one_in_flight`, first waits until the previous
  // exchange of b is over; `capture` runs under the queue's lock just before b is queued.
  void push(int b, bool one_in_flight, const std::function<void()>& capture);
  // A communication thread: the next buckets to exchange, as its threading takes them
  // (funneled: every one queued; concurrent: one; chained: the next in bucket order). Blocks;
  // empty once the queue is stopped and drained.
  std::vector<Job> take();
  // A communication thread, funneled: the buckets queued now, without waiting (empty: none, or
  // another threading).
  std::vector<Job> take_ready();
  // A communication thread: job j is over / the exchange failed (the compute thread rethrows).
  void done(const Job& j);
  void fail(std::exception_ptr e);
  // The compute thread: waits until every bucket of this step is done; rethrows an error.
  void wait_step();
  // The compute thread: waits until bucket b of this step is done; rethrows an error.
  void wait_bucket(int b);
  // Rethrows the first error, if any.
  void check() const;
  // Waits (bounded) for the jobs already queued, then stops the communication threads' take().
  void drain_and_stop();
  int64_t step() const;

 private:
  bool chained_ready() const;
  const size_t buckets_;
  const Threading threading_;
  const double limit_s_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;
  int64_t step_ = 0;
  partners::Partners peers_;
  size_t done_ = 0;             // buckets of step_ exchanged
  int next_chained_ = 0;        // chained: the bucket of step_ to start next
  std::vector<int> in_flight_;  // exchanges of bucket b queued and not yet finished
  std::vector<char> done_now_;  // whether bucket b of step_ is exchanged
  uint64_t progress_ = 0;       // exchanges finished, ever (bounds the waits)
  bool stop_ = false;
  std::exception_ptr error_;
};

}  // namespace gg::gossip
