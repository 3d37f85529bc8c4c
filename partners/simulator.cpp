#include "partners/simulator.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace gg::partners {

namespace {

// Sources per bitset block: 64 words per row keeps one block of p = 65536 rows at 32 MiB.
constexpr int kBlockWords = 64;
// At most this many cached recv_from entries (64 MiB) in diffusion_steps.
constexpr int64_t kCachedEntries = int64_t{1} << 24;

void check_count(const char* what, int64_t n) {
  if (n < 0) throw std::invalid_argument(std::string(what) + " must be >= 0");
}

// Deterministic start values in [-1, 1): the simulator's results must not depend on the run.
double uniform_pm1(uint64_t i) {
  uint64_t z = i * 0x9e3779b97f4a7c15ULL + 0x5eed;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * 0x1.0p-52 - 1.0;
}

// X holds `cols` start vectors side by side (row v = rank v). One mixing step per call.
void mix_rows(const std::vector<Partners>& who, int cols, const std::vector<double>& x,
              std::vector<double>& next) {
  const int p = static_cast<int>(who.size());
  for (int v = 0; v < p; ++v) {
    const double* a = &x[static_cast<size_t>(v) * cols];
    double* out = &next[static_cast<size_t>(v) * cols];
    const int k = who[v].links();
    for (int c = 0; c < cols; ++c) {
      double sum = a[c];
      for (int i = 0; i < k; ++i)
        sum += x[static_cast<size_t>(who[v].link(i).recv_from) * cols + c];
      out[c] = sum / (k + 1);
    }
  }
}

template <typename T>
std::vector<T> mix_values(const Schedule& s, std::vector<T> x, int64_t first_step, int steps) {
  validate(s);
  check_count("first_step", first_step);
  check_count("steps", steps);
  if (x.size() != static_cast<size_t>(s.p))
    throw std::invalid_argument("mix needs one value per rank: got " + std::to_string(x.size()) +
                                " values for p=" + std::to_string(s.p));
  std::vector<T> next(x.size());
  for (int64_t t = first_step; t < first_step + steps; ++t) {
    const std::vector<Partners> who = step_partners(s, t);
    for (int v = 0; v < s.p; ++v) {
      const Partners& q = who[v];
      if (q.links() == 1) {
        next[v] = T(0.5) * (x[v] + x[q.recv_from]);
        continue;
      }
      // As the engine's PairAverage: the partners added in link order, the last one divides.
      T sum = x[v];
      for (int i = 0; i + 1 < q.links(); ++i) sum += x[q.link(i).recv_from];
      next[v] = (sum + x[q.link(q.links() - 1).recv_from]) / T(q.links() + 1);
    }
    x.swap(next);
  }
  return x;
}

}  // namespace

int diffusion_steps(const Schedule& s, int max_steps) {
  validate(s);
  check_count("max_steps", max_steps);
  const int p = s.p;
  if (p == 1) return 0;
  const int words = (p + 63) / 64;
  // Every block replays the same steps; keep their recv_from columns while that stays small
  // (drawing a rotated or random step costs a Fisher-Yates shuffle of p).
  // Rank v's k links' recv_from's at [v * k, v * k + k).
  const int k = links(s.kind);
  std::vector<std::vector<int>> cached;
  std::vector<int> scratch;
  const auto recv_from = [&](int t) -> const std::vector<int>& {
    if (t < static_cast<int>(cached.size())) return cached[t];
    scratch.resize(static_cast<size_t>(p) * k);
    const std::vector<Partners> who = step_partners(s, t);
    for (int v = 0; v < p; ++v)
      for (int i = 0; i < k; ++i)
        scratch[static_cast<size_t>(v) * k + i] = who[v].link(i).recv_from;
    if (t == static_cast<int>(cached.size()) && (int64_t{t} + 1) * p * k <= kCachedEntries) {
      cached.push_back(scratch);
      return cached.back();
    }
    return scratch;
  };
  int worst = 0;
  // Sources are independent columns of the product, so blocks of them can be run one after
  // another; memory stays at two blocks whatever p is.
  for (int w0 = 0; w0 < words; w0 += kBlockWords) {
    const int nb = std::min(kBlockWords, words - w0);
    const int first_source = w0 * 64;
    const int sources = std::min(p - first_source, nb * 64);
    std::vector<uint64_t> full(nb, ~uint64_t{0});
    if (sources % 64 != 0) full[nb - 1] = (uint64_t{1} << (sources % 64)) - 1;
    // reach[v] = the sources (in this block) whose start value has reached rank v.
    std::vector<uint64_t> reach(static_cast<size_t>(p) * nb, 0), next(reach.size());
    for (int u = first_source; u < first_source + sources; ++u) {
      const int bit = u - first_source;
      reach[static_cast<size_t>(u) * nb + bit / 64] |= uint64_t{1} << (bit % 64);
    }
    int t = 0;
    for (bool done = false; !done;) {
      if (t == max_steps) return -1;
      const std::vector<int>& from = recv_from(t);
      uint64_t missing = 0;  // any source bit still absent anywhere
      for (int v = 0; v < p; ++v) {
        const uint64_t* a = &reach[static_cast<size_t>(v) * nb];
        uint64_t* out = &next[static_cast<size_t>(v) * nb];
        std::copy(a, a + nb, out);
        for (int i = 0; i < k; ++i) {
          const uint64_t* b =
              &reach[static_cast<size_t>(from[static_cast<size_t>(v) * k + i]) * nb];
          for (int j = 0; j < nb; ++j) out[j] |= b[j];
        }
        for (int j = 0; j < nb; ++j) missing |= out[j] ^ full[j];
      }
      reach.swap(next);
      ++t;
      done = missing == 0;
    }
    worst = std::max(worst, t);
  }
  return worst;
}

double deviation_from_average(const Schedule& s, int steps) {
  validate(s);
  check_count("steps", steps);
  const int p = s.p;
  if (p == 1) return 0.0;
  // Every basis vector at once is the product matrix itself: exact, O(p^2) per step.
  const bool exact = p <= 1024;
  const int cols = exact ? p : 8;
  std::vector<double> x(static_cast<size_t>(p) * cols), next(x.size());
  for (int v = 0; v < p; ++v)
    for (int c = 0; c < cols; ++c)
      x[static_cast<size_t>(v) * cols + c] =
          exact ? (v == c ? 1.0 : 0.0) : uniform_pm1(static_cast<uint64_t>(c) * p + v);
  // The mean of each column is invariant (every W_t is doubly stochastic), so fix it up front.
  std::vector<double> mean(cols, 0.0), start_dev(cols, 0.0);
  for (int v = 0; v < p; ++v)
    for (int c = 0; c < cols; ++c) mean[c] += x[static_cast<size_t>(v) * cols + c];
  for (double& m : mean) m /= p;
  for (int v = 0; v < p; ++v)
    for (int c = 0; c < cols; ++c)
      start_dev[c] =
          std::max(start_dev[c], std::abs(x[static_cast<size_t>(v) * cols + c] - mean[c]));
  for (int t = 0; t < steps; ++t) {
    mix_rows(step_partners(s, t), cols, x, next);
    x.swap(next);
  }
  double worst = 0.0;
  for (int v = 0; v < p; ++v)
    for (int c = 0; c < cols; ++c)
      worst =
          std::max(worst, std::abs(x[static_cast<size_t>(v) * cols + c] - mean[c]) / start_dev[c]);
  return worst;
}

double contraction_per_round(const Schedule& s, int rounds) {
  validate(s);
  if (rounds < 1) throw std::invalid_argument("rounds must be >= 1");
  const int p = s.p;
  if (p == 1) return 0.0;
  const auto distance = [](const std::vector<double>& x) {
    // Shifted by x[0], so ranks that agree bit for bit (hypercube) give exactly 0, not rounding.
    double shift = 0.0;
    for (double v : x) shift += v - x[0];
    const double mean = x[0] + shift / static_cast<double>(x.size());
    double d = 0.0;
    for (double v : x) d += (v - mean) * (v - mean);
    return d;
  };
  std::vector<double> x(p);
  for (int v = 0; v < p; ++v) x[v] = uniform_pm1(static_cast<uint64_t>(v));
  const double d0 = distance(x);
  x = mix(s, std::move(x), 0, rounds * round_length(p));
  const double d1 = distance(x);
  if (d1 == 0.0 || d0 == 0.0) return 0.0;
  return std::pow(d1 / d0, 1.0 / rounds);
}

std::vector<double> mix(const Schedule& s, std::vector<double> x, int64_t first_step, int steps) {
  return mix_values(s, std::move(x), first_step, steps);
}

std::vector<float> mix(const Schedule& s, std::vector<float> x, int64_t first_step, int steps) {
  return mix_values(s, std::move(x), first_step, steps);
}

}  // namespace gg::partners
