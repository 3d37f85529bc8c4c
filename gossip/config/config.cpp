#include "gossip/config/config.hpp"

#include <algorithm>
#include <boost/program_options.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <sstream>

#include "gossip/config/fault_spec.hpp"
#include "kernels/models.hpp"
#include "shuffle/distributed.hpp"
#include "shuffle/source.hpp"

namespace po = boost::program_options;
namespace fs = std::filesystem;

namespace gg::gossip {
namespace {

po::options_description describe(Config& c) {
  po::options_description d("train options (INI key = option name; [section] key = value)");
  // clang-format off
  d.add_options()
    ("data.source", po::value(&c.data.source)->default_value(c.data.source),
     "fashion-mnist (the idx files in data.dir), idx:DIR, imagenet:DIR (train/<wnid>/*.JPEG, "
     "val/), shards:DIR (shard-*.tar from gossipgrad pack; DIR/train and DIR/val if present), "
     "synthetic:CxHxW[:classes[:count]]")
    ("data.dir", po::value(&c.data.dir)->default_value(c.data.dir),
     "folder with the idx files of Fashion-MNIST or MNIST (gz or plain)")
    ("data.val_labels", po::value(&c.data.val_labels)->default_value(c.data.val_labels),
     "imagenet: labels of a flat val/ folder, lines '<file> <wnid or index>' "
     "(auto: DIR/val_labels.txt)")
    ("data.augment", po::value(&c.data.augment)->default_value(c.data.augment),
     "training augmentation: pixel data random crop (pad 2) + flip; JPEG RandomResizedCrop "
     "(scale 0.08-1, ratio 3/4-4/3) + flip")
    ("data.prefetch", po::value(&c.data.prefetch)->default_value(c.data.prefetch),
     "ready batches queued by the loader threads [1, 64]")
    ("data.workers", po::value(&c.data.workers)->default_value(c.data.workers),
     "loader threads per rank (0: 1 for pixel data, cores per rank in [2, 8] for JPEG) [0, 64]")
    ("data.crop", po::value(&c.data.crop)->default_value(c.data.crop),
     "JPEG sources: side of the square input [8, 1024]")
    ("data.resize", po::value(&c.data.resize)->default_value(c.data.resize),
     "JPEG evaluation: shorter side before the centre crop [data.crop, 4096]")
    ("data.shuffle", po::value(&c.data.shuffle)->default_value(c.data.shuffle),
     "off: every epoch a fresh global permutation (every rank reads all data); ids: each rank "
     "owns samples and gives data.shuffle_per_step of each batch to a rotating partner (shared "
     "storage); bytes: the same with the encoded samples travelling over MPI (node-local storage)")
    ("data.shuffle_per_step",
     po::value(&c.data.shuffle_per_step)->default_value(c.data.shuffle_per_step),
     "samples each rank gives away (and receives) per step with data.shuffle ids|bytes "
     "[0, train.batch]")
    ("model.name", po::value(&c.model.name)->default_value(c.model.name),
     "network: resnet8 (small residual CNN) or cnn, for 28x28/32x32 inputs; or torchvision's "
     "resnet18, resnet34, resnet50, resnet101, resnet152 or googlenet")
    ("model.width", po::value(&c.model.width)->default_value(c.model.width),
     "channels of the first stage of resnet8 and cnn [1, 1024]")
    ("model.batch_norm", po::value(&c.model.batch_norm)->default_value(c.model.batch_norm),
     "use batch norm (false: convolutions get a bias instead)")
    ("train.backend", po::value(&c.train.backend)->default_value(c.train.backend),
     "kernels: onednn (fast CPU), reference (plain C++ oracle) or cuda (cuDNN + cuBLAS, one GPU "
     "per rank)")
    ("train.precision", po::value(&c.train.precision)->default_value(c.train.precision),
     "activations and conv arithmetic: fp32, or bf16 (cuda, or onednn on CPUs with AVX512_BF16; "
     "weights, gradients and the exchange stay fp32)")
    ("train.batch", po::value(&c.train.batch)->default_value(c.train.batch),
     "samples per rank per step [1, 65536]")
    ("train.epochs", po::value(&c.train.epochs)->default_value(c.train.epochs),
     "passes over the training set [1, 100000]")
    ("train.lr", po::value(&c.train.lr)->default_value(c.train.lr),
     "learning rate for a global batch of train.base_batch (scaled linearly)")
    ("train.base_batch", po::value(&c.train.base_batch)->default_value(c.train.base_batch),
     "global batch that train.lr is quoted for")
    ("train.momentum", po::value(&c.train.momentum)->default_value(c.train.momentum),
     "SGD momentum [0, 1)")
    ("train.weight_decay", po::value(&c.train.weight_decay)->default_value(c.train.weight_decay),
     "L2 weight decay [0, 1)")
    ("train.nesterov", po::value(&c.train.nesterov)->default_value(c.train.nesterov),
     "Nesterov momentum")
    ("train.warmup_epochs", po::value(&c.train.warmup_epochs)->default_value(c.train.warmup_epochs),
     "linear learning-rate warm-up, then cosine decay to 0 [0, train.epochs]")
    ("train.seed", po::value(&c.train.seed)->default_value(c.train.seed),
     "seed of initialisation, data order and augmentation")
    ("train.threads", po::value(&c.train.threads)->default_value(c.train.threads),
     "compute threads per rank (0: this node's cores / its ranks) [0, 1024]")
    ("train.max_steps", po::value(&c.train.max_steps)->default_value(c.train.max_steps),
     "stop after this many steps (0: run every epoch)")
    ("train.eval_batch", po::value(&c.train.eval_batch)->default_value(c.train.eval_batch),
     "batch of the evaluation pass [1, 65536]")
    ("train.init_from", po::value(&c.train.init_from)->default_value(c.train.init_from),
     "start from these weights (.npz with torchvision state_dict names, e.g. from gossipgrad "
     "export) instead of a random initialisation; empty: random")
    ("train.stop_at", po::value(&c.train.stop_at)->default_value(c.train.stop_at),
     "stop after this many steps with a full checkpoint, as if preempted; the learning-rate "
     "schedule still spans the whole run (0: never)")
    ("gossip.mode", po::value(&c.gossip.mode)->default_value(c.gossip.mode),
     "grad: average gradients with this step's partner; model: average weights after the "
     "update; both; allreduce: exact average over all ranks (the baseline)")
    ("gossip.schedule", po::value(&c.gossip.schedule)->default_value(c.gossip.schedule),
     "partners: dissemination, hypercube (power-of-two ranks), ring, random")
    ("gossip.rotate", po::value(&c.gossip.rotate)->default_value(c.gossip.rotate),
     "permute the virtual ranks every ceil(log2 p) steps (seeded, no communication)")
    ("gossip.transport", po::value(&c.gossip.transport)->default_value(c.gossip.transport),
     "auto (shm on this node, p2p across nodes), shm, p2p, rma (experimental: MPICH 4.0.2 "
     "PSCW hangs now and then when partners rotate)")
    ("gossip.threading", po::value(&c.gossip.threading)->default_value(c.gossip.threading),
     "funneled (one comm thread), concurrent (gossip.comm_threads), chained (bucket order)")
    ("gossip.comm_threads", po::value(&c.gossip.comm_threads)->default_value(c.gossip.comm_threads),
     "communication threads with threading = concurrent [1, 64]")
    ("gossip.staleness", po::value(&c.gossip.staleness)->default_value(c.gossip.staleness),
     "0: wait for the partner; 1: never wait, mix the partner's latest bucket")
    ("gossip.overlap_model",
     po::value(&c.gossip.overlap_model)->default_value(c.gossip.overlap_model),
     "model/both: exchange the weights behind the next step and apply the correction "
     "(w_partner - w_sent) / 2 before its update, instead of waiting after each update")
    ("gossip.global_every", po::value(&c.gossip.global_every)->default_value(c.gossip.global_every),
     "exact global average of the weights every H steps (0: never)")
    ("gossip.consensus_every",
     po::value(&c.gossip.consensus_every)->default_value(c.gossip.consensus_every),
     "measure the consensus distance every N steps (0: only at evaluation)")
    ("gossip.bucket_kb", po::value(&c.gossip.bucket_kb)->default_value(c.gossip.bucket_kb),
     "gradient bucket size in KiB; a bucket is exchanged as soon as backward completes it")
    ("gossip.timeout_s", po::value(&c.gossip.timeout_s)->default_value(c.gossip.timeout_s),
     "a rank waiting on its partner longer than this many seconds reports the partner, step and "
     "bucket and the job stops (0: wait forever)")
    ("apoptosis.enable", po::value(&c.apoptosis.enable)->default_value(c.apoptosis.enable),
     "neuron apoptosis: every apoptosis.interval steps the ranks agree on conv channels / fc "
     "neurons whose outgoing weights faded and remove them from the network")
    ("apoptosis.criterion",
     po::value(&c.apoptosis.criterion)->default_value(c.apoptosis.criterion),
     "score of a unit, the L2 norm of its outgoing weights averaged over the ranks: "
     "relative_norm (divided by the mean of its layer) or norm")
    ("apoptosis.threshold",
     po::value(&c.apoptosis.threshold)->default_value(c.apoptosis.threshold),
     "units scoring below this are removed [0, 1e6)")
    ("apoptosis.interval", po::value(&c.apoptosis.interval)->default_value(c.apoptosis.interval),
     "steps between decisions [1, 1e9]")
    ("apoptosis.max_share",
     po::value(&c.apoptosis.max_share)->default_value(c.apoptosis.max_share),
     "at most this share of a layer's units goes per decision (lowest scores first) (0, 1]")
    ("apoptosis.layers", po::value(&c.apoptosis.layers)->default_value(c.apoptosis.layers),
     "fc, conv or both; only layers whose units reach no residual add, concat or output")
    ("apoptosis.min_keep", po::value(&c.apoptosis.min_keep)->default_value(c.apoptosis.min_keep),
     "units every layer keeps at least [1, 1e9]")
    ("apoptosis.until", po::value(&c.apoptosis.until)->default_value(c.apoptosis.until),
     "decide only within this first share of the training steps; the rest trains the shrunk "
     "model (0, 1]")
    ("checkpoint.dir", po::value(&c.checkpoint.dir)->default_value(c.checkpoint.dir),
     "folder for checkpoints: the ranks' average model (model.npz + meta.json, rank 0) and full "
     "checkpoints (ckpt-<step>/: every rank's state, a manifest written last); empty: none. An "
     "existing checkpoint there is refused unless log.overwrite or checkpoint.resume")
    ("checkpoint.every_epochs",
     po::value(&c.checkpoint.every_epochs)->default_value(c.checkpoint.every_epochs),
     "also write the average model after every N epochs (0: only at the end of training)")
    ("checkpoint.every", po::value(&c.checkpoint.every)->default_value(c.checkpoint.every),
     "full checkpoint every N steps (0: never)")
    ("checkpoint.every_minutes",
     po::value(&c.checkpoint.every_minutes)->default_value(c.checkpoint.every_minutes),
     "full checkpoint every T minutes of training (0: never)")
    ("checkpoint.keep", po::value(&c.checkpoint.keep)->default_value(c.checkpoint.keep),
     "full checkpoints kept, the newest [1, 1000]")
    ("checkpoint.resume", po::value(&c.checkpoint.resume)->default_value(c.checkpoint.resume),
     "resume from a full checkpoint: auto (the newest valid one in checkpoint.dir; none: start "
     "afresh), or a folder (a checkpoint.dir or one ckpt-<step>); corrupt ones are skipped")
    ("guard.nan_retries", po::value(&c.guard.nan_retries)->default_value(c.guard.nan_retries),
     "a NaN/Inf loss restores the last in-memory snapshot and lowers the learning rate, at most "
     "this many times; then training stops (0: stop at once) [0, 100]")
    ("guard.snapshot_every",
     po::value(&c.guard.snapshot_every)->default_value(c.guard.snapshot_every),
     "steps between in-memory snapshots for the NaN guard [1, 1000000]")
    ("guard.lr_factor", po::value(&c.guard.lr_factor)->default_value(c.guard.lr_factor),
     "learning-rate scale applied at each NaN restore (0, 1]")
    ("fault.kill", po::value(&c.fault.kill)->default_value(c.fault.kill),
     "test hook RANK:STEP: that rank kills itself with SIGKILL at that step (not in a resumed "
     "run, nor in a restart by gossipgrad supervise)")
    ("fault.stall", po::value(&c.fault.stall)->default_value(c.fault.stall),
     "test hook RANK:STEP: that rank stops (SIGSTOP) at that step, a hung rank for "
     "gossip.timeout_s (same conditions as fault.kill)")
    ("fault.nan", po::value(&c.fault.nan)->default_value(c.fault.nan),
     "test hook: rank 0's weights become NaN at the start of this step (-1: never; not in a "
     "resumed run)")
    ("fault.inject", po::value(&c.fault.inject)->default_value(c.fault.inject),
     "simulated failures RANK:STEP[,RANK:STEP...]: that rank fails at the boundary before that "
     "step and is recovered by fault.strategy")
    ("fault.mtbf_steps", po::value(&c.fault.mtbf_steps)->default_value(c.fault.mtbf_steps),
     "random simulated failures: mean steps between failures (exponential gaps, victims uniform "
     "among the live ranks, drawn from train.seed identically on every rank; 0: none)")
    ("fault.strategy", po::value(&c.fault.strategy)->default_value(c.fault.strategy),
     "recovery from a simulated failure: restart (every rank reloads the last full checkpoint "
     "or the initial state), rollback (the failed rank takes a live rank's state, the step is "
     "redone), forward (the survivors carry on)")
    ("network.inter_latency_us",
     po::value(&c.network.inter_latency_us)->default_value(c.network.inter_latency_us),
     "simulate: latency between nodes, microseconds")
    ("network.inter_bandwidth_gbs",
     po::value(&c.network.inter_bandwidth_gbs)->default_value(c.network.inter_bandwidth_gbs),
     "simulate: bandwidth of a node's network link, GB/s, shared by its ranks")
    ("network.intra_latency_us",
     po::value(&c.network.intra_latency_us)->default_value(c.network.intra_latency_us),
     "simulate: latency within a node, microseconds")
    ("network.intra_bandwidth_gbs",
     po::value(&c.network.intra_bandwidth_gbs)->default_value(c.network.intra_bandwidth_gbs),
     "simulate: bandwidth between two ranks of a node, GB/s")
    ("network.mix_bandwidth_gbs",
     po::value(&c.network.mix_bandwidth_gbs)->default_value(c.network.mix_bandwidth_gbs),
     "simulate: GB/s of one operand through the local averaging or reduction")
    ("network.ranks_per_node",
     po::value(&c.network.ranks_per_node)->default_value(c.network.ranks_per_node),
     "simulate: ranks per node (consecutive ranks share a node)")
    ("simulate.forward_ms", po::value(&c.simulate.forward_ms)->default_value(c.simulate.forward_ms),
     "simulate: forward time per step on one rank, ms (0: measure here)")
    ("simulate.backward_ms",
     po::value(&c.simulate.backward_ms)->default_value(c.simulate.backward_ms),
     "simulate: backward time per step, ms (0: measure here)")
    ("simulate.update_ms", po::value(&c.simulate.update_ms)->default_value(c.simulate.update_ms),
     "simulate: optimizer step time, ms (0: measure here)")
    ("simulate.steps", po::value(&c.simulate.steps)->default_value(c.simulate.steps),
     "simulate: gossip steps averaged per prediction")
    ("log.metrics", po::value(&c.log.metrics)->default_value(c.log.metrics),
     "JSON Lines metrics file (rank 0)")
    ("log.overwrite", po::value(&c.log.overwrite)->default_value(c.log.overwrite),
     "replace an existing metrics file and checkpoint instead of refusing to start")
    ("log.progress", po::value(&c.log.progress)->default_value(c.log.progress),
     "print a live progress line")
    ("log.timeline", po::value(&c.log.timeline)->default_value(c.log.timeline),
     "write a timeline of the run to this JSON file (Chrome trace events: open in Perfetto or "
     "chrome://tracing): forward/backward per layer, every bucket exchange, data, optimizer and "
     "waits, every rank; empty: none")
    ("log.timeline_steps",
     po::value(&c.log.timeline_steps)->default_value(c.log.timeline_steps),
     "how many steps from the start the timeline records (each is one event per layer, bucket "
     "and phase on every rank)")
    ("log.samples", po::value(&c.log.samples)->default_value(c.log.samples),
     "debug: each rank appends every step's sample ids to PATH.<rank> (\"step epoch id ...\"), "
     "to check that failures conserve the samples (empty: none)")
    ("log.interval", po::value(&c.log.interval)->default_value(c.log.interval),
     "seconds between progress lines (0.1, 3600]");
  // clang-format on
  return d;
}

template <typename T>
void require(bool ok, const std::string& key, const T& value, const std::string& rule) {
  if (ok) return;
  std::ostringstream s;
  s << key << " = " << value << " is out of range: " << rule;
  throw UsageError(s.str());
}

// The [data] keys (the data folder itself: gossip/train/preflight).
void validate_data(const Config& c) {
  require(c.data.workers >= 0 && c.data.workers <= 64, "data.workers", c.data.workers,
          "must be in [0, 64]");
  require(c.data.crop >= 8 && c.data.crop <= 1024, "data.crop", c.data.crop,
          "must be in [8, 1024]");
  require(c.data.resize >= c.data.crop && c.data.resize <= 4096, "data.resize", c.data.resize,
          "must be in [data.crop, 4096]");
  require(c.data.shuffle_per_step >= 0 && c.data.shuffle_per_step <= c.train.batch,
          "data.shuffle_per_step", c.data.shuffle_per_step, "must be in [0, train.batch]");
  try {
    shuffle::parse_shuffle_mode(c.data.shuffle);
  } catch (const std::invalid_argument& e) {
    throw UsageError("data.shuffle = " + c.data.shuffle + " is unknown: use off, ids or bytes");
  }
  try {
    shuffle::parse_source(c.data.source, c.data.dir);
  } catch (const std::invalid_argument& e) {
    throw UsageError("data.source = " + c.data.source + ": " + e.what());
  }
}

void validate(const Config& c) {
  require(c.data.prefetch >= 1 && c.data.prefetch <= 64, "data.prefetch", c.data.prefetch,
          "must be in [1, 64]");
  const auto names = kernels::model_names();
  if (std::find(names.begin(), names.end(), c.model.name) == names.end()) {
    std::string list;
    for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
    throw UsageError("model.name = " + c.model.name + " is unknown: use one of " + list);
  }
  require(c.model.width >= 1 && c.model.width <= 1024, "model.width", c.model.width,
          "must be in [1, 1024]");
  if (c.train.backend != "onednn" && c.train.backend != "reference" && c.train.backend != "cuda")
    throw UsageError("train.backend = " + c.train.backend +
                     " is unknown: use onednn, reference or cuda");
  if (c.train.precision != "fp32" && c.train.precision != "bf16")
    throw UsageError("train.precision = " + c.train.precision + " is unknown: use fp32 or bf16");
  if (c.train.precision == "bf16" && c.train.backend == "reference")
    throw UsageError("train.precision = bf16 needs train.backend = onednn or cuda");
  require(c.train.batch >= 1 && c.train.batch <= 65536, "train.batch", c.train.batch,
          "must be in [1, 65536]");
  require(c.train.epochs >= 1 && c.train.epochs <= 100000, "train.epochs", c.train.epochs,
          "must be in [1, 100000]");
  require(std::isfinite(c.train.lr) && c.train.lr > 0 && c.train.lr <= 100, "train.lr", c.train.lr,
          "must be in (0, 100]");
  require(c.train.base_batch >= 1, "train.base_batch", c.train.base_batch, "must be >= 1");
  require(c.train.momentum >= 0 && c.train.momentum < 1, "train.momentum", c.train.momentum,
          "must be in [0, 1)");
  require(c.train.weight_decay >= 0 && c.train.weight_decay < 1, "train.weight_decay",
          c.train.weight_decay, "must be in [0, 1)");
  require(c.train.warmup_epochs >= 0 && c.train.warmup_epochs <= c.train.epochs,
          "train.warmup_epochs", c.train.warmup_epochs, "must be in [0, train.epochs]");
  require(c.train.threads >= 0 && c.train.threads <= 1024, "train.threads", c.train.threads,
          "must be in [0, 1024]");
  require(c.train.max_steps >= 0, "train.max_steps", c.train.max_steps, "must be >= 0");
  require(c.train.eval_batch >= 1 && c.train.eval_batch <= 65536, "train.eval_batch",
          c.train.eval_batch, "must be in [1, 65536]");
  const auto one_of = [](const std::string& key, const std::string& v,
                         std::initializer_list<const char*> ok) {
    std::string list;
    for (const char* o : ok) {
      if (v == o) return;
      list += list.empty() ? o : std::string(", ") + o;
    }
    throw UsageError(key + " = " + v + " is unknown: use " + list);
  };
  one_of("gossip.mode", c.gossip.mode, {"grad", "model", "both", "allreduce"});
  one_of("gossip.schedule", c.gossip.schedule, {"dissemination", "hypercube", "ring", "random"});
  one_of("gossip.transport", c.gossip.transport, {"auto", "shm", "rma", "p2p"});
  one_of("gossip.threading", c.gossip.threading, {"funneled", "concurrent", "chained"});
  one_of("apoptosis.criterion", c.apoptosis.criterion, {"relative_norm", "norm"});
  one_of("apoptosis.layers", c.apoptosis.layers, {"fc", "conv", "both"});
  require(std::isfinite(c.apoptosis.threshold) && c.apoptosis.threshold >= 0 &&
              c.apoptosis.threshold < 1e6,
          "apoptosis.threshold", c.apoptosis.threshold, "must be in [0, 1e6)");
  require(c.apoptosis.interval >= 1 && c.apoptosis.interval <= 1000000000, "apoptosis.interval",
          c.apoptosis.interval, "must be in [1, 1e9]");
  require(c.apoptosis.max_share > 0 && c.apoptosis.max_share <= 1, "apoptosis.max_share",
          c.apoptosis.max_share, "must be in (0, 1]");
  require(c.apoptosis.until > 0 && c.apoptosis.until <= 1, "apoptosis.until", c.apoptosis.until,
          "must be in (0, 1]");
  require(c.apoptosis.min_keep >= 1 && c.apoptosis.min_keep <= 1000000000, "apoptosis.min_keep",
          c.apoptosis.min_keep, "must be in [1, 1e9]");
  require(c.gossip.comm_threads >= 1 && c.gossip.comm_threads <= 64, "gossip.comm_threads",
          c.gossip.comm_threads, "must be in [1, 64]");
  require(c.gossip.staleness == 0 || c.gossip.staleness == 1, "gossip.staleness",
          c.gossip.staleness, "must be 0 or 1");
  require(c.gossip.global_every >= 0, "gossip.global_every", c.gossip.global_every, "must be >= 0");
  require(c.gossip.consensus_every >= 0, "gossip.consensus_every", c.gossip.consensus_every,
          "must be >= 0");
  require(c.gossip.bucket_kb >= 1 && c.gossip.bucket_kb <= (int64_t{1} << 22), "gossip.bucket_kb",
          c.gossip.bucket_kb, "must be in [1, 4194304]");
  require(c.log.timeline_steps >= 1, "log.timeline_steps", c.log.timeline_steps, "must be >= 1");
  require(c.log.interval > 0.1 && c.log.interval <= 3600, "log.interval", c.log.interval,
          "must be in (0.1, 3600]");
  const auto positive = [&](double v, const char* key) {
    require(std::isfinite(v) && v > 0 && v < 1e9, key, v, "must be positive");
  };
  positive(c.network.inter_bandwidth_gbs, "network.inter_bandwidth_gbs");
  positive(c.network.intra_bandwidth_gbs, "network.intra_bandwidth_gbs");
  positive(c.network.mix_bandwidth_gbs, "network.mix_bandwidth_gbs");
  require(c.network.inter_latency_us >= 0 && c.network.inter_latency_us < 1e6,
          "network.inter_latency_us", c.network.inter_latency_us, "must be in [0, 1e6)");
  require(c.network.intra_latency_us >= 0 && c.network.intra_latency_us < 1e6,
          "network.intra_latency_us", c.network.intra_latency_us, "must be in [0, 1e6)");
  require(c.network.ranks_per_node >= 1 && c.network.ranks_per_node <= 4096,
          "network.ranks_per_node", c.network.ranks_per_node, "must be in [1, 4096]");
  for (const auto& [v, key] : {std::pair{c.simulate.forward_ms, "simulate.forward_ms"},
                               {c.simulate.backward_ms, "simulate.backward_ms"},
                               {c.simulate.update_ms, "simulate.update_ms"}})
    require(std::isfinite(v) && v >= 0 && v < 1e9, key, v, "must be >= 0");
  require(c.simulate.steps >= 1 && c.simulate.steps <= 100000, "simulate.steps", c.simulate.steps,
          "must be in [1, 100000]");
  require(c.train.stop_at >= 0, "train.stop_at", c.train.stop_at, "must be >= 0");
  require(std::isfinite(c.gossip.timeout_s) && c.gossip.timeout_s >= 0 && c.gossip.timeout_s <= 1e6,
          "gossip.timeout_s", c.gossip.timeout_s, "must be in [0, 1e6]");
  require(c.checkpoint.every >= 0, "checkpoint.every", c.checkpoint.every, "must be >= 0");
  require(std::isfinite(c.checkpoint.every_minutes) && c.checkpoint.every_minutes >= 0,
          "checkpoint.every_minutes", c.checkpoint.every_minutes, "must be >= 0");
  require(c.checkpoint.keep >= 1 && c.checkpoint.keep <= 1000, "checkpoint.keep", c.checkpoint.keep,
          "must be in [1, 1000]");
  require(c.guard.nan_retries >= 0 && c.guard.nan_retries <= 100, "guard.nan_retries",
          c.guard.nan_retries, "must be in [0, 100]");
  require(c.guard.snapshot_every >= 1 && c.guard.snapshot_every <= 1000000, "guard.snapshot_every",
          c.guard.snapshot_every, "must be in [1, 1000000]");
  require(std::isfinite(c.guard.lr_factor) && c.guard.lr_factor > 0 && c.guard.lr_factor <= 1,
          "guard.lr_factor", c.guard.lr_factor, "must be in (0, 1]");
  require(c.fault.nan >= -1, "fault.nan", c.fault.nan, "must be >= -1");
  if (!c.fault.kill.empty()) parse_fault_kill(c.fault.kill, "fault.kill");
  if (!c.fault.stall.empty()) parse_fault_kill(c.fault.stall, "fault.stall");
  if (!c.fault.inject.empty()) parse_fault_inject(c.fault.inject);
  require(std::isfinite(c.fault.mtbf_steps) && c.fault.mtbf_steps >= 0, "fault.mtbf_steps",
          c.fault.mtbf_steps, "must be >= 0");
  parse_fault_strategy(c.fault.strategy);
  for (const auto& [v, key] :
       {std::pair{c.checkpoint.every, "checkpoint.every"}, {c.train.stop_at, "train.stop_at"}})
    if (v > 0 && c.checkpoint.dir.empty())
      throw UsageError(std::string(key) + " = " + std::to_string(v) + " needs checkpoint.dir");
  if (c.checkpoint.every_minutes > 0 && c.checkpoint.dir.empty())
    throw UsageError("checkpoint.every_minutes needs checkpoint.dir");
  if (c.checkpoint.resume == "auto" && c.checkpoint.dir.empty())
    throw UsageError("checkpoint.resume = auto needs checkpoint.dir");
  require(c.checkpoint.every_epochs >= 0, "checkpoint.every_epochs", c.checkpoint.every_epochs,
          "must be >= 0");
  if (c.checkpoint.every_epochs > 0 && c.checkpoint.dir.empty())
    throw UsageError("checkpoint.every_epochs = " + std::to_string(c.checkpoint.every_epochs) +
                     " needs checkpoint.dir");
  if (c.log.metrics.empty()) throw UsageError("log.metrics must name a file");
  validate_data(c);
}

// "--key value" -> "--key=value", so that values starting with '-' (e.g. -3) reach the
// range check instead of being taken for options.
std::vector<std::string> join_values(const std::vector<std::string>& args) {
  std::vector<std::string> out;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    const bool long_opt = a.rfind("--", 0) == 0 && a.size() > 2 && a.find('=') == std::string::npos;
    const bool has_value = i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0;
    if (long_opt && a != "--help" && has_value) {
      out.push_back(a + "=" + args[i + 1]);
      ++i;
    } else {
      out.push_back(a);
    }
  }
  return out;
}

std::string one_line(std::string s) {
  for (char& ch : s)
    if (ch == '\n') ch = ' ';
  return s;
}

}  // namespace

Config parse_train_args(const std::vector<std::string>& args) {
  Config c;
  po::options_description opts = describe(c);
  po::options_description top;
  top.add_options()("config", po::value(&c.config_path), "INI file with the run's settings");
  top.add(opts);
  po::variables_map vm;
  try {
    const auto parsed =
        po::command_line_parser(join_values(args))
            .options(top)
            .style(po::command_line_style::unix_style & ~po::command_line_style::allow_guessing)
            .run();
    for (const auto& o : parsed.options)
      if (o.unregistered || o.string_key.empty())
        throw UsageError("unknown argument '" +
                         (o.original_tokens.empty() ? o.string_key : o.original_tokens[0]) +
                         "' (see gossipgrad train --help)");
    po::store(parsed, vm);
    // The command line is stored first, so it wins over the file for every key it sets.
    if (vm.count("config")) {
      const std::string path = vm["config"].as<std::string>();
      std::ifstream f(path);
      if (!f || fs::is_directory(path))
        throw UsageError("config file " + path + " cannot be read (missing or unreadable)");
      try {
        po::store(po::parse_config_file(f, opts, /*allow_unregistered=*/false), vm);
      } catch (const po::unknown_option& e) {
        throw UsageError("config file " + path + ": unknown key '" + e.get_option_name() +
                         "' (see gossipgrad train --help for the valid keys)");
      } catch (const po::error& e) {
        throw UsageError("config file " + path + ": " + one_line(e.what()));
      }
    }
    po::notify(vm);
  } catch (const po::unknown_option& e) {
    const std::string name = e.get_option_name();
    throw UsageError("unknown option '" + name.substr(0, name.find('=')) +
                     "' (see gossipgrad train --help for the valid keys)");
  } catch (const po::error& e) {
    throw UsageError(one_line(e.what()));
  }
  validate(c);
  return c;
}

Config parse_train_args(const std::vector<std::string>& args, bool check_paths) {
  if (check_paths)
    throw std::logic_error(
        "parse_train_args: this machine's files are checked by check_run_files "
        "(gossip/train/preflight.hpp)");
  return parse_train_args(args);
}

std::string train_help() {
  Config c;
  std::ostringstream s;
  s << "usage: mpirun -n P gossipgrad train [--config FILE] [--section.key value ...]\n"
       "       gossipgrad train --config FILE --dry-run   (validate, print the resolved "
       "settings)\n\n"
    << describe(c);
  return s.str();
}

std::string to_ini(const Config& c) {
  std::ostringstream s;
  s << std::boolalpha;
  s << "[data]\nsource = " << c.data.source << "\ndir = " << c.data.dir
    << "\nval_labels = " << c.data.val_labels << "\naugment = " << c.data.augment
    << "\nprefetch = " << c.data.prefetch << "\nworkers = " << c.data.workers
    << "\ncrop = " << c.data.crop << "\nresize = " << c.data.resize
    << "\nshuffle = " << c.data.shuffle << "\nshuffle_per_step = " << c.data.shuffle_per_step
    << "\n\n[model]\nname = " << c.model.name << "\nwidth = " << c.model.width
    << "\nbatch_norm = " << c.model.batch_norm << "\n\n[train]\nbackend = " << c.train.backend
    << "\nprecision = " << c.train.precision << "\nbatch = " << c.train.batch
    << "\nepochs = " << c.train.epochs << "\nlr = " << c.train.lr
    << "\nbase_batch = " << c.train.base_batch << "\nmomentum = " << c.train.momentum
    << "\nweight_decay = " << c.train.weight_decay << "\nnesterov = " << c.train.nesterov
    << "\nwarmup_epochs = " << c.train.warmup_epochs << "\nseed = " << c.train.seed
    << "\nthreads = " << c.train.threads << "\nmax_steps = " << c.train.max_steps
    << "\neval_batch = " << c.train.eval_batch << "\ninit_from = " << c.train.init_from
    << "\nstop_at = " << c.train.stop_at << "\n\n[gossip]\nmode = " << c.gossip.mode
    << "\nschedule = " << c.gossip.schedule << "\nrotate = " << c.gossip.rotate
    << "\ntransport = " << c.gossip.transport << "\nthreading = " << c.gossip.threading
    << "\ncomm_threads = " << c.gossip.comm_threads << "\nstaleness = " << c.gossip.staleness
    << "\noverlap_model = " << c.gossip.overlap_model
    << "\nglobal_every = " << c.gossip.global_every
    << "\nconsensus_every = " << c.gossip.consensus_every << "\nbucket_kb = " << c.gossip.bucket_kb
    << "\ntimeout_s = " << c.gossip.timeout_s << "\n\n[apoptosis]\nenable = " << c.apoptosis.enable
    << "\ncriterion = " << c.apoptosis.criterion << "\nthreshold = " << c.apoptosis.threshold
    << "\ninterval = " << c.apoptosis.interval << "\nmax_share = " << c.apoptosis.max_share
    << "\nlayers = " << c.apoptosis.layers << "\nmin_keep = " << c.apoptosis.min_keep
    << "\nuntil = " << c.apoptosis.until << "\n\n[checkpoint]\ndir = " << c.checkpoint.dir
    << "\nevery_epochs = " << c.checkpoint.every_epochs << "\nevery = " << c.checkpoint.every
    << "\nevery_minutes = " << c.checkpoint.every_minutes << "\nkeep = " << c.checkpoint.keep
    << "\nresume = " << c.checkpoint.resume << "\n\n[guard]\nnan_retries = " << c.guard.nan_retries
    << "\nsnapshot_every = " << c.guard.snapshot_every << "\nlr_factor = " << c.guard.lr_factor
    << "\n\n[fault]\nkill = " << c.fault.kill << "\nstall = " << c.fault.stall
    << "\nnan = " << c.fault.nan << "\ninject = " << c.fault.inject
    << "\nmtbf_steps = " << c.fault.mtbf_steps << "\nstrategy = " << c.fault.strategy
    << "\n\n[network]\ninter_latency_us = " << c.network.inter_latency_us
    << "\ninter_bandwidth_gbs = " << c.network.inter_bandwidth_gbs
    << "\nintra_latency_us = " << c.network.intra_latency_us
    << "\nintra_bandwidth_gbs = " << c.network.intra_bandwidth_gbs
    << "\nmix_bandwidth_gbs = " << c.network.mix_bandwidth_gbs
    << "\nranks_per_node = " << c.network.ranks_per_node
    << "\n\n[simulate]\nforward_ms = " << c.simulate.forward_ms
    << "\nbackward_ms = " << c.simulate.backward_ms << "\nupdate_ms = " << c.simulate.update_ms
    << "\nsteps = " << c.simulate.steps << "\n\n[log]\nmetrics = " << c.log.metrics
    << "\noverwrite = " << c.log.overwrite << "\nprogress = " << c.log.progress
    << "\ninterval = " << c.log.interval << "\ntimeline = " << c.log.timeline
    << "\ntimeline_steps = " << c.log.timeline_steps << "\nsamples = " << c.log.samples << "\n";
  return s.str();
}

}  // namespace gg::gossip
