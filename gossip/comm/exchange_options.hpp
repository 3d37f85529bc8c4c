// What a gossip exchange is asked to do: its partners, transport, threading, staleness and wire.
// Plain data (no MPI): gossip/config builds it from the [gossip] options, tests and benchmarks
// by hand.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gossip/comm/names.hpp"
#include "gossip/comm/wire.hpp"
#include "partners/schedule.hpp"

namespace gg::gossip {

// Who drives a gossip exchange's transport (see GossipExchange).
enum class Threading { Funneled, Concurrent, Chained };
inline constexpr std::pair<Threading, std::string_view> kThreadingNames[] = {
    {Threading::Funneled, "funneled"},
    {Threading::Concurrent, "concurrent"},
    {Threading::Chained, "chained"}};
constexpr std::span<const std::pair<Threading, std::string_view>> enum_names(Threading) {
  return kThreadingNames;
}
// A name of the table; throws std::invalid_argument otherwise.
Threading parse_threading(const std::string& name);

// How the buckets travel (transport.hpp, make_transport).
enum class TransportKind { Auto, Shm, Rma, P2p };
inline constexpr std::pair<TransportKind, std::string_view> kTransportNames[] = {
    {TransportKind::Auto, "auto"},
    {TransportKind::Shm, "shm"},
    {TransportKind::Rma, "rma"},
    {TransportKind::P2p, "p2p"}};
constexpr std::span<const std::pair<TransportKind, std::string_view>> enum_names(TransportKind) {
  return kTransportNames;
}
TransportKind parse_transport(const std::string& name);  // std::invalid_argument otherwise

// What a gossip exchange does with its partners' buckets: a line here (name and --help words) and
// one in exchange.cpp's table of rules (how it is made, what it sends) add a rule. average: the
// uniform mean of this rank's bucket and its partners' (the pair average for one partner a
// step), with the variants the other options choose (staleness, overlap, CHOCO, low rank).
enum class RuleKind { Average, PushSum };
inline constexpr std::pair<RuleKind, std::string_view> kRuleNames[] = {
    {RuleKind::Average, "average"}, {RuleKind::PushSum, "push-sum"}};
constexpr std::span<const std::pair<RuleKind, std::string_view>> enum_names(RuleKind) {
  return kRuleNames;
}
inline constexpr std::string_view kRuleHelp[] = {
    "average (the mean of the rank's bucket and its partners'; the other gossip options choose "
    "its variant)",
    "push-sum (SGP's rule: a weight travels with each bucket, the buffer holds values / weight; "
    "fp32 wire, staleness 0, no overlap)"};

// A parameter tensor as the low-rank rule reads it: a matrix rows x cols (a convolution's
// O x I * kernel, an inner product's out x in) or, with rows == 0, a vector of `size` values.
// block b > 0: a convolution weight stored in oneDNN's blocks, [O/b][I/b][kernel][b in][b out]
// (kernels/param_layout.hpp); its matrix is the plain one, so factors do not depend on layout.
struct MatrixView {
  int64_t begin = 0, size = 0;  // in the flat buffer
  int64_t rows = 0, cols = 0;
  int64_t kernel = 1;  // taps per (output, input) pair: cols = inputs * kernel
  int block = 0;
};

struct GossipOptions {
  partners::Schedule schedule;                    // p must equal the communicator's size
  TransportKind transport = TransportKind::Auto;  // make_transport
  Threading threading = Threading::Funneled;
  RuleKind rule = RuleKind::Average;
  int comm_threads = 2;    // concurrent only
  int staleness = 0;       // 0: wait for the partner; 1: never wait, mix what has arrived
  bool skip_late = false;  // staleness 1: a bucket not yet here this step stays unmixed
  bool delayed = false;    // start_delayed/finish_delayed: mix as a correction applied later
  bool pipelined = false;  // start_all/wait_bucket: each bucket mixed as soon as it can be
  double timeout_s = 0;    // a wait on a partner longer than this fails the step (0: never)
  Wire wire = Wire::Fp32;
  bool error_feedback = false;    // a lossy wire only
  bool stochastic = false;        // int8 / int4: stochastic rounding (wire_key of seed, rank, step)
  int stream = 0;                 // which buffer this exchanges (wire_key's stream)
  bool measure_distance = false;  // the rule adds up ||x - partner||^2 (consensus control)
  // CHOCO-SGD: the difference to public copies both partners hold travels (staleness 0 only).
  bool public_copies = false;
  // PowerGossip: a rank-`low_rank` projection of the pair's difference travels (0: off; pairs
  // only, staleness 0); `matrices` are the buffer's tensors (low_rank.hpp, matrix_views).
  int low_rank = 0;
  std::vector<MatrixView> matrices;
};

}  // namespace gg::gossip
