// The resolved settings of a training run. Every option has a dotted name that is also its INI
// key (`--train.batch 32` == `[train] batch = 32`); the command line overrides the config file.
// The initialisers below are the defaults; options.cpp declares each option once (its range and
// help), and parsing, checks, --help and to_ini follow from there.
#pragma once

#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gossip/comm/exchange_options.hpp"  // the exchanges' typed options
#include "gossip/config/algorithms.hpp"
#include "gossip/config/fault_spec.hpp"  // the grammar of the fault.* values
#include "kernels/executor.hpp"
#include "partners/schedule.hpp"
#include "shuffle/distributed.hpp"
#include "shuffle/source.hpp"

namespace gg::gossip {

// A mistake in what the user asked for: main prints the one-line message and exits 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The fixed-choice options' own values, each with its one table of names (the option's choices,
// its parsing, --help's and the errors' lists; gossip/comm/names.hpp reads them). The other
// fixed-choice options take the types of the layers that act on them: shuffle::ShuffleMode,
// kernels::Backend and Precision, partners::Kind, TransportKind, Threading, Wire, FaultStrategy.
#define GG_NAMES(E, ...)                                                         \
  inline constexpr std::pair<E, std::string_view> k##E##Names[] = {__VA_ARGS__}; \
  constexpr std::span<const std::pair<E, std::string_view>> enum_names(E) { return k##E##Names; }
// train.weight_layout: the backend's own (native) or PyTorch's (plain, kernels/param_layout.hpp).
enum class WeightLayout { Native, Plain };
GG_NAMES(WeightLayout, {WeightLayout::Native, "native"}, {WeightLayout::Plain, "plain"})
// gossip.hierarchy: none, or node (the gradients averaged in each node, then gossip over nodes).
enum class Hierarchy { None, Node };
GG_NAMES(Hierarchy, {Hierarchy::None, "none"}, {Hierarchy::Node, "node"})
// gossip.late: staleness 1, a bucket not here yet: the partner's previous one, or left unmixed.
enum class Late { Previous, Skip };
GG_NAMES(Late, {Late::Previous, "previous"}, {Late::Skip, "skip"})
// gossip.rounding: int8 and int4 wires round to nearest or stochastically.
enum class Rounding { Nearest, Stochastic };
GG_NAMES(Rounding, {Rounding::Nearest, "nearest"}, {Rounding::Stochastic, "stochastic"})
// apoptosis.criterion: a unit's outgoing weights' norm relative to its layer's mean, or plain.
enum class PruneCriterion { RelativeNorm, Norm };
GG_NAMES(PruneCriterion, {PruneCriterion::RelativeNorm, "relative_norm"},
         {PruneCriterion::Norm, "norm"})
// apoptosis.layers: which layers' units may be removed.
enum class PruneLayers { Fc, Conv, Both };
GG_NAMES(PruneLayers, {PruneLayers::Fc, "fc"}, {PruneLayers::Conv, "conv"},
         {PruneLayers::Both, "both"})
#undef GG_NAMES

struct Config {
  std::string config_path;
  struct {
    std::string source = "fashion-mnist";  // fashion-mnist | idx:DIR | imagenet:DIR | ...
    std::string dir = "/usr/share/datasets/fashion-mnist";
    std::string val_labels = "auto";  // imagenet: labels of a flat val/ (auto: DIR/val_labels.txt)
    bool augment = true;
    int prefetch = 4;
    int workers = 0;   // loader threads (0: 1 for pixel data, cores per rank for JPEG)
    int crop = 224;    // JPEG sources: output side
    int resize = 256;  // JPEG evaluation: shorter side before the centre crop
    shuffle::ShuffleMode shuffle = shuffle::ShuffleMode::Off;
    int64_t shuffle_per_step = 8;
  } data;
  struct {
    std::string name = "resnet8";
    int64_t width = 16;
    bool batch_norm = true;
  } model;
  struct {
    kernels::Backend backend = kernels::Backend::OneDnn;
    kernels::Precision precision = kernels::Precision::Fp32;  // bf16: onednn on AVX512_BF16 CPUs
    WeightLayout weight_layout = WeightLayout::Native;
    bool resident = false;       // cuda: the state stays on the GPU (kernels/train_state.hpp)
    bool deterministic = false;  // cuda: the same bits every run (CudaOptions::deterministic)
    int64_t batch = 64;          // per rank
    int64_t epochs = 4;
    double lr = 0.1;  // for a global batch of base_batch (linear scaling)
    int64_t base_batch = 256;
    double momentum = 0.9;
    double weight_decay = 5e-4;
    bool nesterov = false;
    double warmup_epochs = 0.5;
    int64_t seed = 1;       // >= 0: a uint64 option would take -1 as 2^64 - 1
    int threads = 0;        // 0: cores of this node / ranks on this node
    int64_t max_steps = 0;  // 0: every step of every epoch
    int64_t eval_batch = 500;
    std::string init_from;  // .npz with torchvision names; empty: initialise from the seed
    int64_t stop_at = 0;    // stop after this step with a checkpoint, as if preempted (0: never)
    int virtual_ranks =
        0;  // > 0: that many logical ranks in this one process (gossip/train/virtual)
    int64_t rank_eval_samples = 2000;  // virtual ranks: test samples of each rank's own top-1
    double virtual_late = 0;  // virtual ranks, staleness 1: share of (step, rank) pairs served late
  } train;
  struct {
    std::string mode = "both";  // algorithms.hpp: grad | model | both | gossipgrad | allreduce
    partners::Kind schedule = partners::Kind::Dissemination;
    bool rotate = true;
    TransportKind transport = TransportKind::Auto;
    Hierarchy hierarchy = Hierarchy::None;
    Threading threading = Threading::Funneled;
    RuleKind rule = RuleKind::Average;
    int comm_threads = 2;
    int staleness = 0;
    Late late = Late::Previous;
    bool overlap_model = true;      // weights exchanged: averaging overlapped with the next step
    bool pipeline_weights = false;  // overlap_model false: each bucket waited for in the forward
    int64_t global_every = 0;
    double consensus_bound = 0;  // > 0: a global average when the estimated distance exceeds it
    int64_t model_every = 1;     // weights exchanged: every k-th step only
    int64_t consensus_every = 50;
    int64_t bucket_kb = 512;
    Wire wire = Wire::Fp32;        // the gradients on the wire
    Wire model_wire = Wire::Fp32;  // the weights (and momentum) on the wire
    bool error_feedback = false;   // a lossy wire: carry the rounding residue into the next step
    Rounding rounding = Rounding::Nearest;
    bool choco = false;  // weights: send the difference to CHOCO-SGD's public copies
    int low_rank = 0;    // weights: > 0, PowerGossip's rank-r projection of the pair's difference
    double timeout_s = 300;  // a wait on a partner longer than this is an error (0: never)
  } gossip;
  // Neuron apoptosis: remove output units whose outgoing weights fade (gossip/train/apoptosis.hpp).
  struct {
    bool enable = false;
    PruneCriterion criterion = PruneCriterion::RelativeNorm;
    double threshold = 0.5;
    int64_t interval = 200;   // steps between decisions
    double max_share = 0.25;  // of a layer's units removed per decision at most
    PruneLayers layers = PruneLayers::Both;
    int64_t min_keep = 4;  // units a layer keeps at least
    double until = 1.0;    // decisions only in this first share of the training steps
  } apoptosis;
  struct {
    std::string dir;           // empty: no checkpoints
    int64_t every_epochs = 0;  // average model (model.npz): 0 = only at the end of training
    int64_t every = 0;         // full checkpoint every N steps (0: never)
    double every_minutes = 0;  // ... and/or every T minutes of training (0: never)
    int64_t keep = 3;          // full checkpoints kept (the newest)
    std::string resume;        // empty | auto (the newest valid one in dir, if any) | DIR
  } checkpoint;
  // Loss guard: a NaN/Inf loss on any rank restores the last in-memory snapshot on every rank
  // and scales the learning rate by lr_factor, at most nan_retries times.
  struct {
    int nan_retries = 3;  // 0: a NaN/Inf loss stops training at once
    int64_t snapshot_every = 100;
    double lr_factor = 0.5;
    // 0: every rank agrees on a NaN/Inf loss and on a stop signal after each step (a collective
    // that waits for the slowest rank); 1: that agreement completes behind the next step.
    int lag = 0;
  } guard;
  // Test hooks that inject failures; they fire only in a run that did not resume.
  struct {
    std::string kill;        // "RANK:STEP": that rank raises SIGKILL at the start of that step
    std::string stall;       // "RANK:STEP": that rank stops itself (SIGSTOP): a hung rank
    int64_t nan = -1;        // rank 0's weights become NaN at that step (-1: never)
    int64_t nan_stats = -1;  // rank 0's batch-norm running statistics become NaN at that step
    // Simulated failures (gossip/resilience/faults.hpp): "RANK:STEP,..." and/or a random plan with
    // this mean number of steps between failures (0: none), recovered by `strategy`.
    std::string inject;
    double mtbf_steps = 0;
    FaultStrategy strategy = FaultStrategy::Forward;
  } fault;
  // The cluster's network, for `gossipgrad simulate` (alpha-beta-gamma model).
  struct {
    double inter_latency_us = 2.0;      // between nodes
    double inter_bandwidth_gbs = 12.5;  // GB/s per node (its NIC)
    double intra_latency_us = 0.5;      // within a node
    double intra_bandwidth_gbs = 20.0;  // GB/s per rank within a node
    double mix_bandwidth_gbs = 50.0;    // GB/s of one operand through the local averaging
    int ranks_per_node = 1;
  } network;
  // Emulated compute (gossip/train/emulate.hpp): forward_ms or backward_ms > 0 replaces the
  // arithmetic of a training step by waiting, with the real model's buffers, buckets, exchange
  // engine and MPI traffic. For testbeds where many ranks share a few cores.
  struct {
    double forward_ms = 0;
    double backward_ms = 0;
    double update_ms = 0;
    double jitter_p99 = 1;  // lognormal factor per rank and step, median 1, this p99 (1: none)
    std::string slow;       // "RANK:FACTOR,...": persistent stragglers
  } emulate;
  // Compute per step for `gossipgrad simulate`; 0 = measure here with the configured model.
  struct {
    double forward_ms = 0;
    double backward_ms = 0;
    double update_ms = 0;
    int steps = 48;  // gossip steps averaged (several rotation rounds)
  } simulate;
  struct {
    std::string metrics = "runs/latest/metrics.jsonl";
    bool overwrite = false;
    bool progress = true;
    double interval = 2.0;         // seconds between progress lines
    std::string timeline;          // Chrome trace events of the run (empty: none)
    int64_t timeline_steps = 100;  // steps recorded from the start (then it stops recording)
    std::string samples;           // debug: PATH.<rank> gets every step's sample ids (empty: none)
    std::string losses;            // debug: PATH.<rank> gets every step's loss, exactly (hex)
  } log;
};

// The algorithm gossip.mode names (algorithms.hpp): outside gossip/config no code compares the
// option's strings.
const Algorithm& mixing_of(const Config& c);

// The options of one of a rank's exchanges, for real ranks and virtual ones alike (the schedule is
// the caller's): which buffer it mixes decides the wire, delayed mixing and the distance measure.
enum class Mixed { Grads, Weights, Momentum };
GossipOptions exchange_options(const Config& c, Mixed what);

// train.weight_layout = plain: the weights stay in PyTorch's layout (not the backend's own).
inline bool plain_weights(const Config& c) { return c.train.weight_layout == WeightLayout::Plain; }

// When the weights travel and when the ranks are averaged exactly (gossip.model_every,
// gossip.global_every), asked alike by real ranks (Trainer) and virtual ones. Steps count from 0;
// "after step s" is after its update.
struct Cadence {
  int64_t model_every = 1, global_every = 0;
  bool allreduce = false;  // no weight exchange, no global average: the gradients are exact
  // The weights' exchange follows step s's update.
  bool weights_after(int64_t s) const { return (s + 1) % model_every == 0; }
  // Weight exchanges are numbered in rounds, one every model_every steps, so that transports and
  // the partner schedule see consecutive numbers: the round of step s.
  int64_t round(int64_t s) const { return s / model_every; }
  // Rounds in `steps` steps (the weight exchanges a run of that many steps makes at most).
  int64_t rounds(int64_t steps) const { return (steps + model_every - 1) / model_every; }
  // The exact global average follows step s.
  bool global_after(int64_t s) const {
    return !allreduce && global_every > 0 && (s + 1) % global_every == 0;
  }
};
Cadence cadence_of(const Config& c);

// The small nets (resnet8, cnn: 28x28 inputs, their width and batch-norm options) against
// torchvision's.
bool small_model(const Config& c);

// The other options' values that code outside gossip/config acts on, typed here.
inline kernels::Backend backend_of(const Config& c) { return c.train.backend; }
inline kernels::Precision precision_of(const Config& c) { return c.train.precision; }
// data.source and data.dir as the loader's spec (checked by the option's grammar already).
shuffle::SourceSpec data_source(const Config& c);
bool fashion_mnist(const Config& c);           // data.source = fashion-mnist (the idx files in dir)
std::string val_labels_file(const Config& c);  // data.val_labels; "" for auto
bool resume_auto(const Config& c);             // checkpoint.resume = auto
// [apoptosis]: the criterion relative_norm (not norm); the layer kinds it may prune.
bool apoptosis_relative(const Config& c);
bool apoptosis_prunes_conv(const Config& c);
bool apoptosis_prunes_fc(const Config& c);

// The ranks a run trains over `processes` processes: theirs, or train.virtual_ranks in one.
inline int run_ranks(const Config& c, int processes) {
  return c.train.virtual_ranks > 0 ? c.train.virtual_ranks : processes;
}

// Whether [emulate] replaces the training arithmetic by waiting.
inline bool emulated(const Config& c) {
  return c.emulate.forward_ms > 0 || c.emulate.backward_ms > 0;
}

// Parses `gossipgrad train` arguments (without the subcommand): the command line over the
// --config INI file over Config's defaults. Throws UsageError with one line naming the option
// and the problem for unknown keys, wrong types, out-of-range values and options that contradict
// each other. It reads no file but the config file: whether this machine can run the result
// (its data, weights, checkpoint folder, output files, backend) is gossip/train/preflight.hpp.
Config parse_train_args(const std::vector<std::string>& args);

// The rules that need the job's rank count (the gossip schedule, the ranks named by fault.kill,
// fault.stall, fault.inject and emulate.slow, fault.mtbf_steps): a real run checks them before
// anything else, --dry-run at the rank count it was launched with. `supervised_restart`: a
// restart by gossipgrad supervise, possibly at fewer ranks, where fault.kill and fault.stall
// never fire (test_hooks.hpp) and so bound nothing. Throws UsageError.
void check_ranks(const Config& c, int ranks, bool supervised_restart = false);

// A state kept apart from the host (train.resident, or `what` naming the test stand-in): the
// exchanges mix its host copies between steps (or, overlapped, a snapshot of them), so
// pipeline_weights (which mixes inside the next forward), emulated compute and virtual ranks are
// refused. Throws UsageError.
void check_resident(const Config& c, const std::string& what);

// The partner schedule the config describes for `p` participants (ranks, or nodes with
// gossip.hierarchy = node); std::invalid_argument (partners::validate) when it cannot serve p.
partners::Schedule schedule_of(const Config& c, int p);

// fault.strategy forward: the survivors go on with the same settings after each failure of
// `plan`; their counts must suit them (the gossip schedule's rank counts; gossip.hierarchy = node
// needs as many ranks on every node, so no failure when a node holds several; `ranks_on_node` 0:
// not known yet, not checked). Throws UsageError naming the first count that does not.
void check_forward_survivors(const Config& c, int ranks, int ranks_on_node,
                             const std::vector<FaultEvent>& plan);

// Settings given a value other than their default where, in this run, they change nothing: one
// line each, for a warning. (What would change a result a user expects is refused instead.)
std::vector<std::string> inert_settings(const Config& c);

// The help text of `gossipgrad train`: every option, its default and what it does.
std::string train_help();

// The resolved settings as INI text that parse_train_args accepts back.
std::string to_ini(const Config& c);

}  // namespace gg::gossip
