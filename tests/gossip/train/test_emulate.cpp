// Emulated compute (gossip/train/emulate.hpp): the waits, the moments buckets are handed over,
// the jitter distribution and the stragglers.
#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <thread>
#include <vector>

#include "gossip/config/config.hpp"
#include "gossip/train/emulate.hpp"

using gg::gossip::Config;
using gg::gossip::EmulatedCompute;
using gg::gossip::parse_train_args;
using gg::gossip::UsageError;
using Clock = std::chrono::steady_clock;

namespace {
Config emulated(std::vector<std::string> extra) {
  std::vector<std::string> args = {"--emulate.forward_ms", "20", "--emulate.backward_ms", "40"};
  args.insert(args.end(), extra.begin(), extra.end());
  return parse_train_args(args);
}
double quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1))];
}
}  // namespace

TEST_CASE("emulated backward hands buckets over at their share of the bytes") {
  const Config c =
      parse_train_args({"--emulate.forward_ms", "200", "--emulate.backward_ms", "400"});
  // 10, 30 and 60 elements: ready after 10%, 40% and 100% of backward.
  const std::vector<gg::kernels::Bucket> buckets = {{0, 10}, {10, 40}, {40, 100}};
  const EmulatedCompute e(c, 0, buckets);
  REQUIRE(e.ready_share() == std::vector<double>{0.1, 0.4, 1.0});
  std::vector<double> at;
  const auto t0 = Clock::now();
  e.backward(2.0, [&](int b) {
    REQUIRE(b == static_cast<int>(at.size()));  // in bucket order, each once
    at.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  });
  const double total = std::chrono::duration<double>(Clock::now() - t0).count();
  REQUIRE(at.size() == 3);
  // backward_ms 400 x factor 2 = 800 ms: buckets at 80, 320 and 800 ms, never early; late by a
  // loaded machine's scheduling delay at most (a wait of the whole backward per bucket, or of its
  // share from the previous bucket, would be hundreds of ms late).
  const double expect[] = {0.080, 0.320, 0.800};
  for (int b = 0; b < 3; ++b) {
    CHECK(at[b] >= expect[b]);
    CHECK(at[b] < expect[b] + 0.150);
  }
  CHECK(total >= 0.800);
  const auto f0 = Clock::now();
  e.forward(1.5);
  const double fwd = std::chrono::duration<double>(Clock::now() - f0).count();
  CHECK(fwd >= 0.300);
  CHECK(fwd < 0.450);
  // With a gate (gossip.pipeline_weights): the last bucket first, each before its share of
  // forward, whose wait starts when the gate returns (a gate that waits delays forward).
  std::vector<int> gated;
  const auto g0 = Clock::now();
  e.forward(1.0, [&](int b) {
    gated.push_back(b);
    if (b == 1) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  });
  const double with_gate = std::chrono::duration<double>(Clock::now() - g0).count();
  CHECK(gated == std::vector<int>{2, 1, 0});
  CHECK(with_gate >= 0.300);
}

TEST_CASE("emulated jitter is lognormal with median 1 and the given p99, per rank and step") {
  const Config c = emulated({"--emulate.jitter_p99", "3"});
  const std::vector<gg::kernels::Bucket> one = {{0, 8}};
  const EmulatedCompute r0(c, 0, one), r1(c, 1, one), again(c, 0, one);
  std::vector<double> f;
  int same_as_rank1 = 0;
  for (int64_t s = 0; s < 20000; ++s) {
    f.push_back(r0.factor(s));
    REQUIRE(again.factor(s) == f.back());  // a pure function of (seed, rank, step)
    same_as_rank1 += r1.factor(s) == f.back();
  }
  CHECK(same_as_rank1 == 0);
  CHECK(quantile(f, 0.5) == Approx(1.0).margin(0.03));
  CHECK(quantile(f, 0.99) == Approx(3.0).epsilon(0.08));
  CHECK(*std::min_element(f.begin(), f.end()) > 0);
  // Another seed draws other factors.
  const EmulatedCompute other(emulated({"--emulate.jitter_p99", "3", "--train.seed", "7"}), 0, one);
  CHECK(other.factor(5) != r0.factor(5));
}

TEST_CASE("emulated stragglers are slow on every step, the other ranks not at all") {
  const Config c = emulated({"--emulate.slow", "2:1.5,5:3"});
  const std::vector<gg::kernels::Bucket> one = {{0, 8}};
  for (int64_t s : {0, 1, 99}) {
    CHECK(EmulatedCompute(c, 0, one).factor(s) == 1.0);
    CHECK(EmulatedCompute(c, 2, one).factor(s) == 1.5);
    CHECK(EmulatedCompute(c, 5, one).factor(s) == 3.0);
  }
}

TEST_CASE("emulate options are checked in one line") {
  auto message = [](std::vector<std::string> args) {
    try {
      parse_train_args(args);
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  CHECK(message({"--emulate.slow", "3"}).find("emulate.slow = 3 must be RANK:FACTOR") == 0);
  CHECK(message({"--emulate.forward_ms", "1", "--emulate.slow", "1:0.5"})
            .find("emulate.slow = 1:0.5 must be") == 0);
  CHECK(message({"--emulate.forward_ms", "1", "--emulate.slow", "1:2,"})
            .find("emulate.slow = 1:2, must be") == 0);
  CHECK(message({"--emulate.jitter_p99", "0.5"}).find("emulate.jitter_p99 = 0.5 is out of range") ==
        0);
  CHECK(message({"--emulate.jitter_p99", "2"}).find("need emulate.forward_ms or backward_ms") !=
        std::string::npos);
  CHECK(message({"--emulate.backward_ms", "5", "--checkpoint.dir", "/tmp/x"}) ==
        "checkpoint.dir cannot be used with emulated compute (emulate.forward_ms or backward_ms > "
        "0): an emulated run trains no model");
  CHECK(message({"--emulate.backward_ms", "5", "--fault.inject", "1:3"})
            .find("fault.inject / fault.mtbf_steps cannot be used") == 0);
  CHECK(message({"--emulate.forward_ms", "5", "--emulate.slow", "0:1.5,3:2"}) == "accepted");
}
