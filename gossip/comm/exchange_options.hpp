// What a gossip exchange is asked to do: its partners, transport, threading, staleness and wire.
// Plain data (no MPI): gossip/config builds it from the [gossip] options, tests and benchmarks
// by hand.
#pragma once

#include <string>

#include "gossip/comm/wire.hpp"
#include "partners/schedule.hpp"

namespace gg::gossip {

// Who drives a gossip exchange's transport (see GossipExchange).
enum class Threading { Funneled, Concurrent, Chained };
// "funneled" | "concurrent" | "chained"; throws std::invalid_argument otherwise.
Threading parse_threading(const std::string& name);

struct GossipOptions {
  partners::Schedule schedule;     // p must equal the communicator's size
  std::string transport = "auto";  // auto | shm | rma | p2p (make_transport)
  Threading threading = Threading::Funneled;
  int comm_threads = 2;    // concurrent only
  int staleness = 0;       // 0: wait for the partner; 1: never wait, mix what has arrived
  bool skip_late = false;  // staleness 1: a bucket not yet here this step stays unmixed
  bool delayed = false;    // start_delayed/finish_delayed: mix as a correction applied later
  double timeout_s = 0;    // a wait on a partner longer than this fails the step (0: never)
  Wire wire = Wire::Fp32;
  bool error_feedback = false;    // a lossy wire only
  bool measure_distance = false;  // the rule adds up ||x - partner||^2 (consensus control)
  // CHOCO-SGD: the difference to public copies both partners hold travels (staleness 0 only).
  bool public_copies = false;
};

}  // namespace gg::gossip
