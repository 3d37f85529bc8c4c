// Partitioning of samples across ranks and the prefetching batch loader.
#include "shuffle/loader.hpp"

#include <algorithm>
#include <chrono>
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
  std::vector<int64_t> perm(static_cast<size_t>(n));
  std::iota(perm.begin(), perm.end(), int64_t{0});
  std::mt19937_64 rng(stream_seed({kPermutationStream, seed, static_cast<uint64_t>(epoch)}));
  for (int64_t i = n - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(uniform_below(rng, static_cast<uint64_t>(i) + 1));
    std::swap(perm[static_cast<size_t>(i)], perm[static_cast<size_t>(j)]);
  }
  const int64_t per = n / ranks;
  perm.erase(perm.begin() + (rank + 1) * per, perm.end());
  perm.erase(perm.begin(), perm.begin() + rank * per);
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

PrefetchLoader::PrefetchLoader(const Dataset& data, LoaderOptions o, int64_t first_epoch,
                               int64_t epochs)
    : data_(checked(data)),
      opt_(checked(o)),
      first_epoch_(first_epoch),
      epochs_(checked_epochs(first_epoch, epochs)),
      batches_per_epoch_(gg::shuffle::batches_per_epoch(data.count, opt_)) {
  for (int v = 0; v < 256; ++v) {
    lut_[v] = (static_cast<float>(v) / 255.f - opt_.norm.mean) / opt_.norm.std;
  }
  worker_ = std::thread([this] { run(); });
}

PrefetchLoader::~PrefetchLoader() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  space_cv_.notify_all();
  worker_.join();
}

int64_t PrefetchLoader::batches_per_epoch() const { return batches_per_epoch_; }

double PrefetchLoader::wait_seconds() const {
  std::lock_guard<std::mutex> lk(mu_);
  return wait_seconds_;
}

bool PrefetchLoader::next(Batch& out) {
  std::unique_lock<std::mutex> lk(mu_);
  if (ready_.empty() && !done_) {
    const auto t0 = std::chrono::steady_clock::now();
    ready_cv_.wait(lk, [this] { return !ready_.empty() || done_; });
    wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  if (ready_.empty()) {
    if (error_) std::rethrow_exception(error_);
    return false;
  }
  Batch b = std::move(ready_.front());
  ready_.pop_front();
  std::swap(out, b);
  // b now holds the caller's previous buffers: keep them for the worker to refill. The cap only
  // matters for callers that pass a fresh Batch every time.
  if (spare_.size() <= static_cast<size_t>(opt_.prefetch)) spare_.push_back(std::move(b));
  lk.unlock();
  space_cv_.notify_one();
  return true;
}

void PrefetchLoader::run() {
  try {
    for (int64_t e = first_epoch_; e < first_epoch_ + epochs_; ++e) {
      const std::vector<int64_t> order =
          partition(data_.count, opt_.rank, opt_.ranks, opt_.seed, e, opt_.shuffle);
      for (int64_t i = 0; i < batches_per_epoch_; ++i) {
        Batch b;
        {
          std::unique_lock<std::mutex> lk(mu_);
          space_cv_.wait(
              lk, [this] { return stop_ || ready_.size() < static_cast<size_t>(opt_.prefetch); });
          if (stop_) return;
          if (!spare_.empty()) {
            b = std::move(spare_.back());
            spare_.pop_back();
          }
        }
        fill(b, order, e, i);
        {
          std::lock_guard<std::mutex> lk(mu_);
          ready_.push_back(std::move(b));
        }
        ready_cv_.notify_one();
      }
    }
  } catch (...) {
    std::lock_guard<std::mutex> lk(mu_);
    error_ = std::current_exception();
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    done_ = true;
  }
  ready_cv_.notify_all();
}

void PrefetchLoader::fill(Batch& b, const std::vector<int64_t>& order, int64_t epoch,
                          int64_t index) const {
  const int64_t rows = opt_.batch;
  const int64_t size = data_.sample_size();
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

  const int C = data_.channels, H = data_.height, W = data_.width;
  const int pad = opt_.augment.enabled ? opt_.augment.pad : 0;
  const bool may_flip = opt_.augment.enabled && opt_.augment.flip;
  std::mt19937_64 rng(stream_seed({kAugmentationStream, opt_.seed, static_cast<uint64_t>(opt_.rank),
                                   static_cast<uint64_t>(epoch), static_cast<uint64_t>(index)}));

  for (int64_t r = 0; r < valid; ++r) {
    const int64_t id = order[static_cast<size_t>(start + r)];
    const int32_t label = data_.labels[static_cast<size_t>(id)];
    if (label < 0 || (data_.classes > 0 && label >= data_.classes)) {
      throw std::runtime_error("PrefetchLoader: sample " + std::to_string(id) + " has label " +
                               std::to_string(label) +
                               " outside [0, classes = " + std::to_string(data_.classes) + ")");
    }
    b.y[static_cast<size_t>(r)] = label;
    b.ids[static_cast<size_t>(r)] = id;
    const uint8_t* src = data_.pixels.data() + id * size;
    float* dst = b.x.data() + r * size;
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
