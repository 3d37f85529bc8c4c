// The reference backend: every layer as the textbook loop over plain NCHW floats, one thread, no
// tricks, so that a disagreement with a fast backend points at the fast backend.
#include "kernels/reference/reference_executor.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

namespace gg::kernels {

namespace {

Chw chw(const Dims& d) { return kernels::chw(d, "reference"); }

// Activations and their gradients for one node, plus what its backward needs from its forward.
struct NodeState {
  std::vector<float> y;
  std::vector<float> dy;  // summed over every consumer, hence zeroed before each backward
  std::vector<float> mean, inv_std;  // batch norm: statistics the last training forward used
  std::vector<int64_t> argmax;       // max pool: input offset (within the plane) of each output
  std::vector<float> mask;           // dropout: the multipliers of the last training forward
  std::vector<double> denom;         // LRN: k + alpha / size * (window sum of squares)
};

class ReferenceExecutor final : public Executor {
 public:
  ReferenceExecutor(const Graph& g, int64_t batch, ParamStore& store,
                    const std::vector<Bucket>& buckets)
      : Executor(batch), g_(g), store_(store) {
    if (batch < 1) throw std::invalid_argument("reference: batch must be >= 1");
    if (g.output() < 0) throw std::invalid_argument("reference: graph has no output");
    if (static_cast<int64_t>(store.params.size()) != g.param_count() ||
        static_cast<int64_t>(store.grads.size()) != g.param_count() ||
        static_cast<int64_t>(store.buffers.size()) != g.buffer_count())
      throw std::invalid_argument("reference: parameter store does not match the graph");
    const int n = static_cast<int>(g.nodes().size());
    state_.resize(n);
    for (int id = 0; id < n; ++id) {
      const Node& node = g.node(id);
      NodeState& s = state_[id];
      const int64_t elems = batch * numel(node.out);
      s.y.assign(elems, 0.f);
      s.dy.assign(elems, 0.f);
      if (node.op == Op::BatchNorm) {
        s.mean.assign(node.out[0], 0.f);
        s.inv_std.assign(node.out[0], 0.f);
      } else if (node.op == Op::MaxPool) {
        s.argmax.assign(elems, 0);
      } else if (node.op == Op::Dropout) {
        s.mask.assign(elems, 0.f);
      } else if (node.op == Op::Lrn) {
        s.denom.assign(elems, 0.0);
      }
    }
    for (int id = n - 1; id >= 0; --id) order_.push_back(id);
    fire_at_ = bucket_completion(g, buckets, order_);
    std::vector<int> forward_order(static_cast<size_t>(n));
    for (int id = 0; id < n; ++id) forward_order[static_cast<size_t>(id)] = id;
    gate_at_ = bucket_first_use(g, buckets, forward_order);
  }

  const float* forward(const float* x, bool train) override {
    trained_ = false;  // a forward that throws halfway must not leave a backward possible
    for (int id = 0; id < static_cast<int>(state_.size()); ++id) {
      if (gate_)
        for (int b : gate_at_[static_cast<size_t>(id)]) gate_(b);
      forward_node(id, x, train);
    }
    trained_ = train;
    if (train) ++dropout_step_;
    return state_[g_.output()].y.data();
  }

  void backward(const float* dlogits, const BucketReady& ready) override {
    if (!trained_)
      throw std::logic_error("reference: backward needs a training forward first (train=true)");
    for (NodeState& s : state_) std::fill(s.dy.begin(), s.dy.end(), 0.f);
    std::vector<float>& dout = state_[g_.output()].dy;
    std::copy(dlogits, dlogits + dout.size(), dout.begin());
    for (size_t pos = 0; pos < order_.size(); ++pos) {
      backward_node(order_[pos]);
      if (ready)
        for (int b : fire_at_[pos]) ready(b);
    }
  }

 private:
  const float* param(const Node& n, size_t i) const {
    return store_.params.data() + g_.params()[n.params.at(i)].offset;
  }
  float* grad(const Node& n, size_t i) {
    return store_.grads.data() + g_.params()[n.params.at(i)].offset;
  }
  float* buffer(const Node& n, size_t i) {
    return store_.buffers.data() + g_.buffers()[n.buffers.at(i)].offset;
  }
  const std::vector<float>& in_y(const Node& n, size_t i = 0) const {
    return state_[n.inputs.at(i)].y;
  }
  // Gradients into the graph input are never used, so backward skips computing them.
  bool wants_dx(const Node& n, size_t i = 0) const {
    return g_.node(n.inputs.at(i)).op != Op::Input;
  }
  std::vector<float>& in_dy(const Node& n, size_t i = 0) { return state_[n.inputs.at(i)].dy; }

  void forward_node(int id, const float* x, bool train) {
    const Node& n = g_.node(id);
    std::vector<float>& y = state_[id].y;
    switch (n.op) {
      case Op::Input:
        std::copy(x, x + y.size(), y.begin());
        return;
      case Op::Conv:
        return conv_forward(n, y);
      case Op::BatchNorm:
        return batch_norm_forward(n, state_[id], train);
      case Op::Relu: {
        // PyTorch's: relu(NaN) = NaN, so that a NaN reaches the loss.
        const std::vector<float>& in = in_y(n);
        for (size_t i = 0; i < y.size(); ++i) y[i] = in[i] <= 0.f ? 0.f : in[i];
        return;
      }
      case Op::MaxPool:
        return max_pool_forward(n, state_[id]);
      case Op::AvgPool:
        return avg_pool_forward(n, y);
      case Op::GlobalAvgPool: {
        const std::vector<float>& in = in_y(n);
        const Chw s = chw(g_.node(n.inputs[0]).out);
        for (int64_t i = 0; i < batch_ * s.c; ++i) {
          double sum = 0;
          for (int64_t k = 0; k < s.h * s.w; ++k) sum += in[i * s.h * s.w + k];
          y[i] = static_cast<float>(sum / static_cast<double>(s.h * s.w));
        }
        return;
      }
      case Op::FullyConnected:
        return fc_forward(n, y);
      case Op::Add: {
        const std::vector<float>& a = in_y(n, 0);
        const std::vector<float>& b = in_y(n, 1);
        for (size_t i = 0; i < y.size(); ++i) y[i] = a[i] + b[i];
        return;
      }
      case Op::Concat:
        return concat(n, y.data(), false);
      case Op::Dropout: {
        const std::vector<float>& in = in_y(n);
        std::vector<float>& mask = state_[id].mask;
        for (size_t i = 0; i < y.size(); ++i) {
          mask[i] = train
                        ? dropout_multiplier(n.dropout, id, dropout_step_, static_cast<int64_t>(i))
                        : 1.f;
          y[i] = in[i] * mask[i];
        }
        return;
      }
      case Op::Lrn:
        return lrn_forward(n, state_[id]);
    }
    throw std::logic_error("reference: unhandled op");
  }

  void backward_node(int id) {
    const Node& n = g_.node(id);
    const std::vector<float>& dy = state_[id].dy;
    switch (n.op) {
      case Op::Input:
        return;
      case Op::Conv:
        return conv_backward(n, dy);
      case Op::BatchNorm:
        return batch_norm_backward(n, state_[id]);
      case Op::Relu: {
        if (!wants_dx(n)) return;
        const std::vector<float>& in = in_y(n);
        std::vector<float>& dx = in_dy(n);
        // PyTorch's threshold_backward: the gradient passes wherever the input is not <= 0, NaN
        // included.
        for (size_t i = 0; i < dy.size(); ++i)
          if (!(in[i] <= 0.f)) dx[i] += dy[i];
        return;
      }
      case Op::MaxPool: {
        if (!wants_dx(n)) return;
        const Chw in = chw(g_.node(n.inputs[0]).out);
        const Chw out = chw(n.out);
        std::vector<float>& dx = in_dy(n);
        const std::vector<int64_t>& arg = state_[id].argmax;
        for (int64_t plane = 0; plane < batch_ * out.c; ++plane)
          for (int64_t k = 0; k < out.h * out.w; ++k) {
            const int64_t o = plane * out.h * out.w + k;
            dx[plane * in.h * in.w + arg[o]] += dy[o];
          }
        return;
      }
      case Op::AvgPool:
        return avg_pool_backward(n, dy);
      case Op::GlobalAvgPool: {
        if (!wants_dx(n)) return;
        const Chw s = chw(g_.node(n.inputs[0]).out);
        std::vector<float>& dx = in_dy(n);
        const float scale = 1.f / static_cast<float>(s.h * s.w);
        for (int64_t i = 0; i < batch_ * s.c; ++i)
          for (int64_t k = 0; k < s.h * s.w; ++k) dx[i * s.h * s.w + k] += dy[i] * scale;
        return;
      }
      case Op::FullyConnected:
        return fc_backward(n, dy);
      case Op::Add: {
        // Accumulate one input at a time so that add(x, x) correctly doubles the gradient.
        for (size_t i = 0; i < 2; ++i) {
          if (!wants_dx(n, i)) continue;
          std::vector<float>& dx = in_dy(n, i);
          for (size_t k = 0; k < dy.size(); ++k) dx[k] += dy[k];
        }
        return;
      }
      case Op::Concat:
        return concat(n, state_[id].dy.data(), true);
      case Op::Dropout: {
        if (!wants_dx(n)) return;
        std::vector<float>& dx = in_dy(n);
        const std::vector<float>& mask = state_[id].mask;
        for (size_t i = 0; i < dy.size(); ++i) dx[i] += dy[i] * mask[i];
        return;
      }
      case Op::Lrn:
        return lrn_backward(n, state_[id]);
    }
    throw std::logic_error("reference: unhandled op");
  }

  // Forward copies each input's channels into its slice of y; backward adds each slice of dy
  // into that input's gradient (one input at a time, so concat(x, x) gets both slices).
  void concat(const Node& n, float* cat, bool backward) {
    const Chw out = chw(n.out);
    const int64_t plane = out.h * out.w;
    int64_t first = 0;  // first channel of this input in the output
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      const int64_t c = g_.node(n.inputs[i]).out[0];
      if (!backward || wants_dx(n, i)) {
        for (int64_t s = 0; s < batch_; ++s) {
          const int64_t at_out = (s * out.c + first) * plane, at_in = s * c * plane;
          if (backward) {
            std::vector<float>& dx = in_dy(n, i);
            for (int64_t k = 0; k < c * plane; ++k) dx[at_in + k] += cat[at_out + k];
          } else {
            const std::vector<float>& x = in_y(n, i);
            std::copy(x.begin() + at_in, x.begin() + at_in + c * plane, cat + at_out);
          }
        }
      }
      first += c;
    }
  }

  // y_c = x_c * d_c^-beta with d_c = k + alpha / size * sum_{|j - c| <= size/2} x_j^2 (PyTorch's
  // nn.LocalResponseNorm for odd sizes; channels outside [0, C) count as zero).
  void lrn_forward(const Node& n, NodeState& st) const {
    const Chw s = chw(n.out);
    const int64_t plane = s.h * s.w, half = n.lrn.size / 2;
    const double scale = static_cast<double>(n.lrn.alpha) / static_cast<double>(n.lrn.size);
    const std::vector<float>& x = in_y(n);
    for (int64_t b = 0; b < batch_; ++b)
      for (int64_t c = 0; c < s.c; ++c)
        for (int64_t i = 0; i < plane; ++i) {
          double sum = 0;
          for (int64_t j = std::max<int64_t>(0, c - half); j <= std::min(s.c - 1, c + half); ++j) {
            const double v = x[(b * s.c + j) * plane + i];
            sum += v * v;
          }
          const int64_t at = (b * s.c + c) * plane + i;
          st.denom[at] = n.lrn.k + scale * sum;
          st.y[at] = static_cast<float>(x[at] * std::pow(st.denom[at], -n.lrn.beta));
        }
  }

  // dx_j = dy_j d_j^-beta - 2 beta alpha / size * x_j * sum_{|c - j| <= size/2} dy_c x_c
  // d_c^(-beta-1): the window is symmetric, so j is in c's window exactly when c is in j's.
  void lrn_backward(const Node& n, const NodeState& st) {
    if (!wants_dx(n)) return;
    const Chw s = chw(n.out);
    const int64_t plane = s.h * s.w, half = n.lrn.size / 2;
    const double beta = n.lrn.beta;
    const double scale = 2.0 * beta * n.lrn.alpha / static_cast<double>(n.lrn.size);
    const std::vector<float>& x = in_y(n);
    std::vector<float>& dx = in_dy(n);
    for (int64_t b = 0; b < batch_; ++b)
      for (int64_t j = 0; j < s.c; ++j)
        for (int64_t i = 0; i < plane; ++i) {
          double cross = 0;
          for (int64_t c = std::max<int64_t>(0, j - half); c <= std::min(s.c - 1, j + half); ++c) {
            const int64_t at = (b * s.c + c) * plane + i;
            cross += st.dy[at] * static_cast<double>(x[at]) * std::pow(st.denom[at], -beta - 1);
          }
          const int64_t at = (b * s.c + j) * plane + i;
          dx[at] +=
              static_cast<float>(st.dy[at] * std::pow(st.denom[at], -beta) - scale * x[at] * cross);
        }
  }

  // y[n,o,oh,ow] = b[o] + sum_{c,kh,kw} w[o,c,kh,kw] * x[n,c,oh*s-p+kh,ow*s-p+kw], zero outside.
  void conv_forward(const Node& n, std::vector<float>& y) const {
    const Chw in = chw(g_.node(n.inputs[0]).out);
    const Chw out = chw(n.out);
    const int64_t k = n.conv.kernel, st = n.conv.stride, p = n.conv.pad;
    const std::vector<float>& x = in_y(n);
    const float* w = param(n, 0);
    const float* b = n.conv.bias ? param(n, 1) : nullptr;
    for (int64_t s = 0; s < batch_; ++s)
      for (int64_t o = 0; o < out.c; ++o)
        for (int64_t oh = 0; oh < out.h; ++oh)
          for (int64_t ow = 0; ow < out.w; ++ow) {
            double acc = b ? b[o] : 0.0;
            for (int64_t c = 0; c < in.c; ++c)
              for (int64_t kh = 0; kh < k; ++kh) {
                const int64_t ih = oh * st - p + kh;
                if (ih < 0 || ih >= in.h) continue;
                for (int64_t kw = 0; kw < k; ++kw) {
                  const int64_t iw = ow * st - p + kw;
                  if (iw < 0 || iw >= in.w) continue;
                  acc += static_cast<double>(w[((o * in.c + c) * k + kh) * k + kw]) *
                         x[((s * in.c + c) * in.h + ih) * in.w + iw];
                }
              }
            y[((s * out.c + o) * out.h + oh) * out.w + ow] = static_cast<float>(acc);
          }
  }

  void conv_backward(const Node& n, const std::vector<float>& dy) {
    const Chw in = chw(g_.node(n.inputs[0]).out);
    const Chw out = chw(n.out);
    const int64_t k = n.conv.kernel, st = n.conv.stride, p = n.conv.pad;
    const std::vector<float>& x = in_y(n);
    const float* w = param(n, 0);
    auto dy_at = [&](int64_t s, int64_t o, int64_t oh, int64_t ow) {
      return static_cast<double>(dy[((s * out.c + o) * out.h + oh) * out.w + ow]);
    };
    float* dw = grad(n, 0);
    for (int64_t o = 0; o < out.c; ++o)
      for (int64_t c = 0; c < in.c; ++c)
        for (int64_t kh = 0; kh < k; ++kh)
          for (int64_t kw = 0; kw < k; ++kw) {
            double acc = 0;
            for (int64_t s = 0; s < batch_; ++s)
              for (int64_t oh = 0; oh < out.h; ++oh) {
                const int64_t ih = oh * st - p + kh;
                if (ih < 0 || ih >= in.h) continue;
                for (int64_t ow = 0; ow < out.w; ++ow) {
                  const int64_t iw = ow * st - p + kw;
                  if (iw < 0 || iw >= in.w) continue;
                  acc += dy_at(s, o, oh, ow) * x[((s * in.c + c) * in.h + ih) * in.w + iw];
                }
              }
            dw[((o * in.c + c) * k + kh) * k + kw] = static_cast<float>(acc);
          }
    if (n.conv.bias) {
      float* db = grad(n, 1);
      for (int64_t o = 0; o < out.c; ++o) {
        double acc = 0;
        for (int64_t s = 0; s < batch_; ++s)
          for (int64_t i = 0; i < out.h * out.w; ++i)
            acc += dy[(s * out.c + o) * out.h * out.w + i];
        db[o] = static_cast<float>(acc);
      }
    }
    if (!wants_dx(n)) return;
    // Gather form: input pixel ih is touched by output oh through tap kh when ih = oh*s - p + kh.
    std::vector<float>& dx = in_dy(n);
    for (int64_t s = 0; s < batch_; ++s)
      for (int64_t c = 0; c < in.c; ++c)
        for (int64_t ih = 0; ih < in.h; ++ih)
          for (int64_t iw = 0; iw < in.w; ++iw) {
            double acc = 0;
            for (int64_t o = 0; o < out.c; ++o)
              for (int64_t kh = 0; kh < k; ++kh) {
                const int64_t th = ih + p - kh;
                if (th < 0 || th % st != 0 || th / st >= out.h) continue;
                for (int64_t kw = 0; kw < k; ++kw) {
                  const int64_t tw = iw + p - kw;
                  if (tw < 0 || tw % st != 0 || tw / st >= out.w) continue;
                  acc += dy_at(s, o, th / st, tw / st) * w[((o * in.c + c) * k + kh) * k + kw];
                }
              }
            dx[((s * in.c + c) * in.h + ih) * in.w + iw] += static_cast<float>(acc);
          }
  }

  void batch_norm_forward(const Node& n, NodeState& st, bool train) {
    const Chw s = chw(n.out);
    const int64_t plane = s.h * s.w;
    const int64_t count = batch_ * plane;  // values per channel
    const std::vector<float>& x = in_y(n);
    const float* gamma = param(n, 0);
    const float* beta = param(n, 1);
    float* running_mean = buffer(n, 0);
    float* running_var = buffer(n, 1);
    if (train && count < 2)
      throw std::invalid_argument(n.name +
                                  ": training batch norm needs more than one value per channel");
    for (int64_t c = 0; c < s.c; ++c) {
      double mean, var;
      if (train) {
        double sum = 0;
        for (int64_t b = 0; b < batch_; ++b)
          for (int64_t i = 0; i < plane; ++i) sum += x[(b * s.c + c) * plane + i];
        mean = sum / static_cast<double>(count);
        double sq = 0;
        for (int64_t b = 0; b < batch_; ++b)
          for (int64_t i = 0; i < plane; ++i) {
            const double d = x[(b * s.c + c) * plane + i] - mean;
            sq += d * d;
          }
        var = sq / static_cast<double>(count);  // biased: what normalisation uses
        const double m = n.bn.momentum;
        const double unbiased = sq / static_cast<double>(count - 1);  // what running stats track
        running_mean[c] = static_cast<float>((1.0 - m) * running_mean[c] + m * mean);
        running_var[c] = static_cast<float>((1.0 - m) * running_var[c] + m * unbiased);
      } else {
        mean = running_mean[c];
        var = running_var[c];
      }
      const double inv_std = 1.0 / std::sqrt(var + static_cast<double>(n.bn.eps));
      st.mean[c] = static_cast<float>(mean);
      st.inv_std[c] = static_cast<float>(inv_std);
      for (int64_t b = 0; b < batch_; ++b)
        for (int64_t i = 0; i < plane; ++i) {
          const int64_t at = (b * s.c + c) * plane + i;
          st.y[at] = static_cast<float>(gamma[c] * (x[at] - mean) * inv_std + beta[c]);
        }
    }
  }

  // With xhat = (x - mean) * inv_std and M values per channel:
  // dx = gamma * inv_std / M * (M * dy - sum(dy) - xhat * sum(dy * xhat)).
  void batch_norm_backward(const Node& n, const NodeState& st) {
    const Chw s = chw(n.out);
    const int64_t plane = s.h * s.w;
    const double count = static_cast<double>(batch_ * plane);
    const std::vector<float>& x = in_y(n);
    const std::vector<float>& dy = st.dy;
    const float* gamma = param(n, 0);
    float* dgamma = grad(n, 0);
    float* dbeta = grad(n, 1);
    const bool dx_needed = wants_dx(n);
    std::vector<float>* dx = dx_needed ? &in_dy(n) : nullptr;
    for (int64_t c = 0; c < s.c; ++c) {
      const double mean = st.mean[c], inv_std = st.inv_std[c];
      double sum_dy = 0, sum_dy_xhat = 0;
      for (int64_t b = 0; b < batch_; ++b)
        for (int64_t i = 0; i < plane; ++i) {
          const int64_t at = (b * s.c + c) * plane + i;
          sum_dy += dy[at];
          sum_dy_xhat += dy[at] * (x[at] - mean) * inv_std;
        }
      dgamma[c] = static_cast<float>(sum_dy_xhat);
      dbeta[c] = static_cast<float>(sum_dy);
      if (!dx_needed) continue;
      const double scale = gamma[c] * inv_std / count;
      for (int64_t b = 0; b < batch_; ++b)
        for (int64_t i = 0; i < plane; ++i) {
          const int64_t at = (b * s.c + c) * plane + i;
          const double xhat = (x[at] - mean) * inv_std;
          (*dx)[at] += static_cast<float>(scale * (count * dy[at] - sum_dy - xhat * sum_dy_xhat));
        }
    }
  }

  // Padded positions never win (they act as -inf), nor do positions past the input that ceil mode
  // adds; ties go to the first in scan order and a NaN always wins (the last NaN, if several),
  // which is what PyTorch's CPU kernel does.
  void max_pool_forward(const Node& n, NodeState& st) const {
    const Chw in = chw(g_.node(n.inputs[0]).out);
    const Chw out = chw(n.out);
    const int64_t k = n.pool.kernel, sd = n.pool.stride, p = n.pool.pad;
    const std::vector<float>& x = in_y(n);
    for (int64_t plane = 0; plane < batch_ * out.c; ++plane)
      for (int64_t oh = 0; oh < out.h; ++oh)
        for (int64_t ow = 0; ow < out.w; ++ow) {
          float best = -std::numeric_limits<float>::infinity();
          int64_t best_at = -1;
          for (int64_t kh = 0; kh < k; ++kh) {
            const int64_t ih = oh * sd - p + kh;
            if (ih < 0 || ih >= in.h) continue;
            for (int64_t kw = 0; kw < k; ++kw) {
              const int64_t iw = ow * sd - p + kw;
              if (iw < 0 || iw >= in.w) continue;
              const float v = x[plane * in.h * in.w + ih * in.w + iw];
              if (best_at < 0 || v > best || std::isnan(v)) {
                best = v;
                best_at = ih * in.w + iw;
              }
            }
          }
          if (best_at < 0) throw std::logic_error(n.name + ": pooling window lies in the padding");
          const int64_t o = (plane * out.h + oh) * out.w + ow;
          st.y[o] = best;
          st.argmax[o] = best_at;
        }
  }

  // count_include_pad: the divisor is always kernel^2. In floor mode no window reaches past the
  // padding, so that matches PyTorch's default exactly.
  void avg_pool_forward(const Node& n, std::vector<float>& y) const {
    const Chw in = chw(g_.node(n.inputs[0]).out);
    const Chw out = chw(n.out);
    const int64_t k = n.pool.kernel, sd = n.pool.stride, p = n.pool.pad;
    const std::vector<float>& x = in_y(n);
    for (int64_t plane = 0; plane < batch_ * out.c; ++plane)
      for (int64_t oh = 0; oh < out.h; ++oh)
        for (int64_t ow = 0; ow < out.w; ++ow) {
          double sum = 0;
          for (int64_t kh = 0; kh < k; ++kh) {
            const int64_t ih = oh * sd - p + kh;
            if (ih < 0 || ih >= in.h) continue;
            for (int64_t kw = 0; kw < k; ++kw) {
              const int64_t iw = ow * sd - p + kw;
              if (iw < 0 || iw >= in.w) continue;
              sum += x[plane * in.h * in.w + ih * in.w + iw];
            }
          }
          y[(plane * out.h + oh) * out.w + ow] =
              static_cast<float>(sum / static_cast<double>(k * k));
        }
  }

  void avg_pool_backward(const Node& n, const std::vector<float>& dy) {
    if (!wants_dx(n)) return;
    const Chw in = chw(g_.node(n.inputs[0]).out);
    const Chw out = chw(n.out);
    const int64_t k = n.pool.kernel, sd = n.pool.stride, p = n.pool.pad;
    std::vector<float>& dx = in_dy(n);
    const float scale = 1.f / static_cast<float>(k * k);
    for (int64_t plane = 0; plane < batch_ * out.c; ++plane)
      for (int64_t oh = 0; oh < out.h; ++oh)
        for (int64_t ow = 0; ow < out.w; ++ow) {
          const float g = dy[(plane * out.h + oh) * out.w + ow] * scale;
          for (int64_t kh = 0; kh < k; ++kh) {
            const int64_t ih = oh * sd - p + kh;
            if (ih < 0 || ih >= in.h) continue;
            for (int64_t kw = 0; kw < k; ++kw) {
              const int64_t iw = ow * sd - p + kw;
              if (iw < 0 || iw >= in.w) continue;
              dx[plane * in.h * in.w + ih * in.w + iw] += g;
            }
          }
        }
  }

  // y = x W^T + b on the flattened input; W is {out, in}.
  void fc_forward(const Node& n, std::vector<float>& y) const {
    const int64_t in = numel(g_.node(n.inputs[0]).out);
    const int64_t out = n.fc.out_features;
    const std::vector<float>& x = in_y(n);
    const float* w = param(n, 0);
    const float* b = n.fc.bias ? param(n, 1) : nullptr;
    for (int64_t s = 0; s < batch_; ++s)
      for (int64_t o = 0; o < out; ++o) {
        double acc = b ? b[o] : 0.0;
        for (int64_t i = 0; i < in; ++i) acc += static_cast<double>(w[o * in + i]) * x[s * in + i];
        y[s * out + o] = static_cast<float>(acc);
      }
  }

  void fc_backward(const Node& n, const std::vector<float>& dy) {
    const int64_t in = numel(g_.node(n.inputs[0]).out);
    const int64_t out = n.fc.out_features;
    const std::vector<float>& x = in_y(n);
    const float* w = param(n, 0);
    float* dw = grad(n, 0);
    for (int64_t o = 0; o < out; ++o)
      for (int64_t i = 0; i < in; ++i) {
        double acc = 0;
        for (int64_t s = 0; s < batch_; ++s)
          acc += static_cast<double>(dy[s * out + o]) * x[s * in + i];
        dw[o * in + i] = static_cast<float>(acc);
      }
    if (n.fc.bias) {
      float* db = grad(n, 1);
      for (int64_t o = 0; o < out; ++o) {
        double acc = 0;
        for (int64_t s = 0; s < batch_; ++s) acc += dy[s * out + o];
        db[o] = static_cast<float>(acc);
      }
    }
    if (!wants_dx(n)) return;
    std::vector<float>& dx = in_dy(n);
    for (int64_t s = 0; s < batch_; ++s)
      for (int64_t i = 0; i < in; ++i) {
        double acc = 0;
        for (int64_t o = 0; o < out; ++o)
          acc += static_cast<double>(dy[s * out + o]) * w[o * in + i];
        dx[s * in + i] += static_cast<float>(acc);
      }
  }

  const Graph g_;  // a copy, so the caller's graph may go away before the executor
  ParamStore& store_;
  std::vector<NodeState> state_;
  std::vector<int> order_;                 // backward visit order: node ids, last first
  std::vector<std::vector<int>> fire_at_;  // buckets completed at each backward position
  std::vector<std::vector<int>> gate_at_;  // buckets first read at each node's forward
  bool trained_ = false;                   // the last forward was a training one
};

}  // namespace

std::unique_ptr<Executor> make_reference_executor(const Graph& g, int64_t batch, ParamStore& store,
                                                  const std::vector<Bucket>& buckets) {
  return std::make_unique<ReferenceExecutor>(g, batch, store, buckets);
}

}  // namespace gg::kernels
