// The two-peer exponential graph, a schedule with two links a step (the time-varying exponential
// graph of Assran et al., "Stochastic Gradient Push for Distributed Deep Learning", ICML 2019,
// with two peers instead of one). With L = ceil(log2 p) hops 2^0 .. 2^(L-1), step t uses hops
// 2^i and 2^j, i = 2t mod L and j = (2t + 1) mod L: rank v sends to v + 2^i and v + 2^j and
// receives from v - 2^i and v - 2^j (mod p). Every hop comes round in ceil(L / 2) steps, half
// dissemination's cycle, for twice its bytes a step. Each link is a shift, so a permutation; the
// two hops differ (L >= 2 for p >= 3), so a rank's two peers do too. p = 2 has one peer: refused.
#pragma once

#include <cstdint>
#include <string>

#include "partners/schedule.hpp"

namespace gg::partners {

inline Partners exponential2(int v, int p, int64_t step) {
  const int rounds = rounds_per_cycle(p);
  const auto hop_link = [&](int64_t k) {
    const int64_t hop = int64_t{1} << k;
    return Link{static_cast<int>((v + hop) % p), static_cast<int>(((v - hop) % p + p) % p)};
  };
  const Link first = hop_link((2 * step) % rounds);
  Partners out{first.send_to, first.recv_from};
  out.add(hop_link((2 * step + 1) % rounds));
  return out;
}

inline std::string exponential2_refuses(int p) {
  if (p >= 3) return "";
  return "exponential2 gives each rank two peers a step and needs at least 3 ranks, got p=" +
         std::to_string(p) + "; use dissemination";
}

}  // namespace gg::partners
