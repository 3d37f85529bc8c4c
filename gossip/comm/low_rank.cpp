#include "gossip/comm/low_rank.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "shuffle/rng.hpp"

namespace gg::gossip {
namespace {

// Calls f(e, r, c, n) for every run of a matrix view's storage: n elements from index e of the
// buffer, starting at (row r, column c), along a row (plain: the whole row) or, in oneDNN's
// blocks, down a column (a block's b output channels).
template <class F>
void for_each_run(const MatrixView& v, F&& f) {
  if (v.block == 0) {
    for (int64_t r = 0; r < v.rows; ++r) f(v.begin + r * v.cols, r, int64_t{0}, v.cols);
    return;
  }
  const int64_t b = v.block, in = v.cols / v.kernel;
  int64_t e = v.begin;
  for (int64_t ob = 0; ob < v.rows / b; ++ob)
    for (int64_t ib = 0; ib < in / b; ++ib)
      for (int64_t t = 0; t < v.kernel; ++t)
        for (int64_t ii = 0; ii < b; ++ii, e += b) f(e, ob * b, (ib * b + ii) * v.kernel + t, b);
}

// sum a_i b_i in eight lanes (vectorised, the same order on every rank).
float dot(const float* a, const float* b, int64_t n) {
  float s[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) s[j] += a[i + j] * b[i + j];
  float tail = 0;
  for (; i < n; ++i) tail += a[i] * b[i];
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7])) + tail;
}
void axpy(float a, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

// n uniform draws in [-1, 1) from the splitmix64 sequence after s: the same on both ends of a
// pair.
void fill_uniform(uint64_t s, float* v, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    s = shuffle::splitmix64(s);
    v[i] = static_cast<float>(static_cast<double>(s >> 11) * 0x1.0p-52 - 1.0);
  }
}

}  // namespace

std::vector<MatrixView> matrix_views(const kernels::Graph& g, const kernels::ParamLayout& layout,
                                     int rank) {
  std::vector<MatrixView> out;
  const auto& params = g.params();
  for (size_t i = 0; i < params.size(); ++i) {
    const kernels::TensorSpec& t = params[i];
    MatrixView v{t.offset, t.size()};
    if (t.dims.size() >= 2 && t.dims[0] > 0) {
      const int64_t rows = t.dims[0], cols = t.size() / rows;
      if (rank * (rows + cols) < rows * cols) {
        v.rows = rows;
        v.cols = cols;
        v.kernel = t.dims.size() == 4 ? t.dims[2] * t.dims[3] : 1;
        v.block = layout.block_of(static_cast<int>(i));
      }
    }
    out.push_back(v);
  }
  return out;
}

int largest_gaining_rank(const kernels::Graph& g) {
  int64_t best = 0;
  for (const kernels::TensorSpec& t : g.params())
    if (t.dims.size() >= 2 && t.dims[0] > 0) {
      const int64_t rows = t.dims[0], cols = t.size() / rows;
      best = std::max(best, (rows * cols - 1) / (rows + cols));  // r (rows + cols) < rows cols
    }
  return static_cast<int>(std::min<int64_t>(best, 1 << 30));
}

void check_gains(int r, const kernels::Graph& g, const std::string& model) {
  const int most = largest_gaining_rank(g);
  if (r > most)
    throw std::invalid_argument(
        "gossip.low_rank = " + std::to_string(r) + " compresses no weight matrix of " + model +
        " (a rows x cols matrix gains where r (rows + cols) < rows cols; every one would travel "
        "whole): use at most " +
        std::to_string(most));
}

LowRankMix::LowRankMix(std::vector<MatrixView> views, const std::vector<kernels::Bucket>& buckets,
                       int rank, int self, int period)
    : in_bucket_(buckets.size()), rank_(rank), self_(self), period_(std::max(1, period)) {
  if (rank < 1) throw std::invalid_argument("low-rank gossip needs a rank of at least 1");
  std::sort(views.begin(), views.end(),
            [](const MatrixView& a, const MatrixView& b) { return a.begin < b.begin; });
  int64_t message = 0;
  for (const MatrixView& v : views) {
    Item it{v, message, -1};
    if (v.rows > 0) {
      it.factor = factor_floats_;
      factor_floats_ += rank * std::max(v.rows, v.cols);
      message += rank * std::max(v.rows, v.cols);
    } else {
      message += v.size;
    }
    items_.push_back(it);
  }
  message_buckets_.resize(buckets.size());
  for (size_t b = 0; b < buckets.size(); ++b) {
    kernels::Bucket m{message, 0};
    for (size_t i = 0; i < items_.size(); ++i) {
      const MatrixView& v = items_[i].v;
      if (v.begin < buckets[b].begin || v.begin >= buckets[b].end) continue;
      in_bucket_[b].push_back(static_cast<int>(i));
      m.begin = std::min(m.begin, items_[i].message);
      m.end = std::max(m.end, i + 1 < items_.size() ? items_[i + 1].message : message);
    }
    if (in_bucket_[b].empty()) m = {0, 0};
    message_buckets_[b] = m;
  }
}

void LowRankMix::begin(int64_t step, int peer) {
  peer_ = peer;
  step_ = step;
  right_ = (step / period_) % 2 == 0;
  auto [at, fresh] = factors_.try_emplace(peer);
  now_ = &at->second;
  if (!fresh && now_->size() == static_cast<size_t>(factor_floats_)) return;
  now_->assign(static_cast<size_t>(factor_floats_), 0.f);
  for (size_t i = 0; i < items_.size(); ++i)
    if (items_[i].factor >= 0) fresh_factor(items_[i], now_->data() + items_[i].factor, i);
}

void LowRankMix::fresh_factor(const Item& it, float* f, uint64_t salt) const {
  const int64_t len = right_ ? it.v.cols : it.v.rows;
  const uint64_t lo = std::min(self_, peer_), hi = std::max(self_, peer_);
  fill_uniform(shuffle::splitmix64(shuffle::splitmix64(lo * 0x100000001ull + hi) ^ salt), f,
               len * rank_);
  orthonormalise(f, len, salt);
}

// Gram-Schmidt over f's rank_ columns of len values; a column with nothing left of it is drawn
// afresh (identical weights have a zero difference), so that both ends keep an orthonormal factor.
void LowRankMix::orthonormalise(float* f, int64_t len, uint64_t salt) const {
  for (int k = 0; k < rank_; ++k) {
    float* v = f + k * len;
    for (int tries = 0; tries < 2; ++tries) {
      for (int j = 0; j < k; ++j) {
        const float* u = f + j * len;
        double dot = 0;
        for (int64_t i = 0; i < len; ++i) dot += static_cast<double>(u[i]) * v[i];
        for (int64_t i = 0; i < len; ++i) v[i] -= static_cast<float>(dot) * u[i];
      }
      double norm = 0;
      for (int64_t i = 0; i < len; ++i) norm += static_cast<double>(v[i]) * v[i];
      if (!(norm < 1e-30)) {  // a NaN stays NaN (the step's NaN check sees it)
        const float inv = static_cast<float>(1 / std::sqrt(norm));
        for (int64_t i = 0; i < len; ++i) v[i] *= inv;
        break;
      }
      fill_uniform(
          shuffle::splitmix64(salt ^ shuffle::splitmix64(static_cast<uint64_t>(step_) * 131 + k)),
          v, len);
    }
  }
}

void LowRankMix::message(int b, const float* x, float* out) const {
  for (int i : in_bucket_[static_cast<size_t>(b)]) {
    const Item& it = items_[static_cast<size_t>(i)];
    float* o = out + it.message;
    if (it.factor < 0) {
      std::copy(x + it.v.begin, x + it.v.begin + it.v.size, o);
      continue;
    }
    const int64_t rows = it.v.rows, cols = it.v.cols;
    const float* f = now_->data() + it.factor;
    // Right: X Q (rows x r, by row); left: X^T P (cols x r, by column). Plain runs go along a
    // row, blocked ones down a column.
    const int64_t len = right_ ? rows : cols;
    std::vector<float> acc(static_cast<size_t>(len * rank_), 0.f);
    const bool along = it.v.block == 0;
    for_each_run(it.v, [&](int64_t e, int64_t r, int64_t c, int64_t n) {
      for (int k = 0; k < rank_; ++k) {
        float* m = acc.data() + k * len;
        if (right_ && along)
          m[r] += dot(x + e, f + k * cols + c, n);
        else if (right_)
          axpy(f[k * cols + c], x + e, m + r, n);
        else if (along)
          axpy(f[k * rows + r], x + e, m + c, n);
        else
          m[c] += dot(x + e, f + k * rows + r, n);
      }
    });
    std::fill(o, o + rank_ * std::max(rows, cols), 0.f);
    std::copy(acc.begin(), acc.end(), o);
  }
}

void LowRankMix::mix(int b, const float* own, const float* theirs, float* y) {
  const bool low = self_ < peer_;
  const float* lo = low ? own : theirs;
  const float* hi = low ? theirs : own;
  const float half = low ? -0.5f : 0.5f;  // X_low -= D F / 2, X_high += D F / 2
  const int64_t base = message_buckets_[static_cast<size_t>(b)].begin;
  for (int i : in_bucket_[static_cast<size_t>(b)]) {
    const Item& it = items_[static_cast<size_t>(i)];
    const int64_t m = it.message - base;
    if (it.factor < 0) {
      for (int64_t j = 0; j < it.v.size; ++j) y[it.v.begin + j] += half * (lo[m + j] - hi[m + j]);
      continue;
    }
    const int64_t rows = it.v.rows, cols = it.v.cols;
    const int64_t len = right_ ? rows : cols;
    std::vector<float> d(static_cast<size_t>(len * rank_));
    for (int64_t j = 0; j < len * rank_; ++j) d[j] = lo[m + j] - hi[m + j];
    float* f = now_->data() + it.factor;
    // y += half sum_k A_k(row) B_k(col): right, A = D and B = Q; left, A = P and B = D.
    const float* A = right_ ? d.data() : f;
    const float* B = right_ ? f : d.data();
    const bool along = it.v.block == 0;
    for_each_run(it.v, [&](int64_t e, int64_t r, int64_t c, int64_t n) {
      for (int k = 0; k < rank_; ++k) {
        if (along)
          axpy(half * A[k * rows + r], B + k * cols + c, y + e, n);
        else
          axpy(half * B[k * cols + c], A + k * rows + r, y + e, n);
      }
    });
    // The next meeting's factor: this difference's side, orthonormalised.
    std::copy(d.begin(), d.end(), f);
    orthonormalise(f, len, static_cast<uint64_t>(i));
  }
}

std::vector<PublicCopy> LowRankMix::save() const {
  std::vector<PublicCopy> out;
  for (const auto& [peer, v] : factors_) out.push_back({peer, true, v});
  return out;
}

void LowRankMix::load(std::vector<PublicCopy> saved) {
  factors_.clear();
  now_ = nullptr;
  for (PublicCopy& s : saved)
    if (s.values.size() == static_cast<size_t>(factor_floats_))
      factors_[s.peer] = std::move(s.values);
}

void LowRankMix::forget(const std::vector<int>& peers) {
  for (const int peer : peers) factors_.erase(peer);
  now_ = nullptr;
}

void check_pair(const partners::Partners& peers) {
  if (peers.send_to != peers.recv_from)
    throw std::logic_error("low-rank gossip needs pairs (send_to == recv_from): rank " +
                           std::to_string(peers.send_to) + " and " +
                           std::to_string(peers.recv_from));
}

LowRankAverage::LowRankAverage(float* buffer, const std::vector<kernels::Bucket>& buckets,
                               std::vector<MatrixView> views, int rank, int self, int period)
    : WithLowRank(LowRankMix(std::move(views), buckets, rank, self, period)), x_(buffer) {}

void LowRankAverage::received(int b, int64_t, const float* partner) { mix_into(b, partner, x_); }

LowRankDelayed::LowRankDelayed(float* buffer, const std::vector<kernels::Bucket>& buckets,
                               std::vector<MatrixView> views, int rank, int self, int period)
    : WithLowRank(LowRankMix(std::move(views), buckets, rank, self, period), buffer, buckets) {}

void LowRankDelayed::received(int b, int64_t, const float* partner) {
  const kernels::Bucket& k = buckets_[static_cast<size_t>(b)];
  std::fill(delta_.begin() + k.begin, delta_.begin() + k.end, 0.f);
  mix_into(b, partner, delta_.data());
}

}  // namespace gg::gossip
