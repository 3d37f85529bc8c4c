// The mixing-matrix simulator: what a schedule does to per-rank values when every step replaces
// x_v by (x_v + x_{recv_from(v)}) / 2 (with k links a step, the uniform average of x_v and its k
// recv_from's). Built on step_partners(), the code training runs.
#pragma once

#include <cstdint>
#include <vector>

#include "partners/schedule.hpp"

namespace gg::partners {

// The first step count t (from step 0) after which every rank carries weight from every rank,
// i.e. the product W_t...W_1 has no zero entry; -1 if that takes more than max_steps. Bitset rows,
// processed in blocks of 4096 sources, so p = 4096 costs about p^2/64 word operations per step.
int diffusion_steps(const Schedule& s, int max_steps);

// max_v |x_v - mean| / max_v |x0_v - mean| after `steps` steps from step 0, maximised over start
// vectors: over every basis vector e_u (exact) for p <= 1024, over 8 seeded random vectors above
// that (a lower bound). 0 means every rank holds the global average; 1 means no progress.
double deviation_from_average(const Schedule& s, int steps);

// Geometric-mean factor by which the consensus distance sum_v (x_v - mean)^2 shrinks per round of
// round_length(p) steps, over `rounds` rounds from step 0 and a fixed seeded start vector.
// 0 when the distance reaches exactly 0 (hypercube) and for p = 1.
double contraction_per_round(const Schedule& s, int rounds);

// Applies steps [first_step, first_step + steps) to one value per rank: x_v <- 0.5 * (x_v +
// x_recv_from(v)). The float overload rounds exactly like the exchange engine does, so MPI tests
// can compare bit for bit.
std::vector<double> mix(const Schedule& s, std::vector<double> x, int64_t first_step, int steps);
std::vector<float> mix(const Schedule& s, std::vector<float> x, int64_t first_step, int steps);

}  // namespace gg::partners
