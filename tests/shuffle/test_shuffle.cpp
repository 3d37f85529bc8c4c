// Unit tests of the distributed shuffle policy: all ranks simulated in one process over an
// in-memory channel (the mpirun test runs the same code over MPI).
#include <catch2/catch.hpp>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <vector>

#include "shuffle/distributed.hpp"
#include "shuffle/source.hpp"

using Catch::Matchers::Contains;
using namespace gg::shuffle;

namespace {

// Payloads in flight, by (step, receiving rank).
struct Hub {
  std::map<std::pair<int64_t, int>, std::vector<uint8_t>> box;
};

class LocalChannel : public ShuffleChannel {
 public:
  LocalChannel(Hub& hub, int rank) : hub_(hub), rank_(rank) {}
  void start(int64_t step, int to, int /*from*/, std::vector<uint8_t> payload) override {
    hub_.box[{step, to}] = std::move(payload);
  }
  std::vector<uint8_t> finish(int64_t step) override {
    auto it = hub_.box.find({step, rank_});
    REQUIRE(it != hub_.box.end());
    std::vector<uint8_t> p = std::move(it->second);
    hub_.box.erase(it);
    return p;
  }

 private:
  Hub& hub_;
  int rank_;
};

ShuffleOptions options(ShuffleMode mode, int rank, int ranks, int64_t quiet, uint64_t seed = 9) {
  ShuffleOptions o;
  o.mode = mode;
  o.per_step = 3;
  o.batch = 4;
  o.quiet_steps = quiet;
  o.rank = rank;
  o.ranks = ranks;
  o.seed = seed;
  o.schedule = {gg::partners::Kind::Dissemination, ranks, true, seed};
  return o;
}

// p ranks in one process, stepping in lockstep.
struct World {
  Hub hub;
  std::vector<std::unique_ptr<LocalChannel>> channels;
  std::vector<std::unique_ptr<DistributedShuffle>> ranks;
  World(const SampleSource& src, ShuffleMode mode, int p, int64_t quiet, uint64_t seed = 9) {
    for (int r = 0; r < p; ++r) {
      channels.push_back(std::make_unique<LocalChannel>(hub, r));
      ranks.push_back(std::make_unique<DistributedShuffle>(src, options(mode, r, p, quiet, seed),
                                                           *channels.back()));
    }
  }
  // One step on every rank; returns each rank's batch.
  std::vector<std::vector<int64_t>> step(int64_t t) {
    std::vector<std::vector<int64_t>> used;
    for (auto& s : ranks) {
      const int64_t per = s->batches_per_epoch();
      const std::vector<int64_t> order = s->order(t / per);
      const int64_t i = t % per;
      used.emplace_back(order.begin() + i * 4, order.begin() + (i + 1) * 4);
      s->start(t, used.back());
    }
    for (auto& s : ranks) s->finish(t);
    return used;
  }
};

}  // namespace

TEST_CASE("the shuffle conserves every sample at every step and visits each once per epoch",
          "[shuffle][distributed]") {
  for (const ShuffleMode mode : {ShuffleMode::Ids, ShuffleMode::Bytes}) {
    for (const int p : {2, 3, 5}) {
      for (const int64_t quiet : {0, 2}) {
        INFO("mode " << shuffle_mode_name(mode) << ", p = " << p << ", quiet " << quiet);
        const int64_t steps_per_epoch = 5, n = p * 4 * steps_per_epoch;
        SyntheticSource src(parse_synthetic("1x2x2:3:" + std::to_string(n)));
        World w(src, mode, p, quiet);
        REQUIRE(w.ranks[0]->batches_per_epoch() == steps_per_epoch);
        std::vector<int> visits(static_cast<size_t>(n), 0);
        std::set<std::pair<int64_t, int>> placements;  // (sample, rank) ever seen
        for (int64_t t = 0; t < 200; ++t) {
          const auto used = w.step(t);
          for (int r = 0; r < p; ++r)
            for (int64_t id : used[static_cast<size_t>(r)]) {
              ++visits[static_cast<size_t>(id)];
              placements.insert({id, r});
            }
          std::vector<int> owners(static_cast<size_t>(n), 0);
          for (auto& s : w.ranks)
            for (int64_t id : s->ledger().owned()) ++owners[static_cast<size_t>(id)];
          for (int64_t id = 0; id < n; ++id) REQUIRE(owners[static_cast<size_t>(id)] == 1);
          if ((t + 1) % steps_per_epoch == 0) {
            for (int64_t id = 0; id < n; ++id) REQUIRE(visits[static_cast<size_t>(id)] == 1);
            std::fill(visits.begin(), visits.end(), 0);
          }
        }
        // Samples travel: on average each one was trained on by several ranks.
        CHECK(static_cast<double>(placements.size()) / n > 1.5);
        CHECK(w.ranks[0]->samples_sent() > 0);
        if (mode == ShuffleMode::Bytes) CHECK(w.ranks[0]->samples_held() > 0);
      }
    }
  }
}

TEST_CASE("bytes mode serves received samples from memory with the bytes the owner stored",
          "[shuffle][distributed]") {
  const int p = 3;
  SyntheticSource src(parse_synthetic("3x4x4:5:120"));
  World w(src, ShuffleMode::Bytes, p, 1);
  for (int64_t t = 0; t < 40; ++t) w.step(t);
  std::vector<uint8_t> a, b;
  int64_t foreign = 0;
  for (auto& s : w.ranks)
    for (int64_t id : s->ledger().owned()) {
      s->source().read(id, a);
      src.read(id, b);
      CHECK(a == b);
      CHECK(s->source().label(id) == src.label(id));
      foreign += !s->ledger().initially_local(id);
    }
  CHECK(foreign > 0);
  // A sample neither local nor received cannot be read: node-local storage does not have it.
  auto& s0 = *w.ranks[0];
  for (int64_t id = 0; id < 120; ++id) {
    const std::vector<int64_t> own = s0.ledger().owned();
    if (!s0.ledger().initially_local(id) && !std::binary_search(own.begin(), own.end(), id)) {
      CHECK_THROWS_WITH(s0.source().read(id, a), Contains("neither on local storage"));
      break;
    }
  }
}

TEST_CASE("the same seed gives the same sample order and another seed another",
          "[shuffle][distributed]") {
  SyntheticSource src(parse_synthetic("1x2x2:3:96"));
  const auto run = [&](uint64_t seed) {
    World w(src, ShuffleMode::Ids, 4, 1, seed);
    std::vector<std::vector<int64_t>> all;
    for (int64_t t = 0; t < 60; ++t)
      for (auto& u : w.step(t)) all.push_back(u);
    return all;
  };
  CHECK(run(3) == run(3));
  CHECK(run(3) != run(4));
}

TEST_CASE("shuffle state saved mid-epoch restores into a run that continues identically",
          "[shuffle][distributed]") {
  const int p = 3;
  SyntheticSource src(parse_synthetic("1x2x2:3:72"));
  for (const ShuffleMode mode : {ShuffleMode::Ids, ShuffleMode::Bytes}) {
    World a(src, mode, p, 1);
    for (int64_t t = 0; t < 23; ++t) a.step(t);
    World b(src, mode, p, 1);
    for (int r = 0; r < p; ++r) {
      std::stringstream state;
      a.ranks[static_cast<size_t>(r)]->save(state);
      b.ranks[static_cast<size_t>(r)]->restore(state);
    }
    for (int64_t t = 23; t < 50; ++t) CHECK(a.step(t) == b.step(t));
    // A state from another configuration is refused with the reason.
    World c(src, mode, 2, 1);
    std::stringstream state;
    a.ranks[0]->save(state);
    CHECK_THROWS_WITH(c.ranks[0]->restore(state), Contains("ranks"));
  }
}

TEST_CASE("the ledger refuses to lose or duplicate a sample, and checks its options",
          "[shuffle][distributed]") {
  ShuffleLedger l(40, options(ShuffleMode::Ids, 0, 2, 0));
  const std::vector<int64_t> own = l.owned();
  REQUIRE(own.size() == 20u);
  std::vector<int64_t> other;
  for (int64_t i = 0; i < 40; ++i)
    if (!std::binary_search(own.begin(), own.end(), i)) other.push_back(i);
  CHECK_THROWS_WITH(l.commit(0, {other[0]}, {}), Contains("does not own"));
  CHECK_THROWS_WITH(l.commit(0, {}, {own[0]}), Contains("already owns"));
  CHECK_THROWS_AS(ShuffleLedger(7, options(ShuffleMode::Ids, 0, 2, 0)), std::invalid_argument);
  ShuffleOptions bad = options(ShuffleMode::Ids, 0, 2, 0);
  bad.per_step = 5;
  CHECK_THROWS_WITH(ShuffleLedger(40, bad), Contains("per_step"));
  bad = options(ShuffleMode::Ids, 0, 2, 5);
  CHECK_THROWS_WITH(ShuffleLedger(40, bad), Contains("quiet_steps"));
  CHECK_THROWS_AS(parse_shuffle_mode("all"), std::invalid_argument);
  // Bytes mode starts from contiguous slices (each rank's own part of node-local storage).
  ShuffleLedger b(40, options(ShuffleMode::Bytes, 1, 2, 0));
  CHECK(b.owned().front() == 20);
  CHECK(b.owned().back() == 39);
}

namespace {

// Synthetic samples, every seventh one unusable (as a file larger than any image).
class SometimesUnusable : public SyntheticSource {
 public:
  using SyntheticSource::SyntheticSource;
  void read(int64_t id, std::vector<uint8_t>& out) const override {
    if (id % 7 == 0) throw UnusableSample("sample " + std::to_string(id) + " is unusable");
    SyntheticSource::read(id, out);
  }
};

}  // namespace

TEST_CASE("bytes mode passes an unusable sample on empty, for the receiver to skip",
          "[shuffle][distributed]") {
  SometimesUnusable src(parse_synthetic("1x2x2:3:60"));
  World w(src, ShuffleMode::Bytes, 3, 0);
  for (int64_t t = 0; t < 30; ++t) w.step(t);  // threw UnusableSample out of start() before
  std::vector<uint8_t> bytes;
  int64_t empty = 0;
  for (auto& s : w.ranks)
    for (int64_t id : s->ledger().owned()) {
      if (s->ledger().initially_local(id)) continue;
      s->source().read(id, bytes);
      if (id % 7 == 0) {
        CHECK(bytes.empty());
        ++empty;
      } else {
        CHECK(bytes.size() == 4u);
      }
    }
  CHECK(empty > 0);
}
