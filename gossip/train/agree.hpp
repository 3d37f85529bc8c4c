// Work every rank does together fails on all of them or on none: the first failing rank's error,
// thrown on every rank as the UsageError or std::runtime_error it was.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <stdexcept>

#include "gossip/comm/mpi.hpp"
#include "gossip/config/config.hpp"

namespace gg::gossip {

// A collective: returns when no rank failed, throws the agreed error otherwise.
inline void throw_agreed(const mpi::Comm& comm, const mpi::RankError& mine) {
  const mpi::RankError e = mpi::agree_on_error(comm, mine);
  if (e.message.empty()) return;
  if (e.usage) throw UsageError(e.message);
  throw std::runtime_error(e.message);
}

// A collective, the job's first: every rank resolved the same settings (to_ini), else every rank
// throws the same UsageError naming the first setting that differs, rank 0's value and the first
// rank with another (an MPMD launch line gives each part its own options).
void agree_on_config(const mpi::Comm& comm, const Config& c);

// An agreement (the maximum over the ranks of up to two values) that may run behind the next
// step (guard.lag 1): started after step s, waited for after step s + 1, so that no step waits
// for the slowest rank. Not movable: MPI writes into it while it runs.
class LaggedMax {
 public:
  explicit LaggedMax(const mpi::Comm& comm) : comm_(comm) {}
  ~LaggedMax() {
    if (!running_) return;
    // A partner known to be lost never joins: the request is left to the job's end.
    if (comm_.peer_lost()) {
      request_.abandon();
      return;
    }
    try {
      request_.wait();  // bounded by the wait watchdog
    } catch (const std::exception&) {
    }
  }
  LaggedMax(const LaggedMax&) = delete;
  LaggedMax& operator=(const LaggedMax&) = delete;

  // Agrees on `values` of step `step`: now (a blocking collective) or, `behind`, in the
  // background until finish().
  void start(int64_t step, std::initializer_list<double> values, bool behind) {
    if (values.size() > 2) throw std::logic_error("LaggedMax agrees on at most two values");
    n_ = 0;
    for (double v : values) v_[n_++] = v;
    step_ = step;
    if (!behind) return comm_.allreduce_max(v_, n_);
    request_ = comm_.iallreduce_max(v_, n_);
    running_ = true;
  }
  bool running() const { return running_; }
  // The agreed values of the last start() (waiting for them if they run behind), and its step.
  const double* finish() {
    if (running_) request_.wait();
    running_ = false;
    return v_;
  }
  int64_t step() const { return step_; }

 private:
  const mpi::Comm& comm_;
  double v_[2] = {0, 0};
  int n_ = 0;
  int64_t step_ = -1;
  mpi::Request request_;
  bool running_ = false;
};

}  // namespace gg::gossip
