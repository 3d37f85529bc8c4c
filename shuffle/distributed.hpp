// The asynchronous distributed shuffle: each rank owns a set of samples; every step it gives
// `per_step` of the samples it has just trained on to its shuffle partner (a rotating schedule
// from partners/) and receives as many from another rank. The policy lives here; the bytes move
// through a ShuffleChannel that gossip/ implements with MPI.
//
// Protocol of one step t (every rank, in lockstep with training):
//   1. start(t, used): the first per_step ids of the batch used at step t are given to
//      partners(t).send_to: ids only (mode ids: storage every rank can read) or ids, labels and
//      encoded bytes (mode bytes: node-local storage); the channel starts the transfer and the
//      receive from partners(t).recv_from, and training runs forward/backward meanwhile.
//   2. finish(t): waits for the transfer and commits it: the given ids leave the owned set, the
//      received ones join it (bytes kept in memory until given away again).
// Epochs: the order of epoch e is a seeded permutation of the owned set at its start. Samples
// given away were already used in this epoch and received ones wait for the next, so every
// sample is visited once per epoch (less the batch remainders, as without shuffling). The last
// `quiet_steps` steps of an epoch exchange nothing, so the loader can build the next epoch's
// first batches before the epoch ends. Owned set sizes never change: nothing is lost or
// duplicated, at any step.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <istream>
#include <map>
#include <memory>
#include <mutex>
#include <ostream>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "partners/schedule.hpp"
#include "shuffle/loader.hpp"
#include "shuffle/source.hpp"

namespace gg::shuffle {

enum class ShuffleMode { Off, Ids, Bytes };
// The names users write (data.shuffle's choices), one table.
inline constexpr std::pair<ShuffleMode, std::string_view> kShuffleModeNames[] = {
    {ShuffleMode::Off, "off"}, {ShuffleMode::Ids, "ids"}, {ShuffleMode::Bytes, "bytes"}};
constexpr std::span<const std::pair<ShuffleMode, std::string_view>> enum_names(ShuffleMode) {
  return kShuffleModeNames;
}

// A name of the table; anything else throws std::invalid_argument listing them.
ShuffleMode parse_shuffle_mode(const std::string& name);
const char* shuffle_mode_name(ShuffleMode mode);

// What the shuffle needs from the network. start() must not block on the partner; finish()
// returns the payload from `from`. Steps are started and finished in order, one at a time.
class ShuffleChannel {
 public:
  virtual ~ShuffleChannel() = default;
  virtual void start(int64_t step, int to, int from, std::vector<uint8_t> payload) = 0;
  virtual std::vector<uint8_t> finish(int64_t step) = 0;
};

struct ShuffleOptions {
  ShuffleMode mode = ShuffleMode::Ids;
  int64_t per_step = 8;     // samples given away (and received) per step, <= batch
  int64_t batch = 32;       // per-rank batch
  int64_t quiet_steps = 0;  // last steps of each epoch without exchange, < steps per epoch
  int rank = 0, ranks = 1;
  partners::Schedule schedule;  // who sends to whom (schedule.p must equal ranks)
  uint64_t seed = 1;
};

// Which samples one rank owns and how that changes. Thread-safe: the loader asks for epoch orders
// while the trainer commits steps.
class ShuffleLedger {
 public:
  // Initial ownership of ids [0, n): mode bytes, contiguous slices (a rank then reads only its own
  // part of the storage, e.g. its shards); otherwise slices of a seeded permutation. Slice sizes
  // differ by at most one. Throws std::invalid_argument for inconsistent options or when a rank
  // would own less than one batch.
  ShuffleLedger(int64_t n, const ShuffleOptions& o);

  int64_t size() const { return n_; }
  int64_t steps_per_epoch() const { return steps_per_epoch_; }
  // Whether step t exchanges samples (not in an epoch's quiet tail, more than one rank).
  bool exchanges(int64_t step) const;
  partners::Partners partners_at(int64_t step) const;

  // The order of epoch e; blocks until every step that changes it has been committed.
  // Throws std::runtime_error after cancel().
  std::vector<int64_t> order(int64_t epoch);
  void cancel();

  // The ids given away at step t: the first per_step of `used` (empty when no exchange).
  std::vector<int64_t> give(int64_t step, const std::vector<int64_t>& used) const;
  // Steps are committed in order. Throws std::logic_error if `given` holds an id not owned or
  // `received` one already owned (what a lost or duplicated sample would look like).
  void commit(int64_t step, const std::vector<int64_t>& given,
              const std::vector<int64_t>& received);
  int64_t committed_steps() const;
  std::vector<int64_t> owned() const;  // sorted
  bool initially_local(int64_t id) const { return local_[static_cast<size_t>(id)] != 0; }

  // The state as bytes (for a checkpoint) and back; restore() checks that the options match.
  void save(std::ostream& out) const;
  void restore(std::istream& in);
  // A fresh ledger (nothing committed) that starts training at `step` instead of 0, with its
  // initial ownership as the owned set of that step's epoch: a run resumed at another rank
  // count, whose samples are reassigned. Throws std::logic_error once a step was committed.
  void start_at(int64_t step);

 private:
  void snapshot_if_due();  // holds mu_

  const ShuffleOptions o_;
  const int64_t n_;
  int64_t steps_per_epoch_ = 0;
  std::vector<uint8_t> local_;  // initial ownership (what bytes mode may read from storage)
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<uint8_t> owned_;  // bitmap over ids
  int64_t owned_count_ = 0;
  int64_t committed_ = 0;
  std::map<int64_t, std::vector<int64_t>> epoch_start_;  // owned set at each epoch's start
  bool cancelled_ = false;
};

// The shuffle of one rank: the ledger, the payloads and, in bytes mode, the received samples.
// It is the loader's EpochOrder and, through source(), its SampleSource.
class DistributedShuffle : public EpochOrder {
 public:
  // base and channel must outlive this object. base.size() is the global sample count.
  DistributedShuffle(const SampleSource& base, const ShuffleOptions& o, ShuffleChannel& channel);
  ~DistributedShuffle() override;

  const SampleSource& source() const;  // what the loader reads
  ShuffleLedger& ledger() { return ledger_; }

  int64_t batches_per_epoch() const override { return ledger_.steps_per_epoch(); }
  std::vector<int64_t> order(int64_t epoch) override { return ledger_.order(epoch); }
  void cancel() override { ledger_.cancel(); }

  // Step t, right after its batch was taken: `used` are the batch's ids. Then finish(t) once
  // forward/backward ran. Throws std::runtime_error for a malformed payload.
  void start(int64_t step, const std::vector<int64_t>& used);
  void finish(int64_t step);

  int64_t samples_sent() const { return samples_sent_; }
  int64_t bytes_sent() const { return bytes_sent_; }
  int64_t samples_held() const;  // bytes mode: received samples held in memory

  // Ledger plus held bytes (bytes mode).
  void save(std::ostream& out) const;
  void restore(std::istream& in);
  void start_at(int64_t step) { ledger_.start_at(step); }

 private:
  class Overlay;
  const SampleSource& base_;
  const ShuffleOptions o_;
  ShuffleChannel& channel_;
  ShuffleLedger ledger_;
  std::unique_ptr<Overlay> overlay_;
  std::vector<int64_t> given_;
  int64_t started_ = -1;
  int64_t samples_sent_ = 0, bytes_sent_ = 0;
};

}  // namespace gg::shuffle
