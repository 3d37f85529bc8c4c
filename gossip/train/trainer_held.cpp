// Trainer, the ranks it holds: a real rank's state is the network's own; virtual ranks'
// (train.virtual_ranks) each their own, with exchanges over all of them, and sums over them in
// MPICH's allreduce order.

#include <algorithm>
#include <stdexcept>

#include "gossip/comm/mixing.hpp"
#include "gossip/comm/tree_sum.hpp"
#include "gossip/train/trainer.hpp"

namespace gg::gossip {

float* Trainer::params_of(int i) {
  return held_.empty() ? store().params.data() : held_[static_cast<size_t>(i)].params.data();
}

float* Trainer::grads_of(int i) {
  return held_.empty() ? store().grads.data() : held_[static_cast<size_t>(i)].grads.data();
}

std::span<float> Trainer::buffers_of(int i) {
  if (!held_.empty()) return held_[static_cast<size_t>(i)].buffers;
  return {store().buffers.data(), static_cast<size_t>(store().buffers.size())};
}

kernels::Sgd& Trainer::sgd_of(int i) {
  return held_.empty() ? sgd_ : held_[static_cast<size_t>(i)].sgd;
}

void Trainer::sum_over_ranks(double* out, int n, const std::function<double(int, int)>& value) {
  std::vector<double> v(static_cast<size_t>(held()));
  for (int k = 0; k < n; ++k) {
    for (int i = 0; i < held(); ++i) v[static_cast<size_t>(i)] = value(i, k);
    out[k] = tree_sum(v);  // one rank: its value
  }
  world_.allreduce_sum(out, n);
}

void Trainer::mean_over_ranks(const std::function<const float*(int)>& x, int64_t n, float* avg) {
  std::vector<const float*> parts;
  for (int i = 0; i < held(); ++i) parts.push_back(x(i));
  if (parts.size() > 1 || parts[0] != avg)
    tree_sum(parts, static_cast<size_t>(n), avg);  // one rank: a copy
  if (world_.size() > 1) world_.allreduce_sum(avg, n);
  if (ranks_ > 1) mean_of_sum({avg, static_cast<size_t>(n)}, ranks_);
}

void Trainer::average_state() {
  // The average into held rank 0's buffers (a tree sum may write over one of its parts), then
  // into the others'.
  const int64_t n = graph().param_count(), m = graph().buffer_count();
  mean_over_ranks([this](int i) { return params_of(i); }, n, params_of(0));
  mean_over_ranks([this](int i) { return buffers_of(i).data(); }, m, buffers_of(0).data());
  for (int i = 1; i < held(); ++i) {
    std::copy(params_of(0), params_of(0) + n, params_of(i));
    std::copy(buffers_of(0).begin(), buffers_of(0).end(), buffers_of(i).begin());
  }
  store_written(kernels::kParams | kernels::kBuffers);
}

void Trainer::make_virtual_exchanges() {
  held_.reserve(static_cast<size_t>(ranks_));  // exchanges keep pointers into the ranks' buffers
  const int64_t n = graph().param_count();
  const auto join = [this](auto e, Part part) {
    joins_.emplace_back(e.get(), part);
    return e;
  };
  if (algorithm_.allreduce) {
    exchange_ = join(std::make_unique<VirtualAllreduce>(n), Part::Grads);
    return;
  }
  if (ranks_ == 1) {  // as one real rank: no partner, nothing mixed
    fitted(gg::gossip::exchange_options(c_, Mixed::Weights));
    return;
  }
  const partners::Schedule schedule = gossip_schedule(c_, ranks_);
  if (c_.gossip.hierarchy == Hierarchy::Node) {
    exchange_ = join(
        std::make_unique<VirtualHierarchy>(n, c_.network.ranks_per_node, schedule, net_.buckets()),
        Part::Grads);
    return;
  }
  const double share = c_.train.virtual_late;
  const auto seed = static_cast<uint64_t>(c_.train.seed);
  const auto make = [&](Mixed what, uint64_t stream, Part part) {
    return join(std::make_unique<VirtualExchange>(exchange_options(schedule, what), net_.buckets(),
                                                  late_model(share, seed, stream)),
                part);
  };
  if (algorithm_.grads) exchange_ = make(Mixed::Grads, 0, Part::Grads);
  if (algorithm_.weights) model_exchange_ = make(Mixed::Weights, 1, Part::Params);
  if (algorithm_.momentum) momentum_exchange_ = make(Mixed::Momentum, 1, Part::Momentum);
}

void Trainer::add_rank() {
  if (c_.train.virtual_ranks <= 0 || static_cast<int>(held_.size()) == ranks_)
    throw std::logic_error("Trainer::add_rank: not a virtual run, or every rank is there");
  const kernels::Graph& g = graph();
  const kernels::ParamStore& s = net_.store();
  HeldRank& r = held_.emplace_back(
      g.param_count(), g.buffer_count(),
      kernels::SgdOptions{static_cast<float>(c_.train.momentum),
                          static_cast<float>(c_.train.weight_decay), c_.train.nesterov});
  std::copy(s.params.data(), s.params.data() + s.params.size(), r.params.begin());
  std::copy(s.buffers.begin(), s.buffers.end(), r.buffers.begin());
  for (auto& [e, part] : joins_)
    e->add_rank(part == Part::Params  ? r.params.data()
                : part == Part::Grads ? r.grads.data()
                                      : r.sgd.velocity().data());
}

void Trainer::load(int i) {
  if (held_.empty()) return;  // a real rank's state is the network's
  const HeldRank& r = held_[static_cast<size_t>(i)];
  kernels::ParamStore& s = net_.store();
  std::copy(r.params.begin(), r.params.end(), s.params.data());
  std::copy(r.buffers.begin(), r.buffers.end(), s.buffers.begin());
}

BucketExchange::Lateness Trainer::held_lateness() const {
  BucketExchange::Lateness all;
  for (const BucketExchange* e : exchanges()) {
    all.late += e->held_lateness().late;
    all.unmixed += e->held_lateness().unmixed;
  }
  return all;
}

int64_t Trainer::growth_bytes(int64_t steps) const {
  int64_t grow = 0;
  for (const auto& [e, part] : joins_)
    grow += e->growth_bytes(part == Part::Grads ? steps : cadence_.rounds(steps));
  return grow;
}

kernels::Executor& Trainer::evaluation_executor(int64_t samples) {
  if (!eval_exec_)
    eval_exec_ = &net_.at_batch(evaluation_batch(c_.train.eval_batch, samples, ranks_));
  return *eval_exec_;
}

}  // namespace gg::gossip
