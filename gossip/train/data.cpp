#include "gossip/train/data.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <mutex>
#include <sstream>
#include <thread>

#include "gossip/train/agree.hpp"

namespace gg::gossip {

namespace {

// Mean and std of pixel/255 over a data set held in memory (Fashion-MNIST's normalisation).
shuffle::Normalize pixel_statistics(const shuffle::SampleSource& src) {
  const auto* d = dynamic_cast<const shuffle::DatasetSource*>(&src);
  if (d == nullptr) return {0.5f, 0.2887f};  // uniform random bytes (synthetic)
  double sum = 0, sq = 0;
  for (uint8_t v : d->data().pixels) {
    sum += v / 255.0;
    sq += (v / 255.0) * (v / 255.0);
  }
  const double npx = static_cast<double>(d->data().pixels.size());
  const float mean = static_cast<float>(sum / npx);
  const float stddev =
      static_cast<float>(std::sqrt(std::max(1e-12, sq / npx - (sum / npx) * (sum / npx))));
  return {mean, stddev};
}

// What a rank's copy of the data is, for comparing the ranks' copies: sample counts, classes,
// the sample shape and the pixel statistics (a cheap fingerprint of the pixels themselves).
std::string data_summary(const shuffle::SampleSource& train, const shuffle::SampleSource* eval,
                         const shuffle::Normalize& norm) {
  const std::array<int, 3> d = train.shape();
  char text[256];
  std::snprintf(text, sizeof text,
                "%lld training samples of %dx%dx%d in %d classes, %lld test samples, pixel mean "
                "%.6f std %.6f",
                static_cast<long long>(train.size()), d[0], d[1], d[2], train.classes(),
                static_cast<long long>(eval ? eval->size() : 0), norm.mean, norm.std);
  return text;
}

// Ranks that read their own copy of the data (node-local storage) must hold the same data set:
// another sample count gives another number of steps per epoch (the ranks' exchanges would stop
// matching), other classes or shapes another model. One line names the first rank that differs.
void agree_on_data(const mpi::Comm& world, const std::string& mine, const std::string& where) {
  std::string lead = mine;
  world.broadcast(lead, 0);
  // Every rank whose copy differs fails; the lowest one's line is every rank's (throw_agreed).
  mpi::RankError differs;
  if (lead != mine)
    differs = {"data.source = " + where + ": the ranks read different data: rank 0 has " + lead +
                   "; rank " + std::to_string(world.rank()) + " has " + mine +
                   ": give every node the same copy of the data set",
               true};
  throw_agreed(world, differs);
}

}  // namespace

// The epoch's permutation of the training samples, drawn once for every virtual rank (real ranks
// each draw the same one): rank r's loader asks for its slice, as partition() would cut it.
class SharedPermutation {
 public:
  SharedPermutation(int64_t n, uint64_t seed) : n_(n), seed_(seed) {}
  std::vector<int64_t> slice(int64_t epoch, int rank, int ranks) {
    std::lock_guard<std::mutex> lk(mu_);
    if (epoch != epoch_) {
      perm_ = shuffle::permutation(n_, seed_, epoch);
      epoch_ = epoch;
    }
    const int64_t per = n_ / ranks;
    return {perm_.begin() + rank * per, perm_.begin() + (rank + 1) * per};
  }

 private:
  const int64_t n_;
  const uint64_t seed_;
  std::mutex mu_;
  int64_t epoch_ = -1;
  std::vector<int64_t> perm_;
};

// A virtual rank's order of the samples: its slice of the shared permutation.
class RankSlice : public shuffle::EpochOrder {
 public:
  RankSlice(SharedPermutation& perm, int rank, int ranks, int64_t batches)
      : perm_(perm), rank_(rank), ranks_(ranks), batches_(batches) {}
  int64_t batches_per_epoch() const override { return batches_; }
  std::vector<int64_t> order(int64_t epoch) override { return perm_.slice(epoch, rank_, ranks_); }

 private:
  SharedPermutation& perm_;
  const int rank_, ranks_;
  const int64_t batches_;
};

shuffle::LoaderOptions rank_loader_options(const Config& c, const shuffle::SampleSource& train,
                                           int rank, int ranks) {
  shuffle::LoaderOptions o;
  o.batch = c.train.batch;
  o.rank = rank;
  o.ranks = ranks;
  o.seed = c.train.seed;
  o.augment.enabled = c.data.augment;
  o.prefetch = c.data.prefetch;
  o.norm = pixel_statistics(train);
  o.jpeg.crop = c.data.crop;
  o.jpeg.resize = c.data.resize;
  o.workers = c.data.workers > 0 ? c.data.workers : 1;
  return o;
}

TrainingData::TrainingData(const Config& c, const mpi::Comm& world)
    : c_(c), world_(world), ranks_(run_ranks(c, world.size())) {
  const int rank = world.rank(), ranks = ranks_;
  // Every rank opens the data; if any fails, all stop with the first failing rank's message.
  mpi::RankError error;
  try {
    const shuffle::SourceSpec spec = data_source(c);
    const std::string labels = val_labels_file(c);
    shuffle::DataSplits splits = shuffle::open_splits(spec, labels);
    train_ = std::move(splits.train);
    if (!emulated(c)) eval_ = std::move(splits.eval);  // emulated compute reports no accuracy
  } catch (const std::exception& e) {
    error = {"data.source = " + c.data.source + ": " + e.what(), true};
  }
  throw_agreed(world, error);

  lo_ = rank_loader_options(c, *train_, rank, ranks);
  agree_on_data(world, data_summary(*train_, eval_.get(), lo_.norm), c.data.source);
  if (c.train.virtual_ranks > 0) {
    // No thread per rank: a rank's batch is built when its turn comes (shuffle refused).
    lo_.workers = 0;
    permutation_ = std::make_unique<SharedPermutation>(train_->size(), lo_.seed);
  } else if (c.data.workers == 0) {
    mpi::Comm node = world.split_shared();
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    if (train_->encoding() == shuffle::Encoding::Jpeg)
      lo_.workers = std::clamp(cores / node.size(), 2, 8);
  }

  const shuffle::ShuffleMode mode = c.data.shuffle;
  if (mode == shuffle::ShuffleMode::Off) {
    steps_per_epoch_ = shuffle::batches_per_epoch(train_->size(), lo_);
  } else {
    shuffle::ShuffleOptions so;
    so.mode = mode;
    so.per_step = c.data.shuffle_per_step;
    so.batch = c.train.batch;
    so.rank = rank;
    so.ranks = ranks;
    so.seed = c.train.seed;
    so.schedule = {partners::Kind::Dissemination, ranks, true, c.train.seed ^ 0x5348554646ULL};
    const int64_t per_epoch = train_->size() / ranks / c.train.batch;
    // The quiet tail lets the loader build the next epoch's first batches before it starts.
    so.quiet_steps = std::min<int64_t>(lo_.prefetch + lo_.workers, per_epoch / 2);
    if (per_epoch >= 1) {
      channel_ = std::make_unique<MpiShuffleChannel>(world);
      shuffle_ = std::make_unique<shuffle::DistributedShuffle>(*train_, so, *channel_);
      steps_per_epoch_ = shuffle_->batches_per_epoch();
    }
  }
  if (steps_per_epoch_ < 1)
    throw UsageError(no_full_batch(c, train_->size(), ranks, c.train.virtual_ranks > 0));
}

int64_t full_batches_per_epoch(const Config& c, int64_t samples, int ranks) {
  if (c.data.shuffle != shuffle::ShuffleMode::Off) return samples / ranks / c.train.batch;
  shuffle::LoaderOptions o;  // a training loader: every rank takes samples / ranks of them
  o.batch = c.train.batch;
  o.ranks = ranks;
  return shuffle::batches_per_epoch(samples, o);
}

std::string no_full_batch(const Config& c, int64_t samples, int ranks, bool virtual_ranks) {
  return "train.batch = " + std::to_string(c.train.batch) +
         " is too large: " + std::to_string(samples) + " samples over " + std::to_string(ranks) +
         (virtual_ranks ? " virtual" : "") + " ranks give no full batch";
}

TrainingData::~TrainingData() {
  loader_.reset();  // stops the workers before the shuffle they may be waiting on goes away
}

void TrainingData::add_rank(int64_t epochs) {
  const int r = static_cast<int>(held_.size());
  shuffle::LoaderOptions o = lo_;
  o.rank = r;
  orders_.push_back(std::make_unique<RankSlice>(*permutation_, r, ranks_, steps_per_epoch_));
  held_.push_back(
      std::make_unique<shuffle::PrefetchLoader>(*train_, o, 0, epochs, orders_.back().get()));
}

bool TrainingData::next_of(int i, shuffle::Batch& batch) {
  return held_[static_cast<size_t>(i)]->next(batch);
}

double TrainingData::wait_seconds() const {
  if (!held_.empty()) return held_[0]->wait_seconds();
  return loader_ ? loader_->wait_seconds() : 0;
}

int64_t TrainingData::skipped() const {
  if (!held_.empty()) return held_[0]->skipped();
  return loader_ ? loader_->skipped() : 0;
}

int64_t TrainingData::held_skipped() const {
  int64_t n = loader_ ? loader_->skipped() : 0;
  for (const auto& l : held_) n += l->skipped();
  return n;
}

int64_t TrainingData::steps_per_epoch_at(int ranks) const {
  if (ranks == ranks_ || ranks < 1) return steps_per_epoch_;
  if (shuffle_) return std::max<int64_t>(1, train_->size() / ranks / c_.train.batch);
  shuffle::LoaderOptions o = lo_;
  o.rank = 0;
  o.ranks = ranks;
  return std::max<int64_t>(1, shuffle::batches_per_epoch(train_->size(), o));
}

kernels::Dims TrainingData::input() const {
  if (train_->encoding() == shuffle::Encoding::Jpeg)
    return {lo_.jpeg.channels, lo_.jpeg.crop, lo_.jpeg.crop};
  const auto [ch, h, w] = train_->shape();
  return {ch, h, w};
}

std::string TrainingData::describe() const {
  std::string s = train_->describe();
  if (eval_) s += "; eval: " + eval_->describe();
  s +=
      "; " + std::to_string(lo_.workers) + " loader thread(s); shuffle " + text_of(c_.data.shuffle);
  if (shuffle_) s += " (" + std::to_string(c_.data.shuffle_per_step) + " samples/step)";
  return s;
}

void TrainingData::start(int64_t epochs, int64_t first_step) {
  if (permutation_) return;  // virtual ranks' loaders are made with the ranks (add_rank)
  const int64_t first_epoch = std::min(first_step / steps_per_epoch_, epochs);
  const int64_t first_batch = first_epoch < epochs ? first_step % steps_per_epoch_ : 0;
  if (shuffle_)
    loader_ = std::make_unique<shuffle::PrefetchLoader>(
        shuffle_->source(), lo_, first_epoch, epochs - first_epoch, shuffle_.get(), first_batch);
  else
    loader_ = std::make_unique<shuffle::PrefetchLoader>(*train_, lo_, first_epoch,
                                                        epochs - first_epoch, nullptr, first_batch);
}

std::vector<uint8_t> TrainingData::save_shuffle() const {
  if (!shuffle_) return {};
  std::ostringstream out;
  shuffle_->save(out);
  const std::string s = out.str();
  return {s.begin(), s.end()};
}

void TrainingData::restore_shuffle(const std::vector<uint8_t>& state) {
  std::istringstream in(std::string(state.begin(), state.end()));
  shuffle_->restore(in);
}

void TrainingData::shuffle_start_at(int64_t step) {
  if (shuffle_) shuffle_->start_at(step);
}

bool TrainingData::next(int64_t step, shuffle::Batch& batch) {
  if (!loader_->next(batch)) return false;
  if (shuffle_) shuffle_->start(step, batch.ids);
  return true;
}

void TrainingData::finish_step(int64_t step) {
  if (shuffle_) shuffle_->finish(step);
}

shuffle::LoaderOptions TrainingData::eval_options() const {
  shuffle::LoaderOptions o = lo_;
  o.augment.enabled = false;
  return o;
}

}  // namespace gg::gossip
