#include "gossip/config/options.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <type_traits>
#include <utility>

#include "gossip/config/algorithms.hpp"
#include "gossip/config/fault_spec.hpp"
#include "kernels/models.hpp"
#include "shuffle/source.hpp"

namespace gg::gossip {
namespace {

constexpr double kNoEnd = std::numeric_limits<double>::infinity();

constexpr Bound incl(double v) { return {v, nullptr, false}; }
constexpr Bound excl(double v) { return {v, nullptr, true}; }
constexpr Bound value_of(const char* key) { return {0, key, false}; }
constexpr Range in(double lo, double hi) { return {incl(lo), incl(hi)}; }
constexpr Range at_least(double lo) { return {incl(lo), incl(kNoEnd)}; }

// The grammars of the string options that are not a fixed list.
void check_source(const std::string& key, const std::string& v) {
  try {
    shuffle::parse_source(v, "data.dir");  // the folder itself: gossip/train/preflight
  } catch (const std::invalid_argument& e) {
    throw UsageError(key + " = " + v + ": " + e.what());
  }
}
void check_model(const std::string& key, const std::string& v) {
  const auto names = kernels::model_names();
  if (std::find(names.begin(), names.end(), v) != names.end()) return;
  std::string list;
  for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
  throw UsageError(key + " = " + v + " is unknown: use one of " + list);
}
void check_rank_step(const std::string& key, const std::string& v) {
  if (!v.empty()) parse_fault_kill(v, key.c_str());
}
void check_inject(const std::string&, const std::string& v) {
  if (!v.empty()) parse_fault_inject(v);
}
void check_slow(const std::string&, const std::string& v) { parse_emulate_slow(v); }
void check_file_name(const std::string& key, const std::string& v) {
  if (v.empty()) throw UsageError(key + " must name a file");
}

// gossip.mode: the algorithms' registry (algorithms.hpp) gives the values and their help.
Choices mode_choices() {
  Choices c;
  for (const Algorithm& a : algorithms()) c.values.push_back(a.name);
  return c;
}
std::string_view rules_help() {
  static const std::string help = [] {
    std::string h = "what a rank does with its partners' buckets: ";
    for (size_t i = 0; i < std::size(kRuleHelp); ++i)
      h += (i ? "; " : "") + std::string(kRuleHelp[i]);
    return h;
  }();
  return help;
}
std::string_view mode_help() {
  static const std::string help = [] {
    std::string h;
    for (const Algorithm& a : algorithms())
      h += (h.empty() ? "" : "; ") + std::string(a.name) + ": " + std::string(a.help);
    return h;
  }();
  return help;
}

// clang-format off
// The key is the field's path in Config, written once: GG_OPTION(train.batch) gives the key
// "train.batch" and the accessor of c.train.batch.
#define GG_OPTION(path) #path, [](Config& c) -> auto& { return c.path; }

void data_options(std::vector<Option>& o) {
  o.insert(o.end(), {
    {GG_OPTION(data.source), Grammar{check_source},
     "where the samples come from: fashion-mnist (the idx files in data.dir), idx:DIR, "
     "imagenet:DIR (train/<wnid>/*.JPEG, val/), shards:DIR (shard-*.tar from gossipgrad pack; "
     "DIR/train and DIR/val if present), synthetic:CxHxW[:classes[:count]] (generated on the "
     "fly, no evaluation)"},
    {GG_OPTION(data.dir), {},
     "data.source = fashion-mnist: the folder with the idx files of Fashion-MNIST or MNIST (gz "
     "or plain)"},
    {GG_OPTION(data.val_labels), {},
     "imagenet: labels of a flat val/ folder, lines '<file> <wnid or index>' "
     "(auto: DIR/val_labels.txt)"},
    {GG_OPTION(data.augment), {},
     "training augmentation: pixel data random crop (pad 2) + flip; JPEG RandomResizedCrop "
     "(scale 0.08-1, ratio 3/4-4/3) + flip"},
    {GG_OPTION(data.prefetch), in(1, 64), "ready batches queued by the loader threads"},
    {GG_OPTION(data.workers), in(0, 64),
     "loader threads per rank (0: 1 for pixel data; for JPEG this node's cores / its ranks, "
     "kept within [2, 8])"},
    {GG_OPTION(data.crop), in(8, 1024), "JPEG sources: side of the square input"},
    {GG_OPTION(data.resize), Range{value_of("data.crop"), incl(4096)},
     "JPEG evaluation: shorter side before the centre crop"},
    {GG_OPTION(data.shuffle), {},
     "off: every epoch a fresh global permutation (every rank reads all data); ids: each rank "
     "owns samples and gives data.shuffle_per_step of each batch to a rotating partner (shared "
     "storage); bytes: the same with the encoded samples travelling over MPI (node-local "
     "storage)"},
    {GG_OPTION(data.shuffle_per_step), at_least(0),
     "samples each rank gives away (and receives) per step with data.shuffle ids or bytes; at "
     "most train.batch"},
  });
}

void model_options(std::vector<Option>& o) {
  o.insert(o.end(), {
    {GG_OPTION(model.name), Grammar{check_model},
     "network: resnet8 (small residual CNN) or cnn, for 28x28/32x32 inputs; or torchvision's "
     "resnet18, resnet34, resnet50, resnet101, resnet152 or googlenet"},
    {GG_OPTION(model.width), in(1, 1024), "resnet8 and cnn: channels of the first stage"},
    {GG_OPTION(model.batch_norm), {},
     "resnet8 and cnn: batch norm after each convolution (false: the convolutions get a bias "
     "instead); the torchvision models always have it"},
  });
}

void train_options(std::vector<Option>& o) {
  o.insert(o.end(), {
    {GG_OPTION(train.backend), {},
     "kernels: onednn (fast CPU), reference (plain C++ oracle) or cuda (cuDNN + cuBLAS, one GPU "
     "per rank)"},
    {GG_OPTION(train.precision), {},
     "activations and conv arithmetic: fp32, or bf16 (cuda, or onednn on CPUs with AVX512_BF16 "
     "or AMX; weights, gradients and the exchange stay fp32)"},
    {GG_OPTION(train.weight_layout), {},
     "native: onednn keeps convolution weights in its blocked layout between steps (no reorder "
     "per step; states and exports stay plain); plain: PyTorch's layout, reordered every step"},
    {GG_OPTION(train.resident), {},
     "cuda: the state stays on the GPU, exchanged over CUDA IPC on one node, else host-staged; "
     "the loss is reported a step late; not yet run on a GPU, so off (docs/gpu.md)"},
    {GG_OPTION(train.deterministic), {},
     "cuda: the same bits every run, for exact resume (cuDNN's deterministic algorithms)"},
    {GG_OPTION(train.batch), in(1, 65536), "samples per rank per step"},
    {GG_OPTION(train.epochs), in(1, 100000), "passes over the training set"},
    {GG_OPTION(train.lr), Range{excl(0), incl(100)},
     "peak learning rate for a global batch of train.base_batch, scaled linearly to the run's "
     "global batch (ranks x train.batch)"},
    {GG_OPTION(train.base_batch), at_least(1), "global batch that train.lr is quoted for"},
    {GG_OPTION(train.momentum), Range{incl(0), excl(1)}, "SGD momentum"},
    {GG_OPTION(train.weight_decay), Range{incl(0), excl(1)}, "L2 weight decay"},
    {GG_OPTION(train.nesterov), {}, "Nesterov momentum"},
    {GG_OPTION(train.warmup_epochs), Range{incl(0), value_of("train.epochs")},
     "linear learning-rate warm-up over this many epochs, then cosine decay to 0 by the end of "
     "training"},
    {GG_OPTION(train.seed), at_least(0),
     "seed of initialisation, data order, augmentation, partner rotation and random simulated "
     "failures"},
    {GG_OPTION(train.threads), in(0, 1024),
     "compute threads per rank (0: this node's cores / its ranks)"},
    {GG_OPTION(train.max_steps), at_least(0),
     "stop after this many steps; the learning-rate schedule ends there (0: run every epoch)"},
    {GG_OPTION(train.eval_batch), in(1, 65536), "batch of the evaluation pass"},
    {GG_OPTION(train.init_from), {},
     "start from these weights (.npz with torchvision state_dict names, e.g. from gossipgrad "
     "export) instead of a random initialisation; empty: random"},
    {GG_OPTION(train.stop_at), at_least(0),
     "stop after this many steps with a full checkpoint, as if preempted; the learning-rate "
     "schedule still spans the whole run (0: never)"},
    {GG_OPTION(train.virtual_ranks), in(0, 4096),
     "VIRTUAL ranks: this one process (launched without mpirun) runs this many logical ranks, "
     "each with its own weights, momentum, gradients, batch-norm statistics, wire residues and "
     "data shard, mixed by the same rules and partner schedule as real ranks, one after the other "
     "on one network (memory: ranks x the per-rank state); what p ranks would learn, without p "
     "machines (0: off, the ranks are mpirun's)"},
    {GG_OPTION(train.rank_eval_samples), at_least(0),
     "virtual ranks: after the last step each rank's own model is also evaluated on the first "
     "this many test samples (whole evaluation batches), for the min / median / max top-1 over "
     "the ranks (0: only the ranks' average model)"},
    {GG_OPTION(train.virtual_late), in(0, 1),
     "virtual ranks with gossip.staleness 1: the share of (step, rank) pairs in which the "
     "partner's buckets arrive after the rank's step has ended (it then mixes the partner's "
     "previous ones, or none with gossip.late skip), drawn from a hash of train.seed, the step "
     "and the rank: the same draws every run (0: every partner on time)"},
  });
}

void gossip_options(std::vector<Option>& o) {
  o.insert(o.end(), {
    {GG_OPTION(gossip.mode), mode_choices(), mode_help()},
    {GG_OPTION(gossip.schedule), {}, partners::kinds_help()},
    {GG_OPTION(gossip.rotate), {},
     "permute the virtual ranks every ceil(log2 p) steps (seeded, no communication)"},
    {GG_OPTION(gossip.transport), {},
     "how buckets reach the partner: auto (shm between ranks on the same node, p2p between "
     "nodes), shm (stores into an MPI shared-memory window; every rank on one node), rma "
     "(passive-target MPI one-sided: MPI_Put into the partner's window, then a per-bucket "
     "flag), p2p (MPI_Isend/MPI_Irecv)"},
    {GG_OPTION(gossip.hierarchy), {},
     "node: every bucket is averaged exactly inside each node (shared memory), then gossiped "
     "between nodes, local rank l with local rank l of the partner node (1/K of the bucket "
     "each, the schedule over nodes); mode grad, fp32 wire, staleness 0, even nodes. none: "
     "every rank gossips with its own partner"},
    {GG_OPTION(gossip.threading), {},
     "funneled (one communication thread), concurrent (gossip.comm_threads threads, "
     "MPI_THREAD_MULTIPLE), chained (one thread, one bucket at a time in bucket order)"},
    {GG_OPTION(gossip.comm_threads), in(1, 64),
     "communication threads with gossip.threading = concurrent"},
    {GG_OPTION(gossip.staleness), in(0, 1),
     "0: wait for the partner; 1: never wait, mix the partner's latest bucket (this step's or "
     "the previous one's)"},
    {GG_OPTION(gossip.late), {},
     "staleness 1, a partner's bucket that has not arrived when the optimizer needs it: "
     "previous mixes the one it sent the step before; skip leaves the bucket unmixed this step "
     "(both counted in the step metrics)"},
    {GG_OPTION(gossip.overlap_model), {},
     "model/both/gossipgrad: exchange the weights behind the next step and apply the correction "
     "(w_partner - w_sent) / 2 before its update, instead of waiting after each update"},
    {GG_OPTION(gossip.pipeline_weights), {},
     "with overlap_model = false: the weights mixed after the update (the same numbers), each "
     "bucket waited for in the next forward just before the first layer that reads it; with no "
     "gradient exchange (model, gossipgrad) each bucket is also updated and sent as soon as "
     "backward has its gradients, behind the rest of backward"},
  });
}

// [gossip], continued: how often and how exactly the ranks are brought together, and the wire.
void gossip_mixing_options(std::vector<Option>& o) {
  // Apart from the list below: one more entry in it makes GCC 12 warn of an uninitialised variant.
  o.emplace_back(GG_OPTION(gossip.rule), Rule{}, rules_help());
  o.insert(o.end(), {
    {GG_OPTION(gossip.global_every), at_least(0),
     "every mode but allreduce: exact global average of the weights (and batch-norm statistics) every H "
     "steps (0: never)"},
    {GG_OPTION(gossip.consensus_bound), at_least(0),
     "model/both/gossipgrad, consensus control: after each weight exchange every rank adds up "
     "||w - w_partner||^2 over what it received and its own ||w||^2, the ranks sum both (one "
     "16-byte allreduce), and when the relative estimate sum ||w - w_partner||^2 / (2 sum "
     "||w||^2) exceeds this bound they take an exact global average of the weights and "
     "batch-norm statistics, counted in the metrics (0: off)"},
    {GG_OPTION(gossip.model_every), in(1, 1000000),
     "model/both/gossipgrad: the weights are exchanged with the partner every k-th step only (the "
     "gradients of both still every step); 1: every step"},
    {GG_OPTION(gossip.consensus_every), at_least(0),
     "measure the consensus distance every N steps (0: only at evaluation)"},
    {GG_OPTION(gossip.bucket_kb), in(1, 4194304),
     "bucket size in KiB (gradients and weights are exchanged bucket by bucket); a gradient "
     "bucket is exchanged as soon as backward completes it"},
    {GG_OPTION(gossip.wire), {},
     "grad/both: gradient buckets travel as fp32, as bf16 (rounded to bfloat16: half the "
     "bytes), or quantized in blocks of 64 values with a scale each: int8 (0.27x fp32's bytes) "
     "or int4 (0.14x); mixed in fp32, on every transport"},
    {GG_OPTION(gossip.model_wire), {},
     "model/both/gossipgrad: the weight (and momentum) buckets travel as fp32, bf16, int8 or int4 "
     "(as gossip.wire)"},
    {GG_OPTION(gossip.error_feedback), {},
     "with a bf16, int8 or int4 wire: what rounding took off a value is added to it before the "
     "next step's rounding (error feedback), so nothing is lost for good"},
    {GG_OPTION(gossip.rounding), {},
     "the int8 and int4 wires: each value rounded to the nearest level (ties to even), or "
     "stochastically, down or up with the probability of its distance to the level below "
     "(unbiased; the draws a hash of the run's seed, the rank, the step and the value's place, "
     "so a resumed run rounds alike)"},
    {GG_OPTION(gossip.choco), {},
     "model/both/gossipgrad with a lossy gossip.model_wire: CHOCO-SGD's public copies "
     "(Koloskova et al. 2019): each rank keeps, per partner, a copy of its weights as that "
     "partner knows them and one of the partner's; a weight exchange sends the difference "
     "between the weights and the copy (quantized, it shrinks as the ranks agree), both ends "
     "add it to their copy, and a rank moves by half the difference of the two copies. Memory: "
     "two model copies per partner the schedule gives (2 log2 p with dissemination); needs "
     "gossip.rotate = false, a fixed schedule and staleness 0"},
    {GG_OPTION(gossip.low_rank), in(0, 64),
     "model/both/gossipgrad: PowerGossip (Vogels et al. 2020) with this rank r (0: off): a pair "
     "of partners mixes a rank-r approximation of the difference of each weight matrix, found "
     "by a power iteration warm-started across their meetings (one half-step a meeting, X Q "
     "and X^T P in turn); biases, batch norm and small matrices travel whole and are averaged. "
     "About r (rows + cols) / 2 values a matrix instead of rows x cols. Needs "
     "gossip.schedule = hypercube (pairs), gossip.rotate = false and staleness 0"},
    {GG_OPTION(gossip.timeout_s), in(0, 1e6),
     "a rank waiting on another rank longer than this many seconds (its gossip partner, or any "
     "collective: allreduce mode, evaluation, checkpoints, the shuffle) names the wait and the "
     "step, and the job stops; a SIGTERM not taken up within max(60, 2x this) ends a rank "
     "(0: wait forever)"},
  });
}

void apoptosis_options(std::vector<Option>& o) {
  o.insert(o.end(), {
    {GG_OPTION(apoptosis.enable), {},
     "neuron apoptosis: every apoptosis.interval steps the ranks agree on conv channels / fc "
     "neurons whose outgoing weights faded and remove them from the network"},
    {GG_OPTION(apoptosis.criterion), {},
     "score of a unit, the L2 norm of its outgoing weights averaged over the ranks: "
     "relative_norm (divided by the mean of its layer) or norm"},
    {GG_OPTION(apoptosis.threshold), Range{incl(0), excl(1e6)},
     "units scoring below this are removed"},
    {GG_OPTION(apoptosis.interval), in(1, 1e9), "steps between decisions"},
    {GG_OPTION(apoptosis.max_share), Range{excl(0), incl(1)},
     "at most this share of a layer's units goes per decision (lowest scores first)"},
    {GG_OPTION(apoptosis.layers), {},
     "fc, conv or both; only layers whose units reach no residual add, concat or output"},
    {GG_OPTION(apoptosis.min_keep), in(1, 1e9), "units every layer keeps at least"},
    {GG_OPTION(apoptosis.until), Range{excl(0), incl(1)},
     "decide only within this first share of the training steps; the rest trains the shrunk "
     "model"},
  });
}

void checkpoint_options(std::vector<Option>& o) {
  o.insert(o.end(), {
    {GG_OPTION(checkpoint.dir), {},
     "folder for checkpoints: the ranks' average model (model.npz + meta.json, rank 0) and full "
     "checkpoints (ckpt-<step>/: every rank's state, a manifest written last); empty: none. An "
     "existing checkpoint there is refused unless log.overwrite or checkpoint.resume"},
    {GG_OPTION(checkpoint.every_epochs), at_least(0),
     "also write the average model after every N epochs (0: only at the end of training)"},
    {GG_OPTION(checkpoint.every), at_least(0), "full checkpoint every N steps (0: never)"},
    {GG_OPTION(checkpoint.every_minutes), at_least(0),
     "full checkpoint every T minutes of training (0: never)"},
    {GG_OPTION(checkpoint.keep), in(1, 1000), "full checkpoints kept, the newest"},
    {GG_OPTION(checkpoint.resume), {},
     "resume from a full checkpoint: auto (the newest valid one in checkpoint.dir; none: start "
     "afresh), or a folder (a checkpoint.dir or one ckpt-<step>); corrupt ones are skipped"},
  });
}

void guard_options(std::vector<Option>& o) {
  o.insert(o.end(), {
    {GG_OPTION(guard.nan_retries), in(0, 100),
     "a NaN/Inf loss restores the last in-memory snapshot and lowers the learning rate, at most "
     "this many times; then training stops (0: stop at once)"},
    {GG_OPTION(guard.snapshot_every), in(1, 1000000),
     "steps between in-memory snapshots for the NaN guard"},
    {GG_OPTION(guard.lr_factor), Range{excl(0), incl(1)},
     "learning-rate scale applied at each NaN restore"},
    {GG_OPTION(guard.lag), in(0, 1),
     "0: after each step every rank agrees on a NaN/Inf loss and on a stop signal (a collective "
     "that waits for the slowest rank); 1: that agreement runs behind the next step, so no step "
     "waits for the slowest rank, and a NaN is acted on, a signal obeyed, one step later (still "
     "at once before snapshots, evaluations, checkpoints and the last step)"},
  });
}

void fault_options(std::vector<Option>& o) {
  o.insert(o.end(), {
    {GG_OPTION(fault.kill), Grammar{check_rank_step},
     "test hook RANK:STEP: that rank kills itself with SIGKILL at that step (not in a resumed "
     "run, nor in a restart by gossipgrad supervise)"},
    {GG_OPTION(fault.stall), Grammar{check_rank_step},
     "test hook RANK:STEP: that rank stops (SIGSTOP) at that step, a hung rank for "
     "gossip.timeout_s (same conditions as fault.kill)"},
    {GG_OPTION(fault.nan), at_least(-1),
     "test hook: rank 0's weights become NaN at the start of this step (-1: never; same "
     "conditions as fault.kill)"},
    {GG_OPTION(fault.nan_stats), at_least(-1),
     "test hook: rank 0's batch-norm running statistics become NaN at the start of this step, "
     "weights that went bad while the loss stays finite (training forwards do not read them; "
     "-1: never; same conditions as fault.kill)"},
    {GG_OPTION(fault.inject), Grammar{check_inject},
     "simulated failures RANK:STEP[,RANK:STEP...]: that rank fails at the boundary before that "
     "step and is recovered by fault.strategy"},
    {GG_OPTION(fault.mtbf_steps), at_least(0),
     "random simulated failures: mean steps between failures (exponential gaps, victims uniform "
     "among the live ranks, drawn from train.seed identically on every rank; 0: none)"},
    {GG_OPTION(fault.strategy), {},
     "recovery from a simulated failure: restart (every rank reloads the last full checkpoint "
     "or the initial state), rollback (the failed rank takes a live rank's state, the step is "
     "redone), forward (the survivors carry on)"},
  });
}

void network_options(std::vector<Option>& o) {
  o.insert(o.end(), {
    {GG_OPTION(network.inter_latency_us), Range{incl(0), excl(1e6)},
     "simulate: latency between nodes, microseconds"},
    {GG_OPTION(network.inter_bandwidth_gbs), Range{excl(0), excl(1e9)},
     "simulate: bandwidth of a node's network link, GB/s, shared by its ranks"},
    {GG_OPTION(network.intra_latency_us), Range{incl(0), excl(1e6)},
     "simulate: latency within a node, microseconds"},
    {GG_OPTION(network.intra_bandwidth_gbs), Range{excl(0), excl(1e9)},
     "simulate: bandwidth between two ranks of a node, GB/s"},
    {GG_OPTION(network.mix_bandwidth_gbs), Range{excl(0), excl(1e9)},
     "simulate: GB/s of one operand through the local averaging or reduction"},
    {GG_OPTION(network.ranks_per_node), in(1, 4096),
     "simulate, and virtual ranks with gossip.hierarchy = node: ranks per node (consecutive "
     "ranks share a node)"},
  });
}

void emulate_options(std::vector<Option>& o) {
  o.insert(o.end(), {
    {GG_OPTION(emulate.forward_ms), Range{incl(0), excl(1e7)},
     "emulated compute (testbeds where many ranks share few cores): forward_ms or backward_ms "
     "> 0 replaces each step's arithmetic by waiting, with the real model's buffers, buckets, "
     "exchanges and MPI traffic; the model gets its usual input (ImageNet for the torchvision "
     "nets), the data is only counted, and no accuracy is reported. This: the forward wait, ms"},
    {GG_OPTION(emulate.backward_ms), Range{incl(0), excl(1e7)},
     "emulated backward, ms: bucket i is handed to the exchange when this share of it has "
     "passed: (bytes of buckets 0..i) / (all bytes), the rule of gossipgrad simulate"},
    {GG_OPTION(emulate.update_ms), Range{incl(0), excl(1e7)},
     "emulated optimizer step, ms (the real one is skipped)"},
    {GG_OPTION(emulate.jitter_p99), Range{incl(1), incl(100)},
     "every rank's compute times of a step are multiplied by a lognormal factor with median 1 "
     "and this 99th percentile, drawn per rank and step from train.seed (1: none)"},
    {GG_OPTION(emulate.slow), Grammar{check_slow},
     "persistent stragglers, RANK:FACTOR,... (e.g. 3:1.5): that rank's compute times are "
     "multiplied by FACTOR every step (empty: none)"},
  });
}

void simulate_options(std::vector<Option>& o) {
  o.insert(o.end(), {
    {GG_OPTION(simulate.forward_ms), Range{incl(0), excl(1e9)},
     "simulate: forward time per step on one rank, ms (forward_ms and backward_ms both 0: all "
     "three times are measured here)"},
    {GG_OPTION(simulate.backward_ms), Range{incl(0), excl(1e9)},
     "simulate: backward time per step, ms"},
    {GG_OPTION(simulate.update_ms), Range{incl(0), excl(1e9)},
     "simulate: optimizer step time, ms"},
    {GG_OPTION(simulate.steps), in(1, 100000),
     "simulate: gossip steps averaged per prediction"},
  });
}

void log_options(std::vector<Option>& o) {
  o.insert(o.end(), {
    {GG_OPTION(log.metrics), Grammar{check_file_name},
     "JSON Lines metrics file, written by rank 0 (a resumed run appends to it); in a folder "
     "named latest (the default) each run writes a fresh runs/<UTC time>/ and runs/latest links "
     "to it"},
    {GG_OPTION(log.overwrite), {},
     "replace an existing metrics file, timeline and checkpoint instead of refusing to start"},
    {GG_OPTION(log.progress), {}, "print a live progress line"},
    {GG_OPTION(log.interval), Range{excl(0.1), incl(3600)}, "seconds between progress lines"},
    {GG_OPTION(log.timeline), {},
     "write a timeline of the run to this JSON file (Chrome trace events: open in Perfetto or "
     "chrome://tracing): forward/backward per layer, every bucket exchange, data, optimizer and "
     "waits, every rank; not in a run with simulated failures; empty: none"},
    {GG_OPTION(log.timeline_steps), at_least(1),
     "how many steps from the start the timeline records (each is one event per layer, bucket "
     "and phase on every rank)"},
    {GG_OPTION(log.samples), {},
     "debug: each rank writes every step's sample ids to PATH.<rank> (\"step epoch id ...\"), "
     "to check that failures conserve the samples; a fresh run starts the file anew, a resumed "
     "one (checkpoint.resume) appends to it (empty: none)"},
    {GG_OPTION(log.losses), {},
     "debug: each rank (real or virtual) writes every step's loss to PATH.<rank> (\"step loss\", "
     "the loss in C's exact hexadecimal %a), so that two runs can be compared bit for bit "
     "(empty: none)"},
  });
}
// clang-format on

#undef GG_OPTION

// Integers as they are, powers of ten from 1e7 as "1e9" (not "1e+09").
std::string number_text(double v) {
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  if (v == std::trunc(v) && std::abs(v) < 1e15) {
    const double exponent = std::floor(std::log10(std::abs(v)));
    if (exponent >= 7 && v == std::pow(10.0, exponent))
      return "1e" + std::to_string(static_cast<int>(exponent));
    return std::to_string(static_cast<int64_t>(v));
  }
  std::ostringstream s;
  s << v;
  return s.str();
}

std::string bound_text(const Bound& b) { return b.key ? std::string(b.key) : number_text(b.value); }

const Option& option(std::string_view key) {
  for (const Option& o : options())
    if (o.key == key) return o;
  throw std::logic_error("no option " + std::string(key));
}

template <typename T>
const T& value(Field<T> get, const Config& c) {
  return get(const_cast<Config&>(c));  // read only: the accessors serve parsing too
}
std::string_view value(const EnumField& f, const Config& c) { return f.get(c); }

double number(const Option& o, const Config& c) {
  return std::visit(
      [&](auto get) -> double {
        const auto& v = value(get, c);
        if constexpr (std::is_arithmetic_v<std::decay_t<decltype(v)>>)
          return static_cast<double>(v);
        else
          throw std::logic_error(std::string(o.key) + " is no number");
      },
      o.field);
}

void check_range(const Option& o, const Range& r, const Config& c, bool cross) {
  if (cross && !r.lo.key && !r.hi.key) return;
  const double v = number(o, c);
  const double lo = r.lo.key ? number(option(r.lo.key), c) : r.lo.value;
  const double hi = r.hi.key ? number(option(r.hi.key), c) : r.hi.value;
  const bool finite_needed = std::holds_alternative<Field<double>>(o.field);
  bool ok = !finite_needed || std::isfinite(v);
  if (!r.lo.key || cross) ok = ok && (r.lo.open ? v > lo : v >= lo);
  if (!r.hi.key || cross) ok = ok && (std::isinf(hi) || (r.hi.open ? v < hi : v <= hi));
  if (ok) return;
  throw UsageError(std::string(o.key) + " = " + value_text(o, c) + " is out of range: must be " +
                   range_text(r));
}

}  // namespace

const std::vector<Option>& options() {
  static const std::vector<Option> all = [] {
    std::vector<Option> o;
    for (auto section :
         {data_options, model_options, train_options, gossip_options, gossip_mixing_options,
          apoptosis_options, checkpoint_options, guard_options, fault_options, network_options,
          emulate_options, simulate_options, log_options})
      section(o);
    return o;
  }();
  return all;
}

std::string value_text(const Option& o, const Config& c) {
  std::ostringstream s;
  s << std::boolalpha;
  std::visit([&](const auto& get) { s << value(get, c); }, o.field);
  return s.str();
}

std::string range_text(const Range& r) {
  if (std::isinf(r.hi.value) && !r.hi.key) return (r.lo.open ? "> " : ">= ") + bound_text(r.lo);
  return std::string("in ") + (r.lo.open ? "(" : "[") + bound_text(r.lo) + ", " + bound_text(r.hi) +
         (r.hi.open ? ")" : "]");
}

void check_option(const Option& o, const Config& c, bool cross) {
  if (const auto* r = std::get_if<Range>(&o.rule)) return check_range(o, *r, c, cross);
  if (cross) return;
  if (const auto* g = std::get_if<Grammar>(&o.rule))
    return g->check(std::string(o.key), value(std::get<Field<std::string>>(o.field), c));
  if (const auto* choices = std::get_if<Choices>(&o.rule)) {
    const std::string& v = value(std::get<Field<std::string>>(o.field), c);
    std::string list;
    for (std::string_view ok : choices->values) {
      if (v == ok) return;
      list += (list.empty() ? "" : ", ") + std::string(ok);
    }
    throw UsageError(std::string(o.key) + " = " + v + " is unknown: use " + list);
  }
}

}  // namespace gg::gossip
