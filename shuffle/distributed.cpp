// The distributed shuffle: ownership ledger, payload format, received-bytes overlay.
#include "shuffle/distributed.hpp"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <stdexcept>

#include "shuffle/rng.hpp"

namespace gg::shuffle {

namespace {

constexpr uint64_t kOwnershipStream = 0x6f776e73;      // "owns"
constexpr uint64_t kOrderStream = 0x6f726472;          // "ordr"
constexpr uint64_t kStateMagic = 0x67677368756631ULL;  // "ggshuf1"

template <typename T>
void put(std::vector<uint8_t>& out, T v) {
  const size_t at = out.size();
  out.resize(at + sizeof v);
  std::memcpy(out.data() + at, &v, sizeof v);
}

// Reads payloads defensively: a short or inconsistent message is an error, never a crash.
struct Reader {
  const uint8_t* p;
  size_t left;
  template <typename T>
  T get() {
    T v;
    need(sizeof v);
    std::memcpy(&v, p, sizeof v);
    p += sizeof v;
    left -= sizeof v;
    return v;
  }
  void need(size_t n) const {
    if (n > left) throw std::runtime_error("shuffle: malformed payload (truncated)");
  }
};

template <typename T>
void write_raw(std::ostream& out, T v) {
  out.write(reinterpret_cast<const char*>(&v), sizeof v);
}
template <typename T>
T read_raw(std::istream& in) {
  T v{};
  if (!in.read(reinterpret_cast<char*>(&v), sizeof v))
    throw std::runtime_error("shuffle state: truncated");
  return v;
}
void write_ids(std::ostream& out, const std::vector<int64_t>& ids) {
  write_raw<uint64_t>(out, ids.size());
  out.write(reinterpret_cast<const char*>(ids.data()),
            static_cast<std::streamsize>(ids.size() * sizeof(int64_t)));
}
std::vector<int64_t> read_ids(std::istream& in, int64_t n) {
  const auto count = read_raw<uint64_t>(in);
  if (count > static_cast<uint64_t>(n)) throw std::runtime_error("shuffle state: corrupt id list");
  std::vector<int64_t> ids(count);
  if (!in.read(reinterpret_cast<char*>(ids.data()),
               static_cast<std::streamsize>(count * sizeof(int64_t))))
    throw std::runtime_error("shuffle state: truncated");
  for (int64_t id : ids)
    if (id < 0 || id >= n) throw std::runtime_error("shuffle state: id out of range");
  return ids;
}

}  // namespace

ShuffleMode parse_shuffle_mode(const std::string& name) {
  constexpr size_t n = std::size(kShuffleModeNames);
  std::string valid;
  for (size_t i = 0; i < n; ++i) {
    if (name == kShuffleModeNames[i].second) return kShuffleModeNames[i].first;
    valid.append(i == 0 ? "" : i + 1 == n ? " or " : ", ").append(kShuffleModeNames[i].second);
  }
  throw std::invalid_argument("shuffle mode '" + name + "' is unknown: use " + valid);
}

const char* shuffle_mode_name(ShuffleMode mode) {
  for (const auto& [m, n] : kShuffleModeNames)
    if (m == mode) return n.data();  // the table's literals end in a NUL
  return "?";
}

ShuffleLedger::ShuffleLedger(int64_t n, const ShuffleOptions& o) : o_(o), n_(n) {
  const auto bad = [](const std::string& why) { throw std::invalid_argument("shuffle: " + why); };
  if (o.ranks < 1 || o.rank < 0 || o.rank >= o.ranks) bad("rank outside [0, ranks)");
  if (o.schedule.p != o.ranks) bad("schedule.p must equal ranks");
  if (o.batch < 1) bad("batch must be >= 1");
  if (o.per_step < 0 || o.per_step > o.batch)
    bad("per_step = " + std::to_string(o.per_step) +
        " must be in [0, batch = " + std::to_string(o.batch) + "]");
  if (n < 0) bad("negative sample count");
  steps_per_epoch_ = n / o.ranks / o.batch;
  if (steps_per_epoch_ < 1)
    bad(std::to_string(n) + " samples over " + std::to_string(o.ranks) +
        " ranks give no full batch of " + std::to_string(o.batch));
  if (o.quiet_steps < 0 || o.quiet_steps >= steps_per_epoch_)
    bad("quiet_steps must be in [0, steps per epoch = " + std::to_string(steps_per_epoch_) + ")");
  partners::validate(o.schedule);

  std::vector<int64_t> ids(static_cast<size_t>(n));
  std::iota(ids.begin(), ids.end(), int64_t{0});
  if (o.mode != ShuffleMode::Bytes) {
    std::mt19937_64 rng(stream_seed({kOwnershipStream, o.seed}));
    for (int64_t i = n - 1; i > 0; --i)
      std::swap(ids[static_cast<size_t>(i)],
                ids[static_cast<size_t>(uniform_below(rng, static_cast<uint64_t>(i) + 1))]);
  }
  const int64_t begin = n * o.rank / o.ranks, end = n * (o.rank + 1) / o.ranks;
  local_.assign(static_cast<size_t>(n), 0);
  owned_.assign(static_cast<size_t>(n), 0);
  std::vector<int64_t> mine(ids.begin() + begin, ids.begin() + end);
  std::sort(mine.begin(), mine.end());
  for (int64_t id : mine) local_[static_cast<size_t>(id)] = owned_[static_cast<size_t>(id)] = 1;
  owned_count_ = end - begin;
  epoch_start_[0] = std::move(mine);
}

bool ShuffleLedger::exchanges(int64_t step) const {
  return o_.mode != ShuffleMode::Off && o_.ranks > 1 && o_.per_step > 0 &&
         step % steps_per_epoch_ < steps_per_epoch_ - o_.quiet_steps;
}

partners::Partners ShuffleLedger::partners_at(int64_t step) const {
  return partners::partners(o_.schedule, o_.rank, step);
}

std::vector<int64_t> ShuffleLedger::order(int64_t epoch) {
  std::vector<int64_t> out;
  {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return cancelled_ || epoch_start_.count(epoch) > 0; });
    if (cancelled_) throw std::runtime_error("shuffle: cancelled");
    out = epoch_start_[epoch];
  }
  std::mt19937_64 rng(stream_seed(
      {kOrderStream, o_.seed, static_cast<uint64_t>(o_.rank), static_cast<uint64_t>(epoch)}));
  for (size_t i = out.size(); i > 1; --i) std::swap(out[i - 1], out[uniform_below(rng, i)]);
  return out;
}

void ShuffleLedger::cancel() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    cancelled_ = true;
  }
  cv_.notify_all();
}

std::vector<int64_t> ShuffleLedger::give(int64_t step, const std::vector<int64_t>& used) const {
  std::vector<int64_t> out;
  if (!exchanges(step)) return out;
  for (int64_t id : used) {
    if (static_cast<int64_t>(out.size()) == o_.per_step) break;
    if (id >= 0) out.push_back(id);
  }
  return out;
}

void ShuffleLedger::commit(int64_t step, const std::vector<int64_t>& given,
                           const std::vector<int64_t>& received) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (step != committed_)
      throw std::logic_error("shuffle: step " + std::to_string(step) + " committed, expected " +
                             std::to_string(committed_));
    for (int64_t id : given) {
      if (id < 0 || id >= n_ || !owned_[static_cast<size_t>(id)])
        throw std::logic_error("shuffle: step " + std::to_string(step) + " gives sample " +
                               std::to_string(id) + " that rank " + std::to_string(o_.rank) +
                               " does not own");
      owned_[static_cast<size_t>(id)] = 0;
    }
    for (int64_t id : received) {
      if (id < 0 || id >= n_ || owned_[static_cast<size_t>(id)])
        throw std::logic_error("shuffle: step " + std::to_string(step) + " receives sample " +
                               std::to_string(id) + " that rank " + std::to_string(o_.rank) +
                               " already owns (or out of range)");
      owned_[static_cast<size_t>(id)] = 1;
    }
    owned_count_ += static_cast<int64_t>(received.size()) - static_cast<int64_t>(given.size());
    ++committed_;
    snapshot_if_due();
  }
  cv_.notify_all();
}

void ShuffleLedger::snapshot_if_due() {
  // Epoch e starts from the owned set once the steps before its predecessor's quiet tail are in.
  const int64_t next = epoch_start_.rbegin()->first + 1;
  if (committed_ < next * steps_per_epoch_ - o_.quiet_steps) return;
  std::vector<int64_t> ids;
  ids.reserve(static_cast<size_t>(owned_count_));
  for (int64_t i = 0; i < n_; ++i)
    if (owned_[static_cast<size_t>(i)]) ids.push_back(i);
  epoch_start_[next] = std::move(ids);
  while (epoch_start_.size() > 3) epoch_start_.erase(epoch_start_.begin());
}

int64_t ShuffleLedger::committed_steps() const {
  std::lock_guard<std::mutex> lk(mu_);
  return committed_;
}

std::vector<int64_t> ShuffleLedger::owned() const {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < n_; ++i)
    if (owned_[static_cast<size_t>(i)]) ids.push_back(i);
  return ids;
}

void ShuffleLedger::save(std::ostream& out) const {
  std::lock_guard<std::mutex> lk(mu_);
  write_raw(out, kStateMagic);
  for (int64_t v : {n_, static_cast<int64_t>(o_.rank), static_cast<int64_t>(o_.ranks), o_.batch,
                    o_.per_step, o_.quiet_steps, static_cast<int64_t>(o_.mode)})
    write_raw(out, v);
  write_raw(out, o_.seed);
  write_raw(out, committed_);
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < n_; ++i)
    if (owned_[static_cast<size_t>(i)]) ids.push_back(i);
  write_ids(out, ids);
  write_raw<uint64_t>(out, epoch_start_.size());
  for (const auto& [epoch, start] : epoch_start_) {
    write_raw(out, epoch);
    write_ids(out, start);
  }
}

void ShuffleLedger::restore(std::istream& in) {
  if (read_raw<uint64_t>(in) != kStateMagic)
    throw std::runtime_error("shuffle state: not a gossipgrad shuffle state");
  const char* names[] = {"sample count", "rank",        "ranks", "batch",
                         "per_step",     "quiet_steps", "mode"};
  const int64_t want[] = {n_,
                          static_cast<int64_t>(o_.rank),
                          static_cast<int64_t>(o_.ranks),
                          o_.batch,
                          o_.per_step,
                          o_.quiet_steps,
                          static_cast<int64_t>(o_.mode)};
  for (int i = 0; i < 7; ++i) {
    const auto v = read_raw<int64_t>(in);
    if (v != want[i])
      throw std::runtime_error("shuffle state: saved with " + std::string(names[i]) + " = " +
                               std::to_string(v) + ", this run has " + std::to_string(want[i]));
  }
  if (read_raw<uint64_t>(in) != o_.seed) throw std::runtime_error("shuffle state: seed differs");
  const auto committed = read_raw<int64_t>(in);
  const std::vector<int64_t> ids = read_ids(in, n_);
  std::map<int64_t, std::vector<int64_t>> starts;
  const auto count = read_raw<uint64_t>(in);
  if (count < 1 || count > 3) throw std::runtime_error("shuffle state: corrupt epoch list");
  for (uint64_t i = 0; i < count; ++i) {
    const auto epoch = read_raw<int64_t>(in);
    starts[epoch] = read_ids(in, n_);
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    std::fill(owned_.begin(), owned_.end(), 0);
    for (int64_t id : ids) owned_[static_cast<size_t>(id)] = 1;
    owned_count_ = static_cast<int64_t>(ids.size());
    committed_ = committed;
    epoch_start_ = std::move(starts);
  }
  cv_.notify_all();
}

void ShuffleLedger::start_at(int64_t step) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (committed_ != 0 || epoch_start_.size() != 1)
      throw std::logic_error("shuffle: start_at() after steps were committed");
    if (step < 0) throw std::invalid_argument("shuffle: start_at() a negative step");
    std::vector<int64_t> mine = std::move(epoch_start_.begin()->second);
    epoch_start_.clear();
    epoch_start_[step / steps_per_epoch_] = std::move(mine);
    committed_ = step;
    snapshot_if_due();
  }
  cv_.notify_all();
}

// Bytes mode: samples received from other ranks, held in memory, in front of the storage.
class DistributedShuffle::Overlay : public SampleSource {
 public:
  Overlay(const SampleSource& base, const ShuffleLedger& ledger, bool bytes)
      : base_(base), ledger_(ledger), bytes_(bytes) {}
  int64_t size() const override { return base_.size(); }
  int classes() const override { return base_.classes(); }
  int32_t label(int64_t id) const override {
    if (bytes_) {
      std::lock_guard<std::mutex> lk(mu_);
      if (const auto it = held_.find(id); it != held_.end()) return it->second.label;
    }
    return base_.label(id);
  }
  Encoding encoding() const override { return base_.encoding(); }
  std::array<int, 3> shape() const override { return base_.shape(); }
  void read(int64_t id, std::vector<uint8_t>& out) const override {
    if (bytes_) {
      std::lock_guard<std::mutex> lk(mu_);
      if (const auto it = held_.find(id); it != held_.end()) {
        out = it->second.bytes;
        return;
      }
      // Node-local storage holds only what this rank owned at the start.
      if (!ledger_.initially_local(id))
        throw std::logic_error("shuffle bytes: sample " + std::to_string(id) +
                               " is neither on local storage nor received");
    }
    base_.read(id, out);
  }
  const uint8_t* pixels(int64_t id) const override { return bytes_ ? nullptr : base_.pixels(id); }
  std::string name(int64_t id) const override { return base_.name(id); }
  std::string describe() const override { return base_.describe(); }

  struct Held {
    int32_t label;
    std::vector<uint8_t> bytes;
  };
  mutable std::mutex mu_;
  std::map<int64_t, Held> held_;

 private:
  const SampleSource& base_;
  const ShuffleLedger& ledger_;
  const bool bytes_;
};

DistributedShuffle::DistributedShuffle(const SampleSource& base, const ShuffleOptions& o,
                                       ShuffleChannel& channel)
    : base_(base),
      o_(o),
      channel_(channel),
      ledger_(base.size(), o),
      overlay_(std::make_unique<Overlay>(base, ledger_, o.mode == ShuffleMode::Bytes)) {}

DistributedShuffle::~DistributedShuffle() = default;

const SampleSource& DistributedShuffle::source() const { return *overlay_; }

void DistributedShuffle::start(int64_t step, const std::vector<int64_t>& used) {
  if (started_ >= 0) throw std::logic_error("shuffle: start() twice without finish()");
  started_ = step;
  given_ = ledger_.give(step, used);
  if (!ledger_.exchanges(step)) return;
  std::vector<uint8_t> payload;
  put<uint64_t>(payload, given_.size());
  std::vector<uint8_t> bytes;
  for (int64_t id : given_) {
    put<int64_t>(payload, id);
    if (o_.mode == ShuffleMode::Bytes) {
      try {
        overlay_->read(id, bytes);
      } catch (const UnusableSample&) {
        bytes.clear();  // the receiver's loader skips and counts it, as this rank's did
      }
      put<int32_t>(payload, overlay_->label(id));
      put<uint64_t>(payload, bytes.size());
      payload.insert(payload.end(), bytes.begin(), bytes.end());
    }
  }
  samples_sent_ += static_cast<int64_t>(given_.size());
  bytes_sent_ += static_cast<int64_t>(payload.size());
  const partners::Partners who = ledger_.partners_at(step);
  channel_.start(step, who.send_to, who.recv_from, std::move(payload));
}

void DistributedShuffle::finish(int64_t step) {
  if (started_ != step) throw std::logic_error("shuffle: finish() without start() of this step");
  started_ = -1;
  std::vector<int64_t> received;
  if (ledger_.exchanges(step)) {
    const std::vector<uint8_t> payload = channel_.finish(step);
    Reader r{payload.data(), payload.size()};
    const auto count = r.get<uint64_t>();
    if (count > static_cast<uint64_t>(o_.batch))
      throw std::runtime_error("shuffle: malformed payload (" + std::to_string(count) +
                               " samples)");
    std::map<int64_t, Overlay::Held> arrived;
    for (uint64_t i = 0; i < count; ++i) {
      const auto id = r.get<int64_t>();
      if (id < 0 || id >= base_.size())
        throw std::runtime_error("shuffle: malformed payload (sample id " + std::to_string(id) +
                                 ")");
      received.push_back(id);
      if (o_.mode == ShuffleMode::Bytes) {
        Overlay::Held h;
        h.label = r.get<int32_t>();
        const auto size = r.get<uint64_t>();
        r.need(size);
        h.bytes.assign(r.p, r.p + size);
        r.p += size;
        r.left -= size;
        arrived[id] = std::move(h);
      }
    }
    if (r.left != 0) throw std::runtime_error("shuffle: malformed payload (trailing bytes)");
    if (o_.mode == ShuffleMode::Bytes) {
      std::lock_guard<std::mutex> lk(overlay_->mu_);
      for (int64_t id : given_) overlay_->held_.erase(id);
      for (auto& [id, h] : arrived) overlay_->held_[id] = std::move(h);
    }
  }
  ledger_.commit(step, given_, received);
  given_.clear();
}

int64_t DistributedShuffle::samples_held() const {
  std::lock_guard<std::mutex> lk(overlay_->mu_);
  return static_cast<int64_t>(overlay_->held_.size());
}

void DistributedShuffle::save(std::ostream& out) const {
  ledger_.save(out);
  std::lock_guard<std::mutex> lk(overlay_->mu_);
  write_raw<uint64_t>(out, overlay_->held_.size());
  for (const auto& [id, h] : overlay_->held_) {
    write_raw(out, id);
    write_raw(out, h.label);
    write_raw<uint64_t>(out, h.bytes.size());
    out.write(reinterpret_cast<const char*>(h.bytes.data()),
              static_cast<std::streamsize>(h.bytes.size()));
  }
}

void DistributedShuffle::restore(std::istream& in) {
  ledger_.restore(in);
  const auto count = read_raw<uint64_t>(in);
  std::map<int64_t, Overlay::Held> held;
  for (uint64_t i = 0; i < count; ++i) {
    const auto id = read_raw<int64_t>(in);
    Overlay::Held h;
    h.label = read_raw<int32_t>(in);
    const auto size = read_raw<uint64_t>(in);
    if (size > (uint64_t{1} << 32)) throw std::runtime_error("shuffle state: corrupt sample size");
    h.bytes.resize(size);
    if (!in.read(reinterpret_cast<char*>(h.bytes.data()), static_cast<std::streamsize>(size)))
      throw std::runtime_error("shuffle state: truncated");
    held[id] = std::move(h);
  }
  std::lock_guard<std::mutex> lk(overlay_->mu_);
  overlay_->held_ = std::move(held);
}

}  // namespace gg::shuffle
