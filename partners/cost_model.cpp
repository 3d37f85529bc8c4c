#include "partners/cost_model.hpp"

#include <algorithm>
#include <numeric>
#include <stdexcept>

namespace gg::partners {
namespace {

int node_of(int rank, const Network& net) { return rank / std::max(1, net.ranks_per_node); }

void check(const Network& net, const Workload& w) {
  if (net.inter_bandwidth_Bps <= 0 || net.intra_bandwidth_Bps <= 0 || net.mix_bandwidth_Bps <= 0)
    throw std::invalid_argument("network bandwidths must be positive");
  if (net.inter_latency_s < 0 || net.intra_latency_s < 0)
    throw std::invalid_argument("network latencies must not be negative");
  if (net.ranks_per_node < 1) throw std::invalid_argument("ranks_per_node must be >= 1");
  if (w.forward_s < 0 || w.backward_s < 0 || w.update_s < 0)
    throw std::invalid_argument("compute times must not be negative");
  if (w.bucket_bytes.empty()) throw std::invalid_argument("the workload has no buckets");
}

// When each bucket is ready, from the start of the step.
std::vector<double> ready_times(const Workload& w) {
  const double total = static_cast<double>(w.total_bytes());
  std::vector<double> r;
  double done = 0;
  for (int64_t b : w.bucket_bytes) {
    done += static_cast<double>(b);
    r.push_back(w.forward_s + w.backward_s * (total > 0 ? done / total : 1.0));
  }
  return r;
}

// Buckets served in order by one link that is free from `link_free` on; returns when the last
// one is done. cost(i) is bucket i's time on the link.
template <typename Cost>
double pipeline(const std::vector<double>& ready, double link_free, Cost cost) {
  double f = link_free;
  for (size_t i = 0; i < ready.size(); ++i) f = std::max(ready[i], f) + cost(i);
  return f;
}

// The bytes of an fp32 bucket on a wire (none given: fp32).
int64_t on_wire(int64_t fp32_bytes, const std::function<int64_t(int64_t)>& wire) {
  return wire ? wire(fp32_bytes) : fp32_bytes;
}

StepPrediction finish(const Workload& w, int p, double comm_s, double exposed_s) {
  StepPrediction s;
  s.compute_s = w.forward_s + w.backward_s + w.update_s;
  s.comm_s = comm_s;
  s.exposed_s = std::max(0.0, exposed_s);
  s.step_s = s.compute_s + s.exposed_s;
  s.efficiency = s.step_s > 0 ? s.compute_s / s.step_s : 1.0;
  s.images_per_s = s.step_s > 0 ? static_cast<double>(w.batch_per_rank) * p / s.step_s : 0.0;
  return s;
}

}  // namespace

int64_t Workload::total_bytes() const {
  return std::accumulate(bucket_bytes.begin(), bucket_bytes.end(), int64_t{0});
}

const char* method_name(Method m) {
  switch (m) {
    case Method::Gossip:
      return "gossip";
    case Method::RingAllreduce:
      return "ring-allreduce";
    case Method::RabenseifnerAllreduce:
      return "rabenseifner-allreduce";
  }
  return "?";
}

StepPrediction predict_gossip(const Schedule& schedule, GossipMode mode, const Network& net,
                              const Workload& w, int steps) {
  check(net, w);
  validate(schedule);
  if (steps < 1) throw std::invalid_argument("steps must be >= 1");
  if (mode.global_every < 0 || mode.global_bytes < 0)
    throw std::invalid_argument("global_every and global_bytes must not be negative");
  const int p = schedule.p;
  const std::vector<double> ready = ready_times(w);
  const double backward_end = w.forward_s + w.backward_s;
  const int nodes = (p + net.ranks_per_node - 1) / net.ranks_per_node;
  double sum_step = 0, sum_comm = 0, sum_exposed = 0;
  std::vector<int> off_out(nodes), off_in(nodes);
  for (int t = 0; t < steps; ++t) {
    const std::vector<Partners> peers = step_partners(schedule, t);
    std::fill(off_out.begin(), off_out.end(), 0);
    std::fill(off_in.begin(), off_in.end(), 0);
    for (int v = 0; v < p; ++v)
      for (int i = 0; i < peers[v].links(); ++i) {
        off_out[node_of(v, net)] += node_of(peers[v].link(i).send_to, net) != node_of(v, net);
        off_in[node_of(v, net)] += node_of(peers[v].link(i).recv_from, net) != node_of(v, net);
      }
    double worst_exposed = 0, worst_comm = 0;
    for (int v = 0; v < p; ++v) {
      const int n = node_of(v, net);
      // With k links a rank sends and receives each bucket k times, off the node if any is.
      const int k = peers[v].links();
      bool remote = false;
      for (int i = 0; i < k; ++i)
        remote = remote || node_of(peers[v].link(i).send_to, net) != n ||
                 node_of(peers[v].link(i).recv_from, net) != n;
      const double alpha = remote ? net.inter_latency_s : net.intra_latency_s;
      const double bw = remote ? net.inter_bandwidth_Bps / std::max({1, off_out[n], off_in[n]})
                               : net.intra_bandwidth_Bps;
      auto cost = [&](int64_t bytes) {
        return alpha + static_cast<double>(k * bytes) / bw +
               static_cast<double>(k * bytes) / net.mix_bandwidth_Bps;
      };
      double comm = 0, weights = 0, exposed = 0;
      if (mode.model)  // the weights (and the momentum) bucket by bucket
        for (int64_t b : w.bucket_bytes)
          weights += cost(on_wire(b, mode.model_wire)) * (mode.momentum ? 2 : 1);
      comm += weights;
      // Overlapped, the previous step's weights hold the link from the start of this step's
      // forward; otherwise they travel after the update, with nothing to hide behind.
      const double link_free = mode.overlap_model ? weights : 0.0;
      if (mode.grad) {
        auto grads = [&](int64_t b) { return cost(on_wire(b, mode.grad_wire)); };
        const double f =
            pipeline(ready, link_free, [&](size_t i) { return grads(w.bucket_bytes[i]); });
        for (int64_t b : w.bucket_bytes) comm += grads(b);
        exposed = f - backward_end;
      } else {
        exposed = link_free - backward_end;
      }
      if (!mode.overlap_model) exposed = std::max(0.0, exposed) + weights;
      worst_exposed = std::max(worst_exposed, exposed);
      worst_comm = std::max(worst_comm, comm);
    }
    // A global average blocks every rank: its share of the steps between two of them.
    if (mode.global_every > 0) {
      const double avg =
          allreduce_seconds(Method::RabenseifnerAllreduce, p, mode.global_bytes, net) /
          static_cast<double>(mode.global_every);
      worst_exposed = std::max(0.0, worst_exposed) + avg;
      worst_comm += avg;
    }
    const StepPrediction s = finish(w, p, worst_comm, worst_exposed);
    sum_step += s.step_s;
    sum_comm += s.comm_s;
    sum_exposed += s.exposed_s;
  }
  StepPrediction mean = finish(w, p, sum_comm / steps, sum_exposed / steps);
  mean.step_s = sum_step / steps;
  mean.efficiency = mean.step_s > 0 ? mean.compute_s / mean.step_s : 1.0;
  mean.images_per_s = static_cast<double>(w.batch_per_rank) * p / mean.step_s;
  return mean;
}

double allreduce_seconds(Method m, int p, int64_t bytes, const Network& net) {
  if (p <= 1 || bytes <= 0) return 0;
  const double n = static_cast<double>(bytes);
  const bool multi_node = p > net.ranks_per_node;
  if (m == Method::RingAllreduce) {
    // Ranks in node order: one rank per node sends across the boundary, so no NIC is shared; a
    // round lasts as long as its slowest link.
    const double alpha = multi_node ? net.inter_latency_s : net.intra_latency_s;
    const double bw = multi_node ? std::min(net.inter_bandwidth_Bps, net.intra_bandwidth_Bps)
                                 : net.intra_bandwidth_Bps;
    const double chunk = n / p;
    return 2.0 * (p - 1) * (alpha + chunk / bw) + (p - 1) * chunk / net.mix_bandwidth_Bps;
  }
  if (m != Method::RabenseifnerAllreduce) throw std::invalid_argument("not an allreduce");
  int p2 = 1;
  while (p2 * 2 <= p) p2 *= 2;
  double t = 0;
  auto link = [&](int distance, double size) {
    const bool remote = distance >= net.ranks_per_node;
    // Past the node, every rank of a node crosses its NIC in the same round.
    const double bw = remote ? net.inter_bandwidth_Bps / std::min(net.ranks_per_node, p)
                             : net.intra_bandwidth_Bps;
    return (remote ? net.inter_latency_s : net.intra_latency_s) + size / bw;
  };
  if (p2 < p) t += 2 * link(p2, n) + n / net.mix_bandwidth_Bps;  // fold the extra ranks in, out
  double size = n;
  for (int d = p2 / 2; d >= 1; d /= 2) {  // recursive halving, then doubling in reverse
    size /= 2;
    t += 2 * link(d, size) + size / net.mix_bandwidth_Bps;
  }
  return t;
}

StepPrediction predict_allreduce(Method m, int p, const Network& net, const Workload& w) {
  check(net, w);
  if (p < 1) throw std::invalid_argument("p must be >= 1");
  const std::vector<double> ready = ready_times(w);
  double comm = 0;
  for (int64_t b : w.bucket_bytes) comm += allreduce_seconds(m, p, b, net);
  const double f = pipeline(
      ready, 0.0, [&](size_t i) { return allreduce_seconds(m, p, w.bucket_bytes[i], net); });
  return finish(w, p, comm, f - (w.forward_s + w.backward_s));
}

}  // namespace gg::partners
