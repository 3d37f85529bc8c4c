// `gossipgrad partners`: who talks to whom at each step of a partner schedule, as a table or JSON,
// and how fast the schedule mixes (diffusion steps, deviation from the average, contraction).
#include <algorithm>
#include <boost/program_options.hpp>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "gossip/cli/args.hpp"
#include "gossip/cli/commands.hpp"
#include "gossip/config/config.hpp"
#include "partners/schedule.hpp"
#include "partners/simulator.hpp"

namespace gg::gossip {
namespace {

namespace gp = gg::partners;
namespace po = boost::program_options;

// What the command line asks for: the schedule, how many of its steps to print, and how.
struct PartnersRequest {
  gp::Schedule s;
  int64_t steps = 0;
  bool json = false;
};

// The request the options name, checked, or nothing after printing --help.
std::optional<PartnersRequest> parse_partners_args(const std::vector<std::string>& args) {
  int64_t ranks = 0;
  int64_t steps = 0;
  std::string kind = "dissemination";
  std::string seed_text = "1";
  bool rotate = false;
  bool json = false;
  po::options_description d("partners options");
  d.add_options()("help", "this help")("ranks", po::value(&ranks)->required(),
                                       "rank count P, 1..65536")(
      "schedule", po::value(&kind)->default_value(kind), gp::kinds_help().c_str())(
      "rotate", po::bool_switch(&rotate), "permute the virtual ranks every ceil(log2 P) steps")(
      "steps", po::value(&steps), "steps to print, 1..100000 (default ceil(log2 P), at least 1)")(
      "seed", po::value(&seed_text)->default_value(seed_text),
      "seed of the rotation and of the random schedule")("json", po::bool_switch(&json),
                                                         "print JSON");
  po::variables_map vm;
  if (!parse_options(args, d,
                     "usage: gossipgrad partners --ranks P [--schedule S] [--rotate] [--steps T] "
                     "[--seed N] [--json]",
                     vm, Prefixes::kTaken))
    return std::nullopt;
  if (ranks < 1 || ranks > 65536)
    throw UsageError("--ranks " + std::to_string(ranks) + " must be in [1, 65536]");
  PartnersRequest r;
  r.s.p = static_cast<int>(ranks);
  r.s.rotate = rotate;
  r.s.seed = parse_unsigned(seed_text, "--seed");
  try {
    r.s.kind = gp::parse_kind(kind);
    gp::validate(r.s);
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
  if (!vm.count("steps"))
    steps = gp::round_length(r.s.p);
  else if (steps < 1 || steps > 100000)
    throw UsageError("--steps " + std::to_string(steps) + " must be in [1, 100000]");
  r.steps = steps;
  r.json = json;
  return r;
}

// The step budget for the diffusion search: enough for every schedule at small P (a ring needs
// P - 1 steps), bounded by about 2^33 bitset word operations at large P so the command answers
// in seconds; -1 is reported beyond it.
int diffusion_search_limit(int p) {
  const int64_t words_per_step = int64_t{p} * ((p + 63) / 64);
  const int64_t by_work = (int64_t{1} << 33) / words_per_step;
  return static_cast<int>(
      std::min<int64_t>(100000, std::max<int64_t>(4 * gp::round_length(p), by_work)));
}

void print_partners_json(const gp::Schedule& s, int64_t steps, int diffusion) {
  // Streamed step by step: --ranks 65536 --steps 100000 must not build the document in memory.
  // Keys in the documented order, no others.
  std::cout << "{\"ranks\":" << s.p << ",\"schedule\":" << nlohmann::json(gp::kind_name(s.kind))
            << ",\"steps\":[";
  for (int64_t t = 0; t < steps; ++t) {
    nlohmann::json send = nlohmann::json::array(), recv = nlohmann::json::array();
    // A rank's peer, or with k links a step the list of its peers in link order.
    for (const gp::Partners& q : gp::step_partners(s, t)) {
      if (q.links() == 1) {
        send.push_back(q.send_to);
        recv.push_back(q.recv_from);
        continue;
      }
      nlohmann::json to = nlohmann::json::array(), from = nlohmann::json::array();
      for (int i = 0; i < q.links(); ++i) {
        to.push_back(q.link(i).send_to);
        from.push_back(q.link(i).recv_from);
      }
      send.push_back(to);
      recv.push_back(from);
    }
    std::cout << (t ? "," : "") << "{\"step\":" << t << ",\"send_to\":" << send.dump()
              << ",\"recv_from\":" << recv.dump() << "}";
  }
  std::cout << "],\"diffusion_steps\":" << diffusion << "}\n";
}

// Wide schedules keep the first 8 and the last 2 ranks so a row stays on one line.
bool trimmed(const gp::Schedule& s) { return s.p > 12; }

// " v->send_to" (" v->a,b" with several links) for every rank shown at step t.
std::string table_row(const gp::Schedule& s, int64_t t) {
  const std::vector<gp::Partners> who = gp::step_partners(s, t);
  std::string row;
  for (int v = 0; v < s.p; ++v) {
    if (trimmed(s) && v == 8) {
      row += " ...";
      v = s.p - 3;
      continue;
    }
    row += ' ';
    row += std::to_string(v);
    row += "->";
    for (int i = 0; i < who[v].links(); ++i) {
      if (i) row += ',';
      row += std::to_string(who[v].link(i).send_to);
    }
  }
  return row;
}

void print_partners_table(const gp::Schedule& s, int64_t steps) {
  std::printf("%s schedule, %d ranks, rotation %s, seed %llu\n", gp::kind_name(s.kind), s.p,
              s.rotate ? "on" : "off", static_cast<unsigned long long>(s.seed));
  if (trimmed(s)) std::printf("(ranks 8..%d not shown)\n", s.p - 3);
  std::printf("%6s  rank->send_to\n", "step");
  for (int64_t t = 0; t < steps; ++t)
    std::printf("%6lld %s\n", static_cast<long long>(t), table_row(s, t).c_str());
}

// How fast the schedule mixes: diffusion, deviation after one round, contraction per round.
void print_mixing(const gp::Schedule& s, int diffusion, int limit) {
  const int round = gp::round_length(s.p);
  std::printf("\n");
  if (diffusion >= 0)
    std::printf("diffusion: every rank holds weight from every rank after %d steps\n", diffusion);
  else
    std::printf("diffusion: not every rank reached within %d steps\n", limit);
  std::printf("deviation from the average after %d steps: %.3e (relative to the start)\n", round,
              gp::deviation_from_average(s, round));
  constexpr int kRounds = 4;
  std::printf("consensus distance shrinks by %.4g per round of %d steps (mean of %d rounds)\n",
              gp::contraction_per_round(s, kRounds), round, kRounds);
}

}  // namespace

int cmd_partners(const std::vector<std::string>& args) {
  const std::optional<PartnersRequest> r = parse_partners_args(args);
  if (!r) return 0;
  const int limit = diffusion_search_limit(r->s.p);
  const int diffusion = gp::diffusion_steps(r->s, limit);
  if (r->json) {
    print_partners_json(r->s, r->steps, diffusion);
  } else {
    print_partners_table(r->s, r->steps);
    print_mixing(r->s, diffusion, limit);
  }
  return 0;
}

}  // namespace gg::gossip
