// Who talks to whom at step t. Pure functions of (rank, p, step, seed): no MPI, no state, so the
// trainer, the tests and the simulator all use the same code.
#pragma once

#include <cstdint>
#include <string>

namespace gg::partners {

struct Partners {
  int send_to = 0;
  int recv_from = 0;
  bool operator==(const Partners&) const = default;
};

// ceil(log2 p) for p >= 1 (0 for p = 1): the length of one dissemination round.
int rounds_per_cycle(int p);

// Dissemination: at step t, k = t mod ceil(log2 p); rank v sends to (v + 2^k) mod p and
// receives from (v - 2^k) mod p.
Partners dissemination(int rank, int p, int64_t step);

}  // namespace gg::partners
