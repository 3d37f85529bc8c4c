#include "partners/schedule.hpp"

#include <stdexcept>

namespace gg::partners {

int rounds_per_cycle(int p) {
  if (p < 1) throw std::invalid_argument("rank count must be >= 1");
  int k = 0;
  while ((int64_t{1} << k) < p) ++k;
  return k;
}

Partners dissemination(int rank, int p, int64_t step) {
  if (rank < 0 || rank >= p) throw std::invalid_argument("rank outside [0, p)");
  const int rounds = rounds_per_cycle(p);
  if (rounds == 0) return {rank, rank};
  const int64_t hop = int64_t{1} << (step % rounds);
  return {static_cast<int>((rank + hop) % p), static_cast<int>(((rank - hop) % p + p) % p)};
}

}  // namespace gg::partners
