// Who talks to whom at step t. Pure functions of (rank, p, step, seed): no MPI, no state, so the
// trainer, the tests and the simulator all use the same code.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace gg::partners {

// The most peers a schedule may give a rank in one step.
inline constexpr int kMaxLinks = 4;

// One of a step's links: this rank sends to send_to and receives from recv_from.
struct Link {
  int send_to = 0;
  int recv_from = 0;
  bool operator==(const Link&) const = default;
};

// A rank's partners in one step: link 0 (send_to, recv_from) and, under a schedule with k peers
// a step, links 1 .. k - 1 (`more`). Within a step a rank's send_to's are distinct, and so are
// its recv_from's, and none is the rank itself (p >= 2). The weights with which a rank mixes
// what it receives: uniform unless the schedule sets others (set_weights): its own values and
// each link's 1 / (links() + 1), the pair average for one link.
struct Partners {
  int send_to = 0;
  int recv_from = 0;
  std::array<Link, kMaxLinks - 1> more{};
  int extra = 0;  // links beyond the first
  int links() const { return 1 + extra; }
  Link link(int i) const { return i == 0 ? Link{send_to, recv_from} : more[i - 1]; }
  void add(Link l) { more.at(static_cast<size_t>(extra++)) = l; }
  // Weights other than uniform: `own` for the rank's own values, links[i] for what link i's
  // recv_from sent; each positive, together 1 (within 1e-5): std::invalid_argument otherwise.
  // Set after the links.
  void set_weights(float own, std::span<const float> links);
  bool weighted = false;
  float own_weight() const { return weighted ? weights[0] : 1.f / static_cast<float>(links() + 1); }
  float weight(int i) const {
    return weighted ? weights[static_cast<size_t>(i + 1)] : 1.f / static_cast<float>(links() + 1);
  }
  std::array<float, kMaxLinks + 1> weights{};  // own, then link by link (weighted only)
  bool operator==(const Partners&) const = default;
};

// ceil(log2 p) for p >= 1 (0 for p = 1): the length of one dissemination round.
int rounds_per_cycle(int p);

// Dissemination: at step t, k = t mod ceil(log2 p); rank v sends to (v + 2^k) mod p and
// receives from (v - 2^k) mod p.
Partners dissemination(int rank, int p, int64_t step);

// The partner patterns a run can choose; see docs/gossip.md "Partner schedules". A pattern is an
// enum value, a name below and a line of schedule.cpp's table (its function, its links a step
// and the rank counts it serves).
enum class Kind { Dissemination, Hypercube, Ring, Random, Exponential2 };

// The names users write, one table: gossip.schedule's choices, parse_kind and kind_name read it.
inline constexpr std::pair<Kind, std::string_view> kKindNames[] = {
    {Kind::Dissemination, "dissemination"},
    {Kind::Hypercube, "hypercube"},
    {Kind::Ring, "ring"},
    {Kind::Random, "random"},
    {Kind::Exponential2, "exponential2"}};
constexpr std::span<const std::pair<Kind, std::string_view>> enum_names(Kind) { return kKindNames; }
// A name of the table; anything else throws std::invalid_argument with one line that lists them.
Kind parse_kind(const std::string& name);
const char* kind_name(Kind kind);

// Everything a rank needs to compute its partners at any step without talking to anyone.
// `seed` only matters for `Random` and for `rotate`; every rank must use the same value.
struct Schedule {
  Kind kind = Kind::Dissemination;
  int p = 1;
  bool rotate = false;
  uint64_t seed = 1;
};

// Throws std::invalid_argument (one line, naming the fix) if p < 1 or the kind cannot serve p
// (hypercube needs a power of two).
void validate(const Schedule& s);
// Whether validate(s) passes.
bool serves(const Schedule& s);
// Every kind of the table, in its order.
std::vector<Kind> all_kinds();

// How many links (peers) `kind` gives a rank every step at p >= 2 (1 for one-peer schedules).
int links(Kind kind);
// The patterns in a line of --help: each one's name and what it needs.
const std::string& kinds_help();

// Steps per rotation round: ceil(log2 p), at least 1. Rotation changes the virtual-rank
// permutation only at multiples of this, so a dissemination/hypercube round stays intact.
int round_length(int p);

// THE schedule: (rank, p, step, seed) -> its links. Each link of a step is a permutation (each
// rank sends once and receives once along it) with no self-sends for p >= 2; p = 1 talks to
// itself over one link.
// O(1) for unrotated dissemination/hypercube/ring, O(p) when a permutation has to be drawn.
Partners partners(const Schedule& s, int rank, int64_t step);

// partners() for every rank at once, in O(p): what the simulator and the CLI use.
std::vector<Partners> step_partners(const Schedule& s, int64_t step);

// The virtual rank each real rank plays during the round that contains `step`
// (the identity when rotation is off). Drawn from (seed, round) by a counter-based hash and
// Fisher-Yates, so it is bit-identical on every rank, compiler and platform.
std::vector<int> rotation(const Schedule& s, int64_t step);

}  // namespace gg::partners
