// Mixing rules: what a rank does with its partner's bucket. Pure functions over spans (no MPI, no
// threads), the arithmetic every exchange (gossip, the node hierarchy, allreduce) runs, so that
// they are tested alone on hand-computed values and an algorithm is written once.
#pragma once

#include <cstdint>
#include <span>

namespace gg::gossip {

// The gossip step: x <- (x + partner) / 2, element by element.
void mix_pair(std::span<float> x, std::span<const float> partner);

// The uniform average over k + 1 ranks, as their buckets arrive one by one: add_to(x, p) for
// every partner but the last, then mix_last(x, p, k + 1): x <- (x + p) / (k + 1).
void add_to(std::span<float> x, std::span<const float> partner);
void mix_last(std::span<float> x, std::span<const float> partner, int ranks);
// A schedule's weights (partners::Partners::set_weights), as buckets arrive one by one:
// mix_weighted(x, own, p, w) for the first link, x <- own x + w p, then add_weighted(x, p, w),
// x <- x + w p, for each further link in link order.
void mix_weighted(std::span<float> x, float own, std::span<const float> partner, float w);
void add_weighted(std::span<float> x, std::span<const float> partner, float w);

// Overlapped (delayed) averaging: the correction (partner - sent) / 2 into delta, computed when
// the partner's bucket arrives, and added to the buffer later (it may have moved meanwhile):
// x + delta equals mix_pair's result when x is still what was sent.
void mix_correction(std::span<const float> sent, std::span<const float> partner,
                    std::span<float> delta);
void apply_correction(std::span<float> x, std::span<const float> delta);

// Public copies (CHOCO): d = x - copy (d may be x itself), and the mix x += (theirs - mine) / 2.
void difference(std::span<const float> x, std::span<const float> copy, std::span<float> d);
void mix_copies(std::span<float> x, std::span<const float> mine, std::span<const float> theirs);

// sum_i (a_i - b_i)^2 in double: how far apart two ranks' values are (consensus control).
double squared_distance(std::span<const float> a, std::span<const float> b);
// sum_i a_i^2 in double.
double squared_norm(std::span<const float> a);

// A sum over `ranks` ranks -> their mean (allreduce, the node average).
void mean_of_sum(std::span<float> x, int ranks);

// Bounded staleness (staleness 1): what the partner's latest bucket, exchanged in step `latest`
// (-1: none yet), is worth in step `step`: this step's (Fresh), the previous step's (Late; with
// skip_late it stays Unmixed), or nothing usable (Unmixed).
enum class Freshness { Fresh, Late, Unmixed };
Freshness freshness(int64_t latest, int64_t step, bool skip_late);

}  // namespace gg::gossip
