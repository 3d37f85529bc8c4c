// Work every rank does together fails on all of them or on none: the first failing rank's error,
// thrown on every rank as the UsageError or std::runtime_error it was.
#pragma once

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

}  // namespace gg::gossip
