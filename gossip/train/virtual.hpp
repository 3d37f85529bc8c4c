// Virtual ranks (train.virtual_ranks = P): P logical ranks trained in this one process, each with
// what a real rank holds (weights, SGD momentum, gradients, batch-norm running statistics, the
// wire codecs' error-feedback residues, its data shard and augmentation stream) and mixing through
// the same rules (comm/mixing.hpp), wire codecs (comm/wire.hpp) and partner schedule as `mpirun -n
// P` would, so that what P ranks learn is known without P machines. One network computes every
// rank's forward and backward in turn (its buffers swapped in and out): the compute is about that
// of one rank training the same epochs, the memory P times the per-rank state (measured on rank 0
// and refused up front when it would not fit; no thread per rank).
//
// The step is the real one: the Trainer (trainer.hpp) holds the P ranks' states and runs
// Trainer::step over them, with virtual exchanges (virtual_exchange.hpp) where a real rank has the
// engine's: the overlapped weight exchange of the previous update, every rank's forward and
// backward, the gradients' exchange (grad, both; allreduce as a sum over ranks in MPICH's order;
// the node hierarchy on logical nodes), the update, the weights' and momentum's exchange (model,
// both, gossipgrad; every gossip.model_every updates), the exact global average
// (gossip.global_every), consensus control and the consensus distance; staleness 1 through a
// stated lateness model (train.virtual_late). What is here: the ranks' data (their slices of one
// permutation), the memory plan, and the run's progress, metrics, evaluations and summary. The
// distributed shuffle, checkpoints and fault hooks are refused at the start (gossip/config:
// check_virtual). Its proof: tests/gossip/cli/virtual_ranks.sh compares its per-rank losses
// (log.losses) and every metrics event with a real `mpirun -n 4` run's, bit for bit.
#pragma once

#include "gossip/comm/mpi.hpp"
#include "gossip/config/config.hpp"
#include "gossip/train/loop.hpp"

namespace gg::gossip {

// The whole job on train.virtual_ranks logical ranks: progress, metrics (every event tagged
// "virtual": true), evaluation of the ranks' average model plus each rank's own top-1 on
// train.rank_eval_samples test samples (min / median / max), and the summary. Throws UsageError
// for what the user must change.
RunSummary run_virtual(const Config& c, const mpi::Comm& world);

}  // namespace gg::gossip
