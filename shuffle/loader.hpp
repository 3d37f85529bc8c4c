// The per-rank data path: which samples a rank sees each epoch (partition) and a prefetching
// loader that turns them into normalised, augmented float batches on a worker thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "shuffle/dataset.hpp"

namespace gg::shuffle {

struct Normalize {
  float mean = 0.f, std = 1.f;  // applied to pixel/255
};

// Random crop with zero padding `pad`, then random horizontal flip. The border is pixel value 0
// before normalisation (as torchvision pads), so it reads as black, not as the mean.
struct Augment {
  bool enabled = false;
  int pad = 2;
  bool flip = true;
};

struct LoaderOptions {
  int64_t batch = 32;  // per-rank batch
  int rank = 0, ranks = 1;
  uint64_t seed = 1;
  Normalize norm;
  Augment augment;
  int prefetch = 4;       // bounded queue depth (batches)
  bool shuffle = true;    // false: sequential order (evaluation)
  bool drop_last = true;  // false: the last partial batch is padded with label -1 rows (x zeros)
};

// A ready batch: x is batch*C*H*W float NCHW (normalised, augmented), y has batch labels
// (-1 = padding). ids holds the dataset index of each row (-1 = padding), so a trainer can log or
// exchange the exact samples it trained on.
struct Batch {
  std::vector<float> x;
  std::vector<int32_t> y;
  int64_t epoch = 0;
  int64_t index = 0;  // batch index within epoch
  int64_t valid = 0;  // rows [0, valid) are real samples, the rest padding
  std::vector<int64_t> ids;
};

// Which sample indices rank r sees in epoch e: a seeded global permutation of [0,n) that every
// rank computes identically from (seed, epoch) (no communication), cut into `ranks` equal
// contiguous slices of floor(n/ranks) samples (the remainder is dropped that epoch when
// shuffling, so all ranks take the same number of steps); with shuffle=false the identity order
// and slices of ceil(n/ranks) except the last (trailing ranks may get fewer, even none).
// Throws std::invalid_argument for n < 0, ranks < 1 or rank outside [0, ranks).
std::vector<int64_t> partition(int64_t n, int rank, int ranks, uint64_t seed, int64_t epoch,
                               bool shuffle);

// Identical on every rank when shuffle=true; with shuffle=false it counts this rank's slice.
int64_t batches_per_epoch(int64_t n, const LoaderOptions& o);

// A prefetching loader: one worker thread fills a bounded queue of ready batches for the epochs
// [first_epoch, first_epoch + epochs). `data` must outlive the loader. The augmentation RNG is
// seeded from (seed, rank, epoch, batch index), so batches are reproducible and independent of
// thread timing and of `prefetch`. Batch buffers are recycled: pass the same Batch to next() each
// step and the steady state allocates nothing.
class PrefetchLoader {
 public:
  // Throws std::invalid_argument for inconsistent data (pixels/labels sizes) or options (batch,
  // prefetch, ranks, norm.std == 0, negative pad, negative epochs).
  PrefetchLoader(const Dataset& data, LoaderOptions o, int64_t first_epoch, int64_t epochs);
  // Stops and joins the worker even if batches remain unconsumed.
  ~PrefetchLoader();
  PrefetchLoader(const PrefetchLoader&) = delete;
  PrefetchLoader& operator=(const PrefetchLoader&) = delete;

  // Blocks until a batch is ready and swaps it into `out` (out's old buffers are reused); returns
  // false after the last batch of the last epoch. An error in the worker (e.g. a label outside
  // [0, data.classes)) is rethrown here once the batches built before it have been handed out.
  bool next(Batch& out);
  int64_t batches_per_epoch() const;
  double wait_seconds() const;  // total time next() spent blocked waiting for data

 private:
  void run();
  void fill(Batch& b, const std::vector<int64_t>& order, int64_t epoch, int64_t index) const;

  const Dataset& data_;
  const LoaderOptions opt_;
  const int64_t first_epoch_, epochs_, batches_per_epoch_;
  float lut_[256];  // pixel byte -> normalised float, so the hot loop is a table lookup

  mutable std::mutex mu_;
  std::condition_variable ready_cv_;  // consumer waits: a batch arrived, or the worker finished
  std::condition_variable space_cv_;  // worker waits: the queue has room, or stop was requested
  std::deque<Batch> ready_;
  std::vector<Batch> spare_;  // buffers handed back by next(), reused by the worker
  bool stop_ = false, done_ = false;
  std::exception_ptr error_;
  double wait_seconds_ = 0;
  std::thread worker_;  // last: started after every member above is initialised
};

}  // namespace gg::shuffle
