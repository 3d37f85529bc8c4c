// Data-parallel training of one rank: forward, backward with buckets handed to the exchange
// engine as they complete, the optimizer step, evaluation, metrics and progress.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "gossip/comm/exchange.hpp"
#include "gossip/comm/mpi.hpp"
#include "gossip/config/config.hpp"
#include "gossip/resilience/rank_state.hpp"
#include "gossip/train/apoptosis.hpp"
#include "gossip/train/emulate.hpp"
#include "gossip/train/metrics.hpp"
#include "gossip/train/virtual_exchange.hpp"
#include "kernels/executor.hpp"
#include "kernels/models.hpp"
#include "kernels/net.hpp"
#include "kernels/optimizer.hpp"
#include "kernels/train_state.hpp"
#include "shuffle/dataset.hpp"
#include "shuffle/loader.hpp"
#include "shuffle/source.hpp"

namespace gg::gossip {

struct StepStats {
  double loss = 0;
  // False where the step has no loss to report: a device state reports each step's loss with the
  // next step (kernels/train_state.hpp), so its first step has none (emulated compute has none at
  // all: StepFields::has_loss).
  bool has_loss = true;
  int64_t loss_step = -1;  // the step `loss` belongs to, where not this one (-1: this one)
  int64_t correct = 0;
  double lr = 0;
  double comm_seconds = 0;  // exposed: time the step waited for the exchange
  double consensus = -1;    // measured this step (every gossip.consensus_every steps), else -1
  int64_t sent_bytes = -1;  // gossip: bytes this rank sent this step (allreduce: -1, unknown)
  // gossip.staleness 1: buckets this step mixed from the partner's previous step, and buckets
  // it could not mix (nothing had arrived); -1 otherwise.
  int64_t late_buckets = -1, unmixed_buckets = -1;
  // gossip.consensus_bound: the estimated consensus distance after this step's weight exchange
  // (-1: none this step), and whether it took the ranks to a global average.
  double consensus_estimate = -1;
  bool consensus_average = false;
};

struct EvalStats {
  double loss = 0;
  double top1 = 0;
  double top5 = 0;
  double consensus = 0;  // mean squared distance of the ranks' weights to their average
  int64_t samples = 0;
};

// The evaluation pass of one process over its share (rank of ranks) of `data`, in order, without
// augmentation, the last batch padded: {loss x samples, top-1 hits, top-5 hits, samples}, to be
// added over ranks; eval_stats makes the means. `o` gives the normalisation and transform.
using EvalSums = std::array<double, 4>;
// The loader options of that pass: `batch` samples, rank of ranks, in order, no augmentation,
// the last batch padded.
shuffle::LoaderOptions evaluation_loader(shuffle::LoaderOptions o, int64_t batch, int rank,
                                         int ranks);
// The evaluation pass's batch: train.eval_batch, or one rank's share of `samples` where that is
// smaller (padding costs what samples cost: 4096 ranks over 10,000 samples evaluate 3 each).
int64_t evaluation_batch(int64_t eval_batch, int64_t samples, int ranks);
EvalSums evaluation_sums(kernels::Executor& exec, int64_t classes,
                         const shuffle::SampleSource& data, shuffle::LoaderOptions o, int rank,
                         int ranks);
EvalStats eval_stats(const EvalSums& sums);

// One rank's batch of a step: train.batch samples (NCHW, normalised) and their labels.
struct StepInput {
  const float* x = nullptr;
  const int32_t* y = nullptr;
};

// The ranks one trainer trains: a real rank, its state the network's own buffers; or, with
// train.virtual_ranks = P (gossip/train/virtual.hpp), P ranks in this one process (world is this
// process alone), each with its own weights, gradients, statistics and momentum, trained one
// after another on the one network (their states swapped in and out) and exchanging through
// virtual exchanges (virtual_exchange.hpp). The step, the exchanges' cadence, the global
// averages, consensus control, evaluation and the measurements are the same code for both; sums
// over the held ranks are added in MPICH's allreduce order (tree_sum.hpp), so that P virtual
// ranks compute what `mpirun -n P` computes, bit for bit.
class Trainer {
 public:
  // `input` and `classes` describe the samples; the model comes from the config. With
  // train.virtual_ranks, the ranks join by add_rank() before the first step.
  Trainer(const Config& c, const mpi::Comm& world, kernels::Dims input, int64_t classes,
          int64_t total_steps, int64_t steps_per_epoch);

  // One training step on this rank's local batch (train.batch samples, NCHW, normalised).
  StepStats step(const float* x, const int32_t* y);
  // One step of every held rank, input(i) giving held rank i's batch when its turn comes (the
  // batch stays valid until the next call). The stats are held rank 0's.
  StepStats step(const std::function<StepInput(int)>& input);

  // Virtual ranks: the next rank, starting from the network's initial weights and statistics,
  // with its own momentum and its part of every exchange; ranks() of them before the first step.
  void add_rank();
  // Ranks held by this trainer (a real rank: 1), and all ranks of the run.
  int held() const { return held_.empty() ? 1 : static_cast<int>(held_.size()); }
  int ranks() const { return ranks_; }
  // Held rank i's loss in the last step.
  double loss_of(int i) const { return held_.empty() ? last_loss_ : held_[i].loss; }
  // Puts held rank i's weights and running statistics into the network (its own top-1).
  void load(int i);
  // Staleness 1: the late and unmixed bucket mixes of every held rank so far.
  BucketExchange::Lateness held_lateness() const;
  // What the held ranks' exchange states grow to over the run's `steps` as ranks meet partners.
  int64_t growth_bytes(int64_t steps) const;
  // The evaluation's executor over `samples` test samples, compiled on first use.
  kernels::Executor& evaluation_executor(int64_t samples);
  kernels::Net& net() { return net_; }
  // Records every step's phases, layers and bucket exchanges there (nullptr: none).
  void set_timeline(Timeline* t);
  Timeline* timeline() const { return timeline_; }

  // Top-1/top-5 over the whole data set (split across ranks) of the ranks' average model: with
  // gossip every rank holds its own model, and their average is what training converges to.
  // `o` gives the normalisation and transform; batch, ranks and order are set here.
  EvalStats evaluate(const shuffle::SampleSource& data, shuffle::LoaderOptions o);

  // Mean over ranks of ||w_r - mean_w||^2 (a collective: every rank must call it).
  double consensus_distance();

  // The ranks' average weights and running statistics, the model evaluate() measures (a
  // collective: every rank must call it).
  void average_model(std::vector<float>& params, std::vector<float>& buffers);

  // Neuron apoptosis (the decision rule: gossip/train/apoptosis.hpp): the ranks agree on the
  // units to remove (one small collective) and shrink() them. A collective; every rank gets the
  // same report.
  ApoptosisReport apoptosis();
  // Replaces the network by the one without the units of `r` (the same on every rank: a
  // collective): parameters, running statistics and momentum keep the kept units' values; the
  // gradient buffer, buckets, executors and exchanges are rebuilt over the new sizes.
  void shrink(const kernels::Removal& r);
  // Replaces the network by `g` (the base model at other widths: a checkpoint taken after a
  // shrink), zero-filled, before restore_model; a collective, like shrink.
  void reshape(kernels::Graph g);

  const kernels::Graph& graph() const { return net_.graph(); }
  // The weights and running statistics as they are now (a detached state's host copies made
  // current: kernels/train_state.hpp); who writes them (or the momentum, sgd_) hands them back
  // by store_written.
  kernels::ParamStore& store();
  void store_written(unsigned parts = kernels::kParams | kernels::kBuffers | kernels::kVelocity);
  // Where the step runs: "host", "device" (train.resident), ...
  const char* state_where() const { return state_->where(); }
  // How a device state's weights travel: "" for a host state, else one line's worth (device to
  // device over CUDA IPC, or host-staged and why).
  std::string exchange_path() const;
  int64_t steps_done() const { return step_; }
  // Global averages gossip.consensus_bound has taken so far.
  int64_t consensus_averages() const { return consensus_averages_; }

  // Recovery (gossip/train/recovery.hpp). capture_state fills the model part of a RankState
  // (weights, running statistics, momentum, a pending weight exchange's correction, counters)
  // without changing what training computes next; restore_model puts a captured model back;
  // resume_at makes this freshly built trainer continue at `step`, before its first step, whose
  // metrics then also count `unreported_bytes` (see unreported_bytes()).
  void capture_state(RankState& s);
  void restore_model(const RankState& s);
  void resume_at(int64_t step, uint64_t dropout_step, int64_t unreported_bytes);
  // Bytes the exchanges sent since the last step's metrics: after capture_state, the weight
  // exchange it settled (pipelined, also what was still on its way at the step's end). A
  // checkpoint's manifest keeps rank 0's, whose metrics the resumed run's first step completes.
  int64_t unreported_bytes() const;
  // Goes back to a state captured earlier in this run (s.step <= steps_done(), at a step
  // boundary): the model as restore_model, the step counter and dropout masks as they were, so
  // the steps since are redone with the same partners (a rollback). Every rank must rewind alike.
  void rewind(const RankState& s);
  // Ranks of this group whose state was lost and replaced by another rank's (a rollback, a lost
  // slot filled under supervise) start what their exchanges keep again from nothing
  // (restore_model); a pair holds the same on both ends, so every rank drops what it shares with
  // them. Every rank calls it with the same ranks.
  void forget_peers(const std::vector<int>& lost);
  void set_lr_scale(double scale) { lr_scale_ = scale; }

 private:
  void choose_layout();  // before any executor is compiled
  void make_state();     // over train_exec_, after the exchanges
  // train.resident: why the weights (or the gradients) cannot go device to device
  // (cuda_ipc_exchange.hpp); empty where they can.
  std::string ipc_refusal(bool weights) const;
  bool device_weights() const { return c_.train.resident && ipc_why_[1].empty(); }
  bool device_grads() const { return c_.train.resident && ipc_why_[0].empty(); }
  // The exchanges over the state's device memory: the gradients', the weights' and momentum's.
  void make_device_exchanges();
  void make_exchanges();                     // before any executor is compiled
  void make_virtual_exchanges();             // train.virtual_ranks: the held ranks' exchanges
  bool own_state(const RankState& s) const;  // saved by this rank of a group of this size
  // The exchanges of this run by the names their state parts carry (rank_state.hpp), and the
  // layout those parts' values leave in (plain) and come back to.
  std::vector<std::pair<std::string, BucketExchange*>> named_exchanges() const;
  StateLayout state_layout() const;
  GossipOptions exchange_options(const partners::Schedule& schedule, Mixed what) const;
  // `o` with what its rules read of this model (fit_to_model); UsageError where it cannot fit.
  GossipOptions fitted(GossipOptions o) const;
  // The step's parts after backward: the optimizer (or its emulated wait), the weight exchange
  // due, the exact global average due, and the step's measurements.
  void update(float lr);
  void compute(const std::function<StepInput(int)>& input, StepStats& s);  // one rank's
  void compute_held(const std::function<StepInput(int)>& input, StepStats& s);
  // Held rank i's buffers (i = 0 of a real rank: the network's).
  float* params_of(int i);
  float* grads_of(int i);
  std::span<float> buffers_of(int i);
  kernels::Sgd& sgd_of(int i);
  // The sum over every rank of the run of one value each (value(i): held rank i's), added in
  // MPICH's allreduce order; n values at once.
  void sum_over_ranks(double* out, int n, const std::function<double(int, int)>& value);
  // Every rank's weights and running statistics replaced by their average over the ranks.
  void average_state();
  double exchange_weights();
  double average_globally();
  double control_consensus(StepStats& s);  // gossip.consensus_bound
  void forget_distance();                  // after a global average
  void account(StepStats& s);
  void set_first_step(int64_t step);  // the exchanges' transports count from this step on
  // The network, momentum, executors and exchanges over a new graph (shrink, reshape); params
  // and velocity in the plain layout.
  void rebuild(kernels::Graph g, std::vector<float> params, std::vector<float> buffers,
               std::vector<float> velocity);
  Timeline* timeline_ = nullptr;
  // The held ranks' x(i) (n values each): their average over every rank of the run into `avg`
  // (a collective; `avg` may be x(0)).
  void mean_over_ranks(const std::function<const float*(int)>& x, int64_t n, float* avg);
  // Mean over ranks of ||w - avg||^2, where avg is the ranks' average of the weights (a
  // collective).
  double distance_to_average(const float* avg);
  // The weight exchange of the last update, if due: overlapped (start_delayed) or pipelined
  // (start_all; forward's bucket gate waits for each bucket, flush_model for the rest).
  void start_model_exchange();
  double flush_model();           // applies a pending overlapped or pipelined weight exchange
  unsigned weight_parts() const;  // the state's parts the weight exchanges mix on the host
  double exchange_staged(WeightExchange& e, unsigned part);  // a detached state's, host-staged
  // gossip.pipeline_weights with no gradient exchange: each bucket updated as soon as backward
  // has its gradients, and its weights (and momentum) sent at once, behind the rest of backward.
  bool streams_weights() const;
  void backward_streaming(StepStats& s);
  void attach_gate();           // gossip.pipeline_weights: train_exec_'s gate waits for the weights
  void load_initial_weights();  // train.init_from, read by rank 0

  const Config& c_;
  const Algorithm& algorithm_;  // gossip.mode, looked up once (the step asks it)
  const Cadence cadence_;       // when the weights travel, when the ranks are averaged
  const mpi::Comm& world_;
  kernels::Net net_;
  kernels::Executor* train_exec_ = nullptr;           // emulated compute: emulated_
  kernels::Executor* eval_exec_ = nullptr;            // compiled by the first evaluation
  std::unique_ptr<EmulatedExecutor> emulated_;        // [emulate]: waits instead of arithmetic
  std::vector<BucketExchange*> exchanges() const;     // those of this run
  std::vector<WeightExchange*> after_update() const;  // the weights', the momentum's
  std::unique_ptr<BucketExchange> exchange_;          // gradients (grad, both, allreduce)
  std::unique_ptr<WeightExchange> model_exchange_;    // weights after the update (model, both, ...)
  std::unique_ptr<WeightExchange> momentum_exchange_;  // SGD momentum with them (gossipgrad)
  kernels::Sgd sgd_;  // the momentum's host copy (the update is state_'s)
  kernels::LrSchedule schedule_;
  // The step's forward, backward and update on the state, wherever it lives; the exchanges mix
  // its host copies (net_.store(), sgd_'s momentum).
  std::unique_ptr<kernels::TrainState> state_;
  bool one_node_ = false;   // train.resident: every rank shares this node
  std::string ipc_why_[2];  // ipc_refusal(false), ipc_refusal(true), once
  int64_t step_ = 0;
  int64_t model_due_ = -1;        // overlap_model: the round whose weights wait to be exchanged
  bool weights_pending_ = false;  // pipeline_weights: a round started, not yet finished
  double gate_waited_ = 0;        // seconds forward's gate waited for it
  int64_t sent_bytes_ = 0;        // by the exchanges, until the last step
  BucketExchange::Lateness lateness_;  // by the exchanges, until the last step
  double lr_scale_ = 1;                // the NaN guard lowers it
  int64_t consensus_averages_ = 0;
  double last_loss_ = 0;
  // Virtual ranks: each held rank's own state (empty for a real rank), and the exchanges they
  // join as they are made, with what of a rank each exchanges.
  struct HeldRank {
    HeldRank(int64_t params, int64_t buffers, const kernels::SgdOptions& o)
        : params(static_cast<size_t>(params)),
          grads(static_cast<size_t>(params)),
          buffers(static_cast<size_t>(buffers)),
          sgd(params, o) {}
    std::vector<float> params, grads, buffers;
    kernels::Sgd sgd;
    double loss = 0;
  };
  enum class Part { Params, Grads, Momentum };
  std::vector<HeldRank> held_;
  std::vector<std::pair<HeldRanks*, Part>> joins_;
  const int ranks_;  // of the run: world's, or train.virtual_ranks
};

// The partner schedule a config describes for `p` participants (ranks, or nodes with
// gossip.hierarchy = node). Throws UsageError naming gossip.schedule when it cannot serve p.
partners::Schedule gossip_schedule(const Config& c, int p);

// Compute threads for this rank: the configured count, or this node's cores shared evenly by
// the ranks on this node.
int compute_threads(const Config& c, const mpi::Comm& world);

// The model a config describes, for an input of `input` and `classes` classes; `rank` seeds the
// dropout masks.
kernels::ModelSpec model_spec(const Config& c, int rank, kernels::Dims input, int64_t classes);

// The same model on the data it is usually trained on: 28x28 grey images in 10 classes for the
// small nets (resnet8, cnn), ImageNet's 3x224x224 in 1000 classes for the torchvision ones. What
// `gossipgrad simulate` predicts for and what emulated compute exchanges.
kernels::ModelSpec usual_model_spec(const Config& c, int rank);

}  // namespace gg::gossip
