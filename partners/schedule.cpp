#include "partners/schedule.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

#include "partners/exponential.hpp"

namespace gg::partners {

namespace {

// Domain tags so the rotation and the random schedule never draw the same stream for one seed.
constexpr uint64_t kRotationStream = 0x726f746174696f6eULL;  // "rotation"
constexpr uint64_t kRandomStream = 0x72616e646f6d2121ULL;    // "random!!"

// splitmix64's finaliser: a bijection on 64 bits with good avalanche. Built only from fixed-width
// integer operations, so the draws below are identical everywhere (unlike the <random>
// distributions, whose algorithms are implementation-defined).
constexpr uint64_t splitmix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// A permutation of [0, p) that is a pure function of (seed, stream, counter): Fisher-Yates whose
// i-th draw is hash(key, i), i.e. a counter-based RNG with no state carried between steps.
std::vector<int> seeded_permutation(uint64_t seed, uint64_t stream, uint64_t counter, int p) {
  std::vector<int> perm(p);
  std::iota(perm.begin(), perm.end(), 0);
  const uint64_t key = splitmix64(splitmix64(splitmix64(seed) ^ stream) ^ counter);
  for (int i = p - 1; i > 0; --i) {
    const uint64_t r = splitmix64(key ^ static_cast<uint64_t>(i));
    // Lemire's multiply-shift maps r onto [0, i] without a data-dependent loop.
    const auto j = static_cast<int>((static_cast<unsigned __int128>(r) * (i + 1)) >> 64);
    std::swap(perm[i], perm[j]);
  }
  return perm;
}

std::vector<int> inverse(const std::vector<int>& perm) {
  std::vector<int> inv(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) inv[perm[i]] = static_cast<int>(i);
  return inv;
}

bool power_of_two(int p) { return p > 0 && (p & (p - 1)) == 0; }

// The random schedule's step-t pattern is one p-cycle: relabel ranks by a seeded permutation
// `pos`, then everybody sends to the next label. A cycle has no fixed points for p >= 2, and
// every rank derives it from (seed, step) alone.
struct RandomCycle {
  std::vector<int> pos;   // rank -> position on the cycle
  std::vector<int> rank;  // position -> rank
  RandomCycle(uint64_t seed, int64_t step, int p)
      : pos(seeded_permutation(seed, kRandomStream, static_cast<uint64_t>(step), p)),
        rank(inverse(pos)) {}
};

Partners hypercube(int w, int p, int64_t step) {
  const int partner = w ^ (1 << (step % rounds_per_cycle(p)));
  return {partner, partner};
}

Partners ring(int w, int p, int64_t) { return {(w + 1) % p, (w + p - 1) % p}; }

std::string any_p(int) { return ""; }

std::string needs_power_of_two(int p) {
  if (power_of_two(p)) return "";
  return "hypercube needs a power-of-two rank count, got p=" + std::to_string(p) +
         "; use dissemination";
}

// The patterns: each one's function of (virtual rank, p >= 2, step), its links a step, what it
// refuses of p ("" where it serves p) and its words in --help. Random draws a cycle per step and
// is handled apart.
struct Pattern {
  Kind kind;
  Partners (*of)(int w, int p, int64_t step);
  int links;
  std::string (*refuses)(int p);
  const char* help;
};
constexpr Pattern kPatterns[] = {
    {Kind::Dissemination, dissemination, 1, any_p, "dissemination (2^k apart, k = t mod log2 p)"},
    {Kind::Hypercube, hypercube, 1, needs_power_of_two, "hypercube (pairs; power-of-two ranks)"},
    {Kind::Ring, ring, 1, any_p, "ring"},
    {Kind::Random, nullptr, 1, any_p, "random (a seeded cycle each step)"},
    {Kind::Exponential2, exponential2, 2, exponential2_refuses,
     "exponential2 (two peers a step, 2^i and 2^(i+1) apart; p >= 3, transport p2p)"},
};

const Pattern& pattern(Kind kind) {
  for (const Pattern& q : kPatterns)
    if (q.kind == kind) return q;
  throw std::logic_error("unhandled schedule kind");
}

// Partners of virtual rank w (p >= 2); `cycle` is only read for Kind::Random.
Partners virtual_partners(Kind kind, int w, int p, int64_t step, const RandomCycle* cycle) {
  if (kind == Kind::Random) {
    const int at = cycle->pos[w];
    return {cycle->rank[(at + 1) % p], cycle->rank[(at + p - 1) % p]};
  }
  return pattern(kind).of(w, p, step);
}

void check_step(int64_t step) {
  if (step < 0) throw std::invalid_argument("step must be >= 0, got " + std::to_string(step));
}

}  // namespace

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

Kind parse_kind(const std::string& name) {
  std::string valid;
  for (const auto& [k, n] : kKindNames) {
    if (name == n) return k;
    valid += (valid.empty() ? "" : ", ") + std::string(n);
  }
  throw std::invalid_argument("unknown schedule '" + name + "'; valid: " + valid);
}

const char* kind_name(Kind kind) {
  for (const auto& [k, n] : kKindNames)
    if (k == kind) return n.data();  // the table's literals end in a NUL
  return "?";
}

void validate(const Schedule& s) {
  if (s.p < 1) throw std::invalid_argument("rank count must be >= 1, got p=" + std::to_string(s.p));
  if (s.p == 1) return;
  if (const std::string why = pattern(s.kind).refuses(s.p); !why.empty())
    throw std::invalid_argument(why);
}

void Partners::set_weights(float own, std::span<const float> link_weights) {
  if (static_cast<int>(link_weights.size()) != links())
    throw std::invalid_argument("Partners::set_weights: " + std::to_string(link_weights.size()) +
                                " weights for " + std::to_string(links()) + " links");
  double sum = own;
  bool positive = own > 0;
  for (float w : link_weights) {
    sum += w;
    positive = positive && w > 0;
  }
  if (!positive || std::abs(sum - 1.0) > 1e-5)
    throw std::invalid_argument(
        "Partners::set_weights: the weights must be positive and sum to 1 (" + std::to_string(sum) +
        ")");
  weights[0] = own;
  std::copy(link_weights.begin(), link_weights.end(), weights.begin() + 1);
  weighted = true;
}

bool serves(const Schedule& s) {
  try {
    validate(s);
    return true;
  } catch (const std::invalid_argument&) {
    return false;
  }
}

std::vector<Kind> all_kinds() {
  std::vector<Kind> out;
  for (const auto& [k, name] : kKindNames) out.push_back(k);
  return out;
}

int links(Kind kind) { return pattern(kind).links; }

const std::string& kinds_help() {
  static const std::string help = [] {
    std::string h = "partners:";
    for (const Pattern& q : kPatterns) h += std::string(&q == kPatterns ? " " : ", ") + q.help;
    return h;
  }();
  return help;
}

int round_length(int p) { return std::max(1, rounds_per_cycle(p)); }

std::vector<int> rotation(const Schedule& s, int64_t step) {
  validate(s);
  check_step(step);
  if (!s.rotate) {
    std::vector<int> id(s.p);
    std::iota(id.begin(), id.end(), 0);
    return id;
  }
  const int64_t round = step / round_length(s.p);
  return seeded_permutation(s.seed, kRotationStream, static_cast<uint64_t>(round), s.p);
}

Partners partners(const Schedule& s, int rank, int64_t step) {
  validate(s);
  check_step(step);
  if (rank < 0 || rank >= s.p)
    throw std::invalid_argument("rank " + std::to_string(rank) + " outside [0, " +
                                std::to_string(s.p) + ")");
  if (s.p == 1) return {0, 0};
  if (!s.rotate && s.kind != Kind::Random)
    return virtual_partners(s.kind, rank, s.p, step, nullptr);
  // A permutation has to be drawn anyway, so this costs what the all-ranks version costs.
  return step_partners(s, step)[rank];
}

std::vector<Partners> step_partners(const Schedule& s, int64_t step) {
  validate(s);
  check_step(step);
  const int p = s.p;
  std::vector<Partners> out(p);
  if (p == 1) return out;
  std::optional<RandomCycle> cycle;
  if (s.kind == Kind::Random) cycle.emplace(s.seed, step, p);
  const RandomCycle* c = cycle ? &*cycle : nullptr;
  if (!s.rotate) {
    for (int v = 0; v < p; ++v) out[v] = virtual_partners(s.kind, v, p, step, c);
    return out;
  }
  // Real rank v plays virtual rank virt[v]; partners found among virtual ranks map back to the
  // real ranks playing them.
  const std::vector<int> virt = rotation(s, step);
  const std::vector<int> real = inverse(virt);
  for (int v = 0; v < p; ++v) {
    const Partners w = virtual_partners(s.kind, virt[v], p, step, c);
    out[v] = {real[w.send_to], real[w.recv_from]};
    for (int i = 1; i < w.links(); ++i)
      out[v].add({real[w.link(i).send_to], real[w.link(i).recv_from]});
  }
  return out;
}

}  // namespace gg::partners
