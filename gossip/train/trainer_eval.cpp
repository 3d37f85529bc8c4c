// Trainer, measuring the ranks' models: evaluation of their average on a data set, the average
// itself, and the consensus distance (each a collective).

#include <algorithm>
#include <vector>

#include "gossip/comm/mixing.hpp"
#include "gossip/train/trainer.hpp"
#include "kernels/loss.hpp"
#include "shuffle/loader.hpp"

namespace gg::gossip {

shuffle::LoaderOptions evaluation_loader(shuffle::LoaderOptions o, int64_t batch, int rank,
                                         int ranks) {
  o.batch = batch;
  o.rank = rank;
  o.ranks = ranks;
  o.augment.enabled = false;
  o.shuffle = false;
  o.drop_last = false;
  o.prefetch = 2;
  return o;
}

int64_t evaluation_batch(int64_t eval_batch, int64_t samples, int ranks) {
  const int64_t share = (samples + ranks - 1) / std::max(1, ranks);
  return std::max<int64_t>(1, std::min(eval_batch, share));
}

EvalSums evaluation_sums(kernels::Executor& exec, int64_t classes,
                         const shuffle::SampleSource& data, shuffle::LoaderOptions o, int rank,
                         int ranks) {
  o = evaluation_loader(o, exec.batch(), rank, ranks);
  EvalSums sums = {0, 0, 0, 0};
  // The last ranks' shares of a test set cut into slices of ceil(n / ranks) may be empty (10,000
  // samples over 4,096 ranks: 3 each for 3,334 ranks, none for the rest).
  if (shuffle::batches_per_epoch(data.size(), o) == 0) return sums;
  shuffle::PrefetchLoader loader(data, o, 0, 1);
  shuffle::Batch b;
  while (loader.next(b)) {
    const float* logits = exec.forward(b.x.data(), false);
    const auto r = kernels::softmax_cross_entropy(logits, b.y.data(), o.batch, classes, nullptr);
    int64_t n = 0;
    for (int32_t v : b.y) n += v >= 0;
    sums[0] += r.loss * static_cast<double>(n);
    sums[1] += static_cast<double>(r.correct);
    sums[2] += static_cast<double>(r.top5);
    sums[3] += static_cast<double>(n);
  }
  return sums;
}

EvalStats eval_stats(const EvalSums& sums) {
  EvalStats e;
  e.samples = static_cast<int64_t>(sums[3]);
  if (e.samples > 0) {
    e.loss = sums[0] / sums[3];
    e.top1 = sums[1] / sums[3];
    e.top5 = sums[2] / sums[3];
  }
  return e;
}

EvalStats Trainer::evaluate(const shuffle::SampleSource& data, shuffle::LoaderOptions o) {
  // Evaluate the average model, then give every rank its own weights back (held ranks keep
  // theirs apart from the network's anyway).
  flush_model();
  const std::vector<float> own_params = store().params, own_buffers = store().buffers;
  const int64_t n = graph().param_count();
  std::vector<float> avg(static_cast<size_t>(n));
  mean_over_ranks([this](int i) { return params_of(i); }, n, avg.data());
  const double consensus = distance_to_average(avg.data());
  std::copy(avg.begin(), avg.end(), store().params.data());
  mean_over_ranks([this](int i) { return buffers_of(i).data(); }, graph().buffer_count(),
                  store().buffers.data());
  // A detached state's executor may be the evaluation's: it evaluates what the state holds.
  store_written(kernels::kParams | kernels::kBuffers);
  kernels::Executor& exec = evaluation_executor(data.size());
  // Each rank its share of the data set, the sums added over the ranks.
  std::vector<EvalSums> parts;
  for (int i = 0; i < held(); ++i)
    parts.push_back(evaluation_sums(exec, graph().classes(), data, o,
                                    held_.empty() ? world_.rank() : i, ranks_));
  EvalSums sums;
  sum_over_ranks(sums.data(), static_cast<int>(sums.size()), [&](int i, int k) {
    return parts[static_cast<size_t>(i)][static_cast<size_t>(k)];
  });
  EvalStats e = eval_stats(sums);
  store().params = own_params;
  store().buffers = own_buffers;
  store_written(kernels::kParams | kernels::kBuffers);
  e.consensus = consensus;
  return e;
}

void Trainer::average_model(std::vector<float>& params, std::vector<float>& buffers) {
  flush_model();
  const int64_t n = graph().param_count();
  std::vector<float> avg(static_cast<size_t>(n));
  mean_over_ranks([this](int i) { return params_of(i); }, n, avg.data());
  params = net_.plain(avg.data());
  buffers.resize(static_cast<size_t>(graph().buffer_count()));
  mean_over_ranks([this](int i) { return buffers_of(i).data(); }, graph().buffer_count(),
                  buffers.data());
}

double Trainer::consensus_distance() {
  std::vector<float> avg(static_cast<size_t>(graph().param_count()));
  mean_over_ranks([this](int i) { return params_of(i); }, graph().param_count(), avg.data());
  return distance_to_average(avg.data());
}

double Trainer::distance_to_average(const float* avg) {
  const auto n = static_cast<size_t>(graph().param_count());
  double d = 0;
  sum_over_ranks(&d, 1, [&](int i, int) { return squared_distance({params_of(i), n}, {avg, n}); });
  return d / ranks_;
}

}  // namespace gg::gossip
