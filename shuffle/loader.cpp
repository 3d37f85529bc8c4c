// Partitioning of samples across ranks and the prefetching batch loader.
#include "shuffle/loader.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>

#include "shuffle/rng.hpp"

namespace gg::shuffle {

namespace {

// Leading stream_seed keys, one per purpose, so no two purposes ever share a random stream.
constexpr uint64_t kPermutationStream = 0x7065726d;   // "perm"
constexpr uint64_t kAugmentationStream = 0x61756720;  // "aug "

void check_ranks(const char* who, int rank, int ranks) {
  if (ranks < 1 || rank < 0 || rank >= ranks) {
    throw std::invalid_argument(std::string(who) + ": rank " + std::to_string(rank) +
                                " is outside [0, ranks) with ranks = " + std::to_string(ranks));
  }
}

// [begin, end) of rank's slice of the identity order: ceil(n/ranks) per rank, the tail short.
std::pair<int64_t, int64_t> sequential_slice(int64_t n, int rank, int ranks) {
  const int64_t chunk = (n + ranks - 1) / ranks;
  const int64_t begin = std::min(n, rank * chunk);
  return {begin, std::min(n, begin + chunk)};
}

}  // namespace

std::vector<int64_t> partition(int64_t n, int rank, int ranks, uint64_t seed, int64_t epoch,
                               bool shuffle) {
  check_ranks("partition", rank, ranks);
  if (n < 0) throw std::invalid_argument("partition: negative sample count " + std::to_string(n));
  if (!shuffle) {
    const auto [begin, end] = sequential_slice(n, rank, ranks);
    std::vector<int64_t> out(static_cast<size_t>(end - begin));
    std::iota(out.begin(), out.end(), begin);
    return out;
  }
  // Every rank draws the whole permutation (O(n), cheap next to an epoch of training) rather
  // than agreeing on it over the network.
  std::vector<int64_t> perm = permutation(n, seed, epoch);
  const int64_t per = n / ranks;
  perm.erase(perm.begin() + (rank + 1) * per, perm.end());
  perm.erase(perm.begin(), perm.begin() + rank * per);
  return perm;
}

std::vector<int64_t> permutation(int64_t n, uint64_t seed, int64_t epoch) {
  if (n < 0) throw std::invalid_argument("permutation: negative sample count " + std::to_string(n));
  std::vector<int64_t> perm(static_cast<size_t>(n));
  std::iota(perm.begin(), perm.end(), int64_t{0});
  std::mt19937_64 rng(stream_seed({kPermutationStream, seed, static_cast<uint64_t>(epoch)}));
  for (int64_t i = n - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(uniform_below(rng, static_cast<uint64_t>(i) + 1));
    std::swap(perm[static_cast<size_t>(i)], perm[static_cast<size_t>(j)]);
  }
  return perm;
}

int64_t batches_per_epoch(int64_t n, const LoaderOptions& o) {
  check_ranks("batches_per_epoch", o.rank, o.ranks);
  if (o.batch < 1) {
    throw std::invalid_argument("batches_per_epoch: batch must be >= 1, got " +
                                std::to_string(o.batch));
  }
  if (n < 0) {
    throw std::invalid_argument("batches_per_epoch: negative sample count " + std::to_string(n));
  }
  int64_t local = n / o.ranks;
  if (!o.shuffle) {
    const auto [begin, end] = sequential_slice(n, o.rank, o.ranks);
    local = end - begin;
  }
  return o.drop_last ? local / o.batch : (local + o.batch - 1) / o.batch;
}

namespace {

const Dataset& checked(const Dataset& d) {
  const auto fail = [](const std::string& why) {
    throw std::invalid_argument("PrefetchLoader: inconsistent dataset: " + why);
  };
  if (d.count < 0) fail("negative count " + std::to_string(d.count));
  if (d.channels < 0 || d.height < 0 || d.width < 0 || (d.count > 0 && d.sample_size() == 0)) {
    fail("bad sample shape " + std::to_string(d.channels) + "x" + std::to_string(d.height) + "x" +
         std::to_string(d.width));
  }
  if (static_cast<int64_t>(d.pixels.size()) != d.count * d.sample_size()) {
    fail(std::to_string(d.pixels.size()) + " pixel bytes for " + std::to_string(d.count) +
         " samples of " + std::to_string(d.sample_size()));
  }
  if (static_cast<int64_t>(d.labels.size()) != d.count) {
    fail(std::to_string(d.labels.size()) + " labels for " + std::to_string(d.count) + " samples");
  }
  return d;
}

const LoaderOptions& checked(const LoaderOptions& o) {
  const auto fail = [](const std::string& why) {
    throw std::invalid_argument("PrefetchLoader: " + why);
  };
  check_ranks("PrefetchLoader", o.rank, o.ranks);
  if (o.batch < 1) fail("batch must be >= 1, got " + std::to_string(o.batch));
  if (o.prefetch < 1) fail("prefetch must be >= 1, got " + std::to_string(o.prefetch));
  if (o.norm.std == 0.f) fail("norm.std must be non-zero");
  if (o.augment.enabled && o.augment.pad < 0) {
    fail("augment.pad must be >= 0, got " + std::to_string(o.augment.pad));
  }
  return o;
}

int64_t checked_epochs(int64_t first_epoch, int64_t epochs) {
  if (first_epoch < 0 || epochs < 0) {
    throw std::invalid_argument("PrefetchLoader: first_epoch and epochs must be >= 0, got " +
                                std::to_string(first_epoch) + " and " + std::to_string(epochs));
  }
  return epochs;
}

}  // namespace

namespace {

const SampleSource& checked_source(const SampleSource& src) {
  if (src.size() < 0) throw std::invalid_argument("PrefetchLoader: negative sample count");
  if (src.encoding() == Encoding::Pixels) {
    const auto [c, h, w] = src.shape();
    if (src.size() > 0 && (c <= 0 || h <= 0 || w <= 0))
      throw std::invalid_argument("PrefetchLoader: bad sample shape " + std::to_string(c) + "x" +
                                  std::to_string(h) + "x" + std::to_string(w));
  }
  return src;
}

}  // namespace

// Each worker's decode state, kept between batches so the steady state allocates nothing.
struct PrefetchLoader::Scratch {
  std::unique_ptr<JpegDecoder> jpeg;
  std::vector<uint8_t> bytes;
  Image image;
};

PrefetchLoader::PrefetchLoader(const Dataset& data, LoaderOptions o, int64_t first_epoch,
                               int64_t epochs)
    : owned_source_(std::make_unique<DatasetSource>(
          std::shared_ptr<const Dataset>(&checked(data), [](const Dataset*) {}), "dataset")),
      src_(*owned_source_),
      opt_(checked(o)),
      order_(nullptr),
      first_epoch_(first_epoch),
      epochs_(checked_epochs(first_epoch, epochs)),
      batches_per_epoch_(gg::shuffle::batches_per_epoch(data.count, opt_)),
      total_(epochs_ * batches_per_epoch_) {
  start();
}

PrefetchLoader::PrefetchLoader(const SampleSource& source, LoaderOptions o, int64_t first_epoch,
                               int64_t epochs, EpochOrder* order, int64_t first_batch)
    : src_(checked_source(source)),
      opt_(checked(o)),
      order_(order),
      first_epoch_(first_epoch),
      epochs_(checked_epochs(first_epoch, epochs)),
      batches_per_epoch_(order ? order->batches_per_epoch()
                               : gg::shuffle::batches_per_epoch(source.size(), opt_)),
      total_(epochs_ * batches_per_epoch_) {
  if (first_batch < 0 || (epochs_ > 0 && first_batch >= batches_per_epoch_))
    throw std::invalid_argument("PrefetchLoader: first_batch " + std::to_string(first_batch) +
                                " is outside the epoch's " + std::to_string(batches_per_epoch_) +
                                " batches");
  next_claim_ = next_out_ = first_batch;
  start();
}

void PrefetchLoader::start() {
  if (opt_.workers < 0 || opt_.workers > 256)
    throw std::invalid_argument("PrefetchLoader: workers must be in [0, 256], got " +
                                std::to_string(opt_.workers));
  if (src_.encoding() == Encoding::Jpeg) {
    const JpegOptions& j = opt_.jpeg;
    if ((j.channels != 1 && j.channels != 3) || j.crop < 1 || j.resize < j.crop)
      throw std::invalid_argument(
          "PrefetchLoader: JPEG output needs channels 1 or 3 and "
          "1 <= crop <= resize");
    for (int c = 0; c < j.channels; ++c)
      if (j.map.std[c] == 0.f) throw std::invalid_argument("PrefetchLoader: a channel std is 0");
    shape_ = {j.channels, j.crop, j.crop};
  } else {
    shape_ = src_.shape();
  }
  for (int v = 0; v < 256; ++v) {
    lut_[v] = (static_cast<float>(v) / 255.f - opt_.norm.mean) / opt_.norm.std;
  }
  if (opt_.workers == 0) own_scratch_ = std::make_unique<Scratch>();
  for (int w = 0; w < opt_.workers; ++w) workers_.emplace_back([this] { run(); });
}

PrefetchLoader::~PrefetchLoader() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  space_cv_.notify_all();
  if (order_) order_->cancel();
  for (std::thread& t : workers_) t.join();
}

int64_t PrefetchLoader::batches_per_epoch() const { return batches_per_epoch_; }

double PrefetchLoader::wait_seconds() const {
  std::lock_guard<std::mutex> lk(mu_);
  return wait_seconds_;
}

bool PrefetchLoader::next(Batch& out) {
  std::unique_lock<std::mutex> lk(mu_);
  if (next_out_ >= total_) return false;
  if (own_scratch_) {  // workers = 0: built here, in order; an error is thrown as it happens
    lk.unlock();
    const auto t0 = std::chrono::steady_clock::now();
    const int64_t epoch = first_epoch_ + next_out_ / batches_per_epoch_;
    fill(out, *order_of(epoch), epoch, next_out_ % batches_per_epoch_, *own_scratch_);
    lk.lock();
    ++next_out_;
    wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return true;
  }
  if (done_.find(next_out_) == done_.end()) {
    const auto t0 = std::chrono::steady_clock::now();
    ready_cv_.wait(lk, [this] { return done_.find(next_out_) != done_.end(); });
    wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  const auto it = done_.find(next_out_);
  if (it->second.error) {
    // Stays in place: every later call rethrows the same error.
    std::rethrow_exception(it->second.error);
  }
  Batch b = std::move(it->second.batch);
  done_.erase(it);
  ++next_out_;
  std::swap(out, b);
  // b now holds the caller's previous buffers: keep them for the workers to refill. The cap only
  // matters for callers that pass a fresh Batch every time.
  if (spare_.size() <= static_cast<size_t>(opt_.prefetch)) spare_.push_back(std::move(b));
  lk.unlock();
  space_cv_.notify_all();
  return true;
}

std::shared_ptr<const std::vector<int64_t>> PrefetchLoader::order_of(int64_t epoch) {
  {
    std::lock_guard<std::mutex> lk(order_mu_);
    auto it = orders_.find(epoch);
    if (it != orders_.end()) return it->second;
  }
  // Not under order_mu_: order() may block until the trainer has taken the batches of earlier
  // epochs, which other workers must be free to build meanwhile (with the lock held, a worker
  // waiting for epoch e + 1 kept the one building the trainer's next batch of epoch e out).
  auto order = std::make_shared<const std::vector<int64_t>>(
      order_ ? order_->order(epoch)
             : partition(src_.size(), opt_.rank, opt_.ranks, opt_.seed, epoch, opt_.shuffle));
  std::lock_guard<std::mutex> lk(order_mu_);
  auto [it, inserted] = orders_.emplace(epoch, std::move(order));
  // Workers span a few epochs at most (prefetch + workers batches); an evicted order is recomputed.
  // Without workers the batches come in order: the epoch in use is the only one kept.
  const size_t keep = opt_.workers == 0 ? 1 : 4;
  while (orders_.size() > keep)
    orders_.erase(orders_.begin() == it ? std::next(it) : orders_.begin());
  return it->second;
}

void PrefetchLoader::run() {
  Scratch scratch;
  // With w workers at most prefetch + w - 1 batches are claimed ahead of the consumer, so the
  // queue holds at most `prefetch` ready batches when the workers are faster than the trainer.
  const int64_t ahead = opt_.prefetch + opt_.workers - 1;
  while (true) {
    int64_t g = 0;
    Batch b;
    {
      std::unique_lock<std::mutex> lk(mu_);
      space_cv_.wait(
          lk, [&] { return stop_ || next_claim_ >= total_ || next_claim_ < next_out_ + ahead; });
      if (stop_ || next_claim_ >= total_) return;
      g = next_claim_++;
      if (!spare_.empty()) {
        b = std::move(spare_.back());
        spare_.pop_back();
      }
    }
    Slot slot;
    try {
      const int64_t epoch = first_epoch_ + g / batches_per_epoch_;
      const int64_t index = g % batches_per_epoch_;
      fill(b, *order_of(epoch), epoch, index, scratch);
      slot.batch = std::move(b);
    } catch (...) {
      slot.error = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lk(mu_);
      const bool failed = slot.error != nullptr;
      done_.emplace(g, std::move(slot));
      // After an error no later batch is needed: the consumer stops at the failed one.
      if (failed) next_claim_ = total_;
    }
    ready_cv_.notify_all();
    space_cv_.notify_all();
  }
}

void PrefetchLoader::skip(int64_t id, const std::string& why) {
  ++skipped_;
  std::lock_guard<std::mutex> lk(skip_mu_);
  if (logged_.insert(id).second)
    std::fprintf(stderr, "gossipgrad: skipping sample %s: %s (counted in the metrics)\n",
                 src_.name(id).c_str(), why.c_str());
}

void PrefetchLoader::fill(Batch& b, const std::vector<int64_t>& order, int64_t epoch, int64_t index,
                          Scratch& scratch) {
  const int64_t rows = opt_.batch;
  const int C = shape_[0], H = shape_[1], W = shape_[2];
  const int64_t size = static_cast<int64_t>(C) * H * W;
  const int64_t start = index * rows;
  const int64_t valid = std::min<int64_t>(rows, static_cast<int64_t>(order.size()) - start);
  // resize() keeps capacity, so recycled buffers are not reallocated; every element is written
  // below because a recycled buffer still holds an older batch.
  b.x.resize(static_cast<size_t>(rows * size));
  b.y.resize(static_cast<size_t>(rows));
  b.ids.resize(static_cast<size_t>(rows));
  b.epoch = epoch;
  b.index = index;
  b.valid = valid;

  const bool jpeg = src_.encoding() == Encoding::Jpeg;
  const int pad = opt_.augment.enabled ? opt_.augment.pad : 0;
  const bool may_flip = opt_.augment.enabled && opt_.augment.flip;
  std::mt19937_64 rng(stream_seed({kAugmentationStream, opt_.seed, static_cast<uint64_t>(opt_.rank),
                                   static_cast<uint64_t>(epoch), static_cast<uint64_t>(index)}));
  if (jpeg && !scratch.jpeg) scratch.jpeg = std::make_unique<JpegDecoder>();

  for (int64_t r = 0; r < valid; ++r) {
    const int64_t id = order[static_cast<size_t>(start + r)];
    const int32_t label = src_.label(id);
    const int classes = src_.classes();
    if (label < 0 || (classes > 0 && label >= classes)) {
      throw std::runtime_error("PrefetchLoader: sample " + std::to_string(id) + " has label " +
                               std::to_string(label) +
                               " outside [0, classes = " + std::to_string(classes) + ")");
    }
    b.y[static_cast<size_t>(r)] = label;
    b.ids[static_cast<size_t>(r)] = id;
    float* dst = b.x.data() + r * size;
    if (jpeg) {
      std::string error;
      bool ok = false;
      try {
        src_.read(id, scratch.bytes);
        ok = decode_to_chw(*scratch.jpeg, scratch.bytes.data(), scratch.bytes.size(), opt_.jpeg,
                           opt_.augment.enabled, may_flip, rng, scratch.image, dst, &error);
      } catch (const UnusableSample& e) {
        error = e.what();
      }
      if (!ok) {
        skip(id, error);
        b.y[static_cast<size_t>(r)] = -1;
        std::fill(dst, dst + size, 0.f);
      }
      continue;
    }
    const uint8_t* src = src_.pixels(id);
    if (src == nullptr) {
      src_.read(id, scratch.bytes);
      if (static_cast<int64_t>(scratch.bytes.size()) != size)
        throw std::runtime_error("PrefetchLoader: sample " + src_.name(id) + " holds " +
                                 std::to_string(scratch.bytes.size()) + " bytes, not " +
                                 std::to_string(C) + "x" + std::to_string(H) + "x" +
                                 std::to_string(W));
      src = scratch.bytes.data();
    }
    if (!opt_.augment.enabled) {
      for (int64_t k = 0; k < size; ++k) dst[k] = lut_[src[k]];
      continue;
    }
    // Output (y, x) reads padded input (y + dy, x + dx); flipping the crop mirrors x first.
    const int dy = pad > 0 ? static_cast<int>(uniform_below(rng, 2 * pad + 1)) - pad : 0;
    const int dx = pad > 0 ? static_cast<int>(uniform_below(rng, 2 * pad + 1)) - pad : 0;
    const bool flip = may_flip && (rng() >> 63) != 0;
    for (int c = 0; c < C; ++c) {
      for (int y = 0; y < H; ++y) {
        const int sy = y + dy;
        float* drow = dst + (static_cast<int64_t>(c) * H + y) * W;
        if (sy < 0 || sy >= H) {
          std::fill(drow, drow + W, lut_[0]);
          continue;
        }
        const uint8_t* srow = src + (static_cast<int64_t>(c) * H + sy) * W;
        for (int x = 0; x < W; ++x) {
          const int sx = (flip ? W - 1 - x : x) + dx;
          drow[x] = (sx < 0 || sx >= W) ? lut_[0] : lut_[srow[sx]];
        }
      }
    }
  }
  std::fill(b.x.begin() + valid * size, b.x.end(), 0.f);
  std::fill(b.y.begin() + valid, b.y.end(), -1);
  std::fill(b.ids.begin() + valid, b.ids.end(), -1);
}

}  // namespace gg::shuffle
