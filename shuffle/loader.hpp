// The per-rank data path: which samples a rank sees each epoch (partition) and a prefetching
// loader whose worker threads turn them into normalised, augmented float batches.
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "shuffle/dataset.hpp"
#include "shuffle/image.hpp"
#include "shuffle/source.hpp"

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
  Normalize norm;  // pixel sources
  Augment augment;
  JpegOptions jpeg;       // encoded sources (image.hpp)
  int prefetch = 4;       // bounded queue depth (batches)
  int workers = 1;        // threads building batches; 0: next() builds each batch itself
  bool shuffle = true;    // false: sequential order (evaluation)
  bool drop_last = true;  // false: the last partial batch is padded with label -1 rows (x zeros)
};

// Which samples this rank visits in each epoch, in order, when not partition(): the distributed
// shuffle implements it. order() is called from a loader thread and may block until the order is
// known; cancel() must make a blocked order() throw so a loader can shut down.
class EpochOrder {
 public:
  virtual ~EpochOrder() = default;
  virtual int64_t batches_per_epoch() const = 0;
  virtual std::vector<int64_t> order(int64_t epoch) = 0;
  virtual void cancel() {}
};

// A ready batch: x is batch*C*H*W float NCHW (normalised, augmented), y has batch labels
// (-1 = padding, or a sample skipped because it failed to decode). ids holds the sample id of each
// row (-1 = padding; a skipped sample keeps its id), so a trainer can log or exchange the exact
// samples it visited.
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

// The seeded permutation of [0, n) of an epoch that partition() cuts into slices: rank r's slice
// is [r * floor(n/ranks), (r + 1) * floor(n/ranks)).
std::vector<int64_t> permutation(int64_t n, uint64_t seed, int64_t epoch);

// Identical on every rank when shuffle=true; with shuffle=false it counts this rank's slice.
int64_t batches_per_epoch(int64_t n, const LoaderOptions& o);

// A prefetching loader: `workers` threads build the batches of the epochs
// [first_epoch, first_epoch + epochs) into a bounded queue, handed out in order. With workers = 0
// there are no threads: next() builds the batch in the caller's thread (thousands of virtual
// ranks each own a loader; a thread each would cost more than their batches). Pixel samples
// get the pad-crop/flip augmentation, JPEG samples are decoded (TurboJPEG, DCT-scaled) and
// transformed as JpegOptions says. The augmentation RNG is seeded from (seed, rank, epoch, batch
// index), so batches are reproducible and independent of thread count, timing and `prefetch`.
// A sample that fails to decode (corrupt, above the decoder's limits, or UnusableSample from the
// source) is skipped (its row becomes label -1 padding), counted, and logged to stderr once per
// sample. Batch buffers are recycled: pass the same Batch to next() each step and the steady
// state allocates nothing.
class PrefetchLoader {
 public:
  // Throws std::invalid_argument for inconsistent data (pixels/labels sizes) or options (batch,
  // prefetch, workers, ranks, norm.std == 0, negative pad, negative epochs). `data` must outlive
  // the loader.
  PrefetchLoader(const Dataset& data, LoaderOptions o, int64_t first_epoch, int64_t epochs);
  // The same over any source; `order` (may be null: partition()) must outlive the loader.
  // `first_batch` skips the first batches of first_epoch (a run resumed mid-epoch) without
  // building them; it must be < batches_per_epoch() unless epochs == 0.
  PrefetchLoader(const SampleSource& source, LoaderOptions o, int64_t first_epoch, int64_t epochs,
                 EpochOrder* order = nullptr, int64_t first_batch = 0);
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
  int64_t skipped() const { return skipped_.load(); }  // samples that failed to decode
  // C, H, W of every sample in a batch.
  std::array<int, 3> sample_shape() const { return shape_; }

 private:
  struct Scratch;  // per-worker decode state
  struct Slot {
    Batch batch;
    std::exception_ptr error;
  };
  void start();
  void run();
  std::shared_ptr<const std::vector<int64_t>> order_of(int64_t epoch);
  void fill(Batch& b, const std::vector<int64_t>& order, int64_t epoch, int64_t index, Scratch& s);
  void skip(int64_t id, const std::string& why);

  std::unique_ptr<SampleSource> owned_source_;  // the Dataset constructor's view
  const SampleSource& src_;
  const LoaderOptions opt_;
  EpochOrder* order_;
  const int64_t first_epoch_, epochs_, batches_per_epoch_, total_;
  std::array<int, 3> shape_;
  float lut_[256];  // pixel byte -> normalised float, so the hot loop is a table lookup

  std::mutex order_mu_;  // computes and caches the epoch orders
  std::map<int64_t, std::shared_ptr<const std::vector<int64_t>>> orders_;

  mutable std::mutex mu_;
  std::condition_variable ready_cv_;  // consumer waits: the next batch arrived
  std::condition_variable space_cv_;  // workers wait: the queue has room, or stop was requested
  std::map<int64_t, Slot> done_;      // built batches by global batch number
  std::vector<Batch> spare_;          // buffers handed back by next(), reused by the workers
  int64_t next_claim_ = 0, next_out_ = 0;
  bool stop_ = false;
  double wait_seconds_ = 0;
  std::atomic<int64_t> skipped_{0};
  std::mutex skip_mu_;
  std::set<int64_t> logged_;              // samples already reported as corrupt
  std::unique_ptr<Scratch> own_scratch_;  // workers = 0: next()'s decode state
  std::vector<std::thread> workers_;      // last: started after every member above is initialised
};

}  // namespace gg::shuffle
