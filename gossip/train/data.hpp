// The data side of `gossipgrad train`: the configured sources ([data] source), the prefetching
// loader, and the distributed shuffle over the MPI channel that moves its samples.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gossip/comm/mpi.hpp"
#include "gossip/comm/shuffle_channel.hpp"
#include "gossip/config/config.hpp"
#include "kernels/graph.hpp"
#include "shuffle/distributed.hpp"
#include "shuffle/loader.hpp"
#include "shuffle/source.hpp"

namespace gg::gossip {

// The loader options of rank `rank` of `ranks` on the configured training data: batch, seed,
// augmentation, the normalisation from the training pixels, data.workers (0: one thread; a job
// of JPEG data shares its nodes' cores instead, TrainingData).
shuffle::LoaderOptions rank_loader_options(const Config& c, const shuffle::SampleSource& train,
                                           int rank, int ranks);

// A rank's training steps per epoch over `ranks` ranks (real or virtual) from the sample count
// alone, as TrainingData and the virtual run count them: 0 when train.batch exceeds a rank's
// share of the samples. What `train --dry-run` checks without a loader.
int64_t full_batches_per_epoch(const Config& c, int64_t samples, int ranks);
// The refusal of that case: "train.batch = B is too large: N samples over P [virtual] ranks give
// no full batch".
std::string no_full_batch(const Config& c, int64_t samples, int ranks, bool virtual_ranks);

class SharedPermutation;
class RankSlice;

// Opens the configured training and evaluation data on every rank. A missing or unreadable data
// path, or data whose splits disagree (image shapes, labels outside the classes), becomes a
// UsageError with one line on every rank (the first failing rank's message), so all ranks stop
// before training. With train.virtual_ranks = P it is the data of P ranks in this one process:
// each a loader without threads over its slice of one epoch permutation that all share (what
// `mpirun -n P` gives each rank), made by add_rank() and building its batch when its turn comes.
class TrainingData {
 public:
  TrainingData(const Config& c, const mpi::Comm& world);
  ~TrainingData();

  kernels::Dims input() const;
  int64_t classes() const { return train_->classes(); }
  int64_t train_count() const { return train_->size(); }
  int64_t eval_count() const { return eval_ ? eval_->size() : 0; }
  int64_t steps_per_epoch() const { return steps_per_epoch_; }
  // The steps per epoch of the same data over `ranks` ranks (a plan made at another rank count).
  int64_t steps_per_epoch_at(int ranks) const;
  std::string describe() const;  // one line: source, sizes, shuffle

  // Starts the loader for epochs [0, epochs), at step `first_step` (a resumed run).
  void start(int64_t epochs, int64_t first_step = 0);
  // The distributed shuffle's state, for checkpoints (empty with data.shuffle = off), and back;
  // before start(). shuffle_start_at: the samples are reassigned afresh, training starting at
  // `step` (a checkpoint of another rank count).
  bool shuffles() const { return shuffle_ != nullptr; }
  std::vector<uint8_t> save_shuffle() const;
  void restore_shuffle(const std::vector<uint8_t>& state);
  void shuffle_start_at(int64_t step);
  // The batch of step `step`; with the shuffle on, its exchange starts here.
  bool next(int64_t step, shuffle::Batch& batch);
  // Virtual ranks: the next rank's loader over `epochs` epochs, and held rank i's next batch.
  void add_rank(int64_t epochs);
  bool next_of(int i, shuffle::Batch& batch);
  // The ranks whose shards this data is cut into: the processes', or the virtual ones.
  int ranks() const { return ranks_; }
  // After the step's forward/backward: completes the shuffle exchange of `step`.
  void finish_step(int64_t step);
  // This rank's (virtual ranks: rank 0's) time waiting for batches and samples it skipped.
  double wait_seconds() const;
  int64_t skipped() const;
  // Samples skipped by every rank this process holds.
  int64_t held_skipped() const;
  int64_t shuffled_samples() const { return shuffle_ ? shuffle_->samples_sent() : 0; }

  // Evaluation: nullptr when the source has no evaluation split.
  const shuffle::SampleSource* eval_source() const { return eval_.get(); }
  // Loader options for evaluation (normalisation, transform; batch and ranks set by the caller).
  shuffle::LoaderOptions eval_options() const;

 private:
  const Config& c_;
  const mpi::Comm& world_;
  std::unique_ptr<shuffle::SampleSource> train_, eval_;
  shuffle::LoaderOptions lo_;
  std::unique_ptr<MpiShuffleChannel> channel_;
  std::unique_ptr<shuffle::DistributedShuffle> shuffle_;
  std::unique_ptr<shuffle::PrefetchLoader> loader_;
  int64_t steps_per_epoch_ = 0;
  const int ranks_;
  std::unique_ptr<SharedPermutation> permutation_;  // virtual ranks
  std::vector<std::unique_ptr<RankSlice>> orders_;
  std::vector<std::unique_ptr<shuffle::PrefetchLoader>> held_;
};

}  // namespace gg::gossip
