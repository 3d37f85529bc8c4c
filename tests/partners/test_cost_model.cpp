#include <catch2/catch.hpp>

#include "partners/cost_model.hpp"

using namespace gg::partners;

namespace {

Network simple_net() {
  Network n;
  n.inter_latency_s = 1e-5;
  n.inter_bandwidth_Bps = 1e9;
  n.intra_latency_s = 1e-6;
  n.intra_bandwidth_Bps = 4e9;
  n.mix_bandwidth_Bps = 1e10;
  n.ranks_per_node = 1;
  return n;
}

Workload work(double fwd, double bwd, std::vector<int64_t> buckets) {
  Workload w;
  w.forward_s = fwd;
  w.backward_s = bwd;
  w.update_s = 0.001;
  w.bucket_bytes = std::move(buckets);
  w.batch_per_rank = 32;
  return w;
}

}  // namespace

TEST_CASE("ring and Rabenseifner allreduce follow the alpha-beta-gamma formulas") {
  const Network n = simple_net();
  const double a = n.inter_latency_s, b = n.inter_bandwidth_Bps, g = n.mix_bandwidth_Bps;
  const double bytes = 8e6;
  CHECK(allreduce_seconds(Method::RingAllreduce, 2, 8000000, n) ==
        Approx(2 * (a + bytes / 2 / b) + bytes / 2 / g));
  CHECK(allreduce_seconds(Method::RingAllreduce, 8, 8000000, n) ==
        Approx(14 * (a + bytes / 8 / b) + 7 * bytes / 8 / g));
  CHECK(allreduce_seconds(Method::RabenseifnerAllreduce, 4, 8000000, n) ==
        Approx(2 * (a + bytes / 2 / b) + bytes / 2 / g + 2 * (a + bytes / 4 / b) + bytes / 4 / g));
  CHECK(allreduce_seconds(Method::RingAllreduce, 1, 8000000, n) == 0);
  // Latency grows with p for the ring, logarithmically for Rabenseifner.
  CHECK(allreduce_seconds(Method::RingAllreduce, 4096, 4096, n) >
        100 * allreduce_seconds(Method::RabenseifnerAllreduce, 4096, 4096, n) / 12);
}

TEST_CASE("gossip costs one partner exchange per step whatever p") {
  const Network n = simple_net();
  const Workload w = work(0.0, 0.0, {4000000, 4000000});
  const Schedule s8{Kind::Dissemination, 8, true, 1}, s4096{Kind::Dissemination, 4096, true, 1};
  const StepPrediction a = predict_gossip(s8, {true, false}, n, w, 12);
  const StepPrediction b = predict_gossip(s4096, {true, false}, n, w, 12);
  const double per_bucket =
      n.inter_latency_s + 4e6 / n.inter_bandwidth_Bps + 4e6 / n.mix_bandwidth_Bps;
  // Nothing to hide behind: everything is exposed, two buckets back to back.
  CHECK(a.exposed_s == Approx(2 * per_bucket));
  CHECK(b.exposed_s == Approx(a.exposed_s));
  CHECK(a.comm_s == Approx(2 * per_bucket));
  CHECK(a.step_s == Approx(w.update_s + 2 * per_bucket));
}

TEST_CASE("only the last bucket's exchange sticks out past the end of backward") {
  const Network n = simple_net();
  // 8 MB per step at 1 GB/s is 8 ms; backward lasts 100 ms and the buckets come evenly, so
  // everything but the last bucket (it is ready when backward ends) hides behind compute.
  const Workload w = work(0.05, 0.1, std::vector<int64_t>(8, 1000000));
  const StepPrediction g =
      predict_gossip({Kind::Dissemination, 16, true, 3}, {true, true}, n, w, 8);
  const double bucket = n.inter_latency_s + 1e6 / n.inter_bandwidth_Bps + 1e6 / n.mix_bandwidth_Bps;
  CHECK(g.exposed_s == Approx(bucket));
  CHECK(g.comm_s == Approx(16 * bucket));  // weights and gradients
  CHECK(g.efficiency == Approx(g.compute_s / (g.compute_s + bucket)));
  CHECK(g.images_per_s == Approx(16 * 32 / g.step_s));
  const StepPrediction r = predict_allreduce(Method::RingAllreduce, 16, n, w);
  CHECK(r.exposed_s == Approx(allreduce_seconds(Method::RingAllreduce, 16, 1000000, n)));
  CHECK(r.efficiency < g.efficiency);
}

TEST_CASE("weights exchanged after the update are exposed; the momentum doubles them") {
  const Network n = simple_net();
  // 4 MB of weights at 1 GB/s: about 4 ms, well inside a 150 ms forward + backward.
  const Workload w = work(0.05, 0.1, std::vector<int64_t>(4, 1000000));
  const Schedule s{Kind::Dissemination, 16, true, 3};
  const double bucket = n.inter_latency_s + 1e6 / n.inter_bandwidth_Bps + 1e6 / n.mix_bandwidth_Bps;
  GossipMode model{false, true};
  const StepPrediction hidden = predict_gossip(s, model, n, w, 4);
  CHECK(hidden.exposed_s == 0);
  CHECK(hidden.comm_s == Approx(4 * bucket));
  model.overlap_model = false;
  const StepPrediction exposed = predict_gossip(s, model, n, w, 4);
  CHECK(exposed.exposed_s == Approx(4 * bucket));
  CHECK(exposed.step_s == Approx(w.forward_s + w.backward_s + w.update_s + 4 * bucket));
  model.momentum = true;  // gossipgrad: weights and momentum, back to back on the link
  CHECK(predict_gossip(s, model, n, w, 4).exposed_s == Approx(8 * bucket));
  const auto half_wire = [](int64_t b) { return b / 2; };
  model.model_wire = half_wire;  // a wire of half the bytes: 500,000 a bucket
  const double half = n.inter_latency_s + 5e5 / n.inter_bandwidth_Bps + 5e5 / n.mix_bandwidth_Bps;
  CHECK(predict_gossip(s, model, n, w, 4).exposed_s == Approx(8 * half));
  model.grad_wire = half_wire;  // a wire the mode does not send changes nothing
  CHECK(predict_gossip(s, model, n, w, 4).exposed_s == Approx(8 * half));
  // both, not overlapped: the gradients hide behind backward (all but the last bucket), the
  // weights follow the update.
  const StepPrediction both = predict_gossip(s, {true, true, false, false}, n, w, 4);
  CHECK(both.exposed_s == Approx(bucket + 4 * bucket));
}

TEST_CASE("a global average every H steps adds its allreduce over H steps") {
  const Network n = simple_net();
  const Workload w = work(0.05, 0.1, std::vector<int64_t>(4, 1000000));
  const Schedule s{Kind::Dissemination, 64, true, 3};
  GossipMode m{false, true};
  const StepPrediction none = predict_gossip(s, m, n, w, 8);
  m.global_every = 10;
  m.global_bytes = 8000000;
  const StepPrediction pga = predict_gossip(s, m, n, w, 8);
  const double avg = allreduce_seconds(Method::RabenseifnerAllreduce, 64, 8000000, n);
  CHECK(pga.exposed_s == Approx(none.exposed_s + avg / 10));
  CHECK(pga.comm_s == Approx(none.comm_s + avg / 10));
  m.global_every = -1;
  CHECK_THROWS_AS(predict_gossip(s, m, n, w, 8), std::invalid_argument);
}

TEST_CASE("ranks of one node that leave the node in the same step share its NIC") {
  Network n = simple_net();
  n.ranks_per_node = 2;
  const Workload w = work(0.0, 0.0, {1000000});
  // Hypercube at p = 4 without rotation: step 0 pairs 0-1 (same node), step 1 pairs 0-2 (both
  // ranks of each node cross it at once).
  const Schedule s{Kind::Hypercube, 4, false, 1};
  const StepPrediction on_node = predict_gossip(s, {true, false}, n, w, 1);
  CHECK(on_node.exposed_s ==
        Approx(n.intra_latency_s + 1e6 / n.intra_bandwidth_Bps + 1e6 / n.mix_bandwidth_Bps));
  const StepPrediction both = predict_gossip(s, {true, false}, n, w, 2);
  const double off_node =
      n.inter_latency_s + 1e6 / (n.inter_bandwidth_Bps / 2) + 1e6 / n.mix_bandwidth_Bps;
  CHECK(both.exposed_s == Approx((on_node.exposed_s + off_node) / 2));
}

TEST_CASE("the cost model rejects impossible inputs") {
  Network n = simple_net();
  const Workload w = work(0.1, 0.1, {1000});
  n.inter_bandwidth_Bps = 0;
  CHECK_THROWS_AS(predict_allreduce(Method::RingAllreduce, 4, n, w), std::invalid_argument);
  CHECK_THROWS_AS(predict_gossip({Kind::Dissemination, 4, true, 1}, {true, true}, simple_net(),
                                 work(0.1, 0.1, {}), 4),
                  std::invalid_argument);
}
