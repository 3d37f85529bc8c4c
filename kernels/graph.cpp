#include "kernels/graph.hpp"

#include <algorithm>
#include <stdexcept>

namespace gg::kernels {

namespace {

// The counts of a graph (elements, parameters, FLOPs) in 64 bits: a count that does not fit
// throws std::overflow_error (not invalid_argument, which build_model reads as "input too
// small"), never wraps into a negative number (issue 31: "-2077294073.705 GFLOPs").
int64_t checked_mul(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r))
    throw std::overflow_error("a count of this graph exceeds 2^63 (" + std::to_string(a) + " x " +
                              std::to_string(b) + ")");
  return r;
}

int64_t checked_add(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r))
    throw std::overflow_error("a count of this graph exceeds 2^63 (" + std::to_string(a) + " + " +
                              std::to_string(b) + ")");
  return r;
}

}  // namespace

int64_t numel(const Dims& d) {
  int64_t n = 1;
  for (int64_t v : d)
    if (__builtin_mul_overflow(n, v, &n))
      throw std::overflow_error("dims " + to_string(d) + " hold more than 2^63 elements");
  return n;
}

Chw chw(const Dims& d, const char* who) {
  Chw s;
  s.c = d.empty() ? 1 : d[0];
  s.h = d.size() > 1 ? d[1] : 1;
  s.w = d.size() > 2 ? d[2] : 1;
  if (s.size() != numel(d))
    throw std::invalid_argument(std::string(who) + ": unsupported dims " + to_string(d));
  return s;
}

std::string to_string(const Dims& d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(d[i]);
  }
  s += ']';
  return s;
}

const char* op_name(Op op) {
  switch (op) {
    case Op::Input:
      return "input";
    case Op::Conv:
      return "conv";
    case Op::BatchNorm:
      return "batch_norm";
    case Op::Relu:
      return "relu";
    case Op::MaxPool:
      return "max_pool";
    case Op::AvgPool:
      return "avg_pool";
    case Op::GlobalAvgPool:
      return "global_avg_pool";
    case Op::FullyConnected:
      return "fully_connected";
    case Op::Add:
      return "add";
    case Op::Concat:
      return "concat";
    case Op::Dropout:
      return "dropout";
    case Op::Lrn:
      return "lrn";
  }
  return "?";
}

namespace {
// splitmix64's finaliser: a bijection of 64-bit words that mixes every input bit into every
// output bit.
uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
}  // namespace

float dropout_multiplier(const DropoutAttr& a, int node, uint64_t step, int64_t index) {
  uint64_t h = mix(a.seed + 0x9e3779b97f4a7c15ull);
  h = mix(h ^ static_cast<uint64_t>(node));
  h = mix(h ^ step);
  h = mix(h ^ static_cast<uint64_t>(index));
  const float u = static_cast<float>(h >> 40) * (1.f / 16777216.f);  // 24 bits: exact in float
  return u < a.p ? 0.f : 1.f / (1.f - a.p);
}

namespace {
int64_t window_out(int64_t in, int64_t k, int64_t s, int64_t p, const std::string& what) {
  if (k < 1 || s < 1 || p < 0)
    throw std::invalid_argument(what + ": invalid kernel/stride/padding");
  if (in > (int64_t{1} << 40) || p > (int64_t{1} << 40))
    throw std::overflow_error(what + ": input side " + std::to_string(in) + " too large");
  const int64_t out = (in + 2 * p - k) / s + 1;
  if (in + 2 * p < k || out < 1) throw std::invalid_argument(what + ": window larger than input");
  return out;
}

// PyTorch's pooling_output_shape: in ceil mode the size rounds up, unless the last window would
// then start beyond the input and its left padding; so a ceil-mode window may be larger than the
// padded input, as long as it overlaps it.
int64_t pool_out(int64_t in, const PoolAttr& a, const std::string& what) {
  if (!a.ceil_mode) return window_out(in, a.kernel, a.stride, a.pad, what);
  if (a.kernel < 1 || a.stride < 1 || a.pad < 0)
    throw std::invalid_argument(what + ": invalid kernel/stride/padding");
  if (in > (int64_t{1} << 40) || a.pad > (int64_t{1} << 40))
    throw std::overflow_error(what + ": input side " + std::to_string(in) + " too large");
  const int64_t span = in + 2 * a.pad - a.kernel + a.stride - 1;  // may be negative
  int64_t out = (span >= 0 ? span / a.stride : -((-span + a.stride - 1) / a.stride)) + 1;
  if (out >= 1 && (out - 1) * a.stride >= in + a.pad) --out;
  if (out < 1) throw std::invalid_argument(what + ": window larger than input");
  return out;
}

std::string name_or(const std::string& name, const char* prefix, size_t id) {
  return name.empty() ? prefix + std::to_string(id) : name;
}
}  // namespace

Graph::Graph(Dims input) {
  if (input.empty() || numel(input) <= 0)
    throw std::invalid_argument("graph input has no elements");
  Node n;
  n.op = Op::Input;
  n.name = "input";
  n.out = std::move(input);
  nodes_.push_back(std::move(n));
}

const Node& Graph::checked(int x) const {
  if (x < 0 || x >= static_cast<int>(nodes_.size()))
    throw std::invalid_argument("graph: tensor id " + std::to_string(x) + " does not exist");
  return nodes_[x];
}

int Graph::push(Node n) {
  nodes_.push_back(std::move(n));
  return static_cast<int>(nodes_.size()) - 1;
}

int Graph::add_param(int node, const std::string& name, Dims dims) {
  TensorSpec t{name, std::move(dims), param_count_, node};
  param_count_ = checked_add(param_count_, t.size());
  params_.push_back(std::move(t));
  return static_cast<int>(params_.size()) - 1;
}

int Graph::add_buffer(int node, const std::string& name, Dims dims) {
  TensorSpec t{name, std::move(dims), buffer_count_, node};
  buffer_count_ = checked_add(buffer_count_, t.size());
  buffers_.push_back(std::move(t));
  return static_cast<int>(buffers_.size()) - 1;
}

int Graph::conv(const std::string& name, int x, ConvAttr a) {
  const Dims in = checked(x).out;
  if (in.size() != 3) throw std::invalid_argument(name + ": convolution needs a {C,H,W} input");
  if (a.out_channels < 1) throw std::invalid_argument(name + ": out_channels must be >= 1");
  Node n;
  n.op = Op::Conv;
  n.name = name;
  n.inputs = {x};
  n.conv = a;
  n.out = {a.out_channels, window_out(in[1], a.kernel, a.stride, a.pad, name),
           window_out(in[2], a.kernel, a.stride, a.pad, name)};
  const int id = push(std::move(n));
  nodes_[id].params.push_back(
      add_param(id, name + ".weight", {a.out_channels, in[0], a.kernel, a.kernel}));
  if (a.bias) nodes_[id].params.push_back(add_param(id, name + ".bias", {a.out_channels}));
  return id;
}

int Graph::batch_norm(const std::string& name, int x, BatchNormAttr a) {
  const Dims in = checked(x).out;
  Node n;
  n.op = Op::BatchNorm;
  n.name = name;
  n.inputs = {x};
  n.bn = a;
  n.out = in;
  const int id = push(std::move(n));
  const int64_t c = in[0];
  nodes_[id].params = {add_param(id, name + ".weight", {c}), add_param(id, name + ".bias", {c})};
  nodes_[id].buffers = {add_buffer(id, name + ".running_mean", {c}),
                        add_buffer(id, name + ".running_var", {c})};
  return id;
}

int Graph::relu(int x) {
  Node n;
  n.op = Op::Relu;
  n.name = "relu" + std::to_string(nodes_.size());
  n.inputs = {x};
  n.out = checked(x).out;
  return push(std::move(n));
}

int Graph::max_pool(int x, PoolAttr a, const std::string& name) {
  const Dims in = checked(x).out;
  Node n;
  n.op = Op::MaxPool;
  n.name = name_or(name, "maxpool", nodes_.size());
  if (in.size() != 3) throw std::invalid_argument(n.name + ": pooling needs a {C,H,W} input");
  if (2 * a.pad > a.kernel)
    throw std::invalid_argument(n.name + ": padding exceeds half the kernel");
  n.inputs = {x};
  n.pool = a;
  n.out = {in[0], pool_out(in[1], a, n.name), pool_out(in[2], a, n.name)};
  return push(std::move(n));
}

int Graph::avg_pool(int x, PoolAttr a, const std::string& name) {
  // PyTorch shrinks the divisor of windows that reach past the padding in ceil mode; oneDNN's
  // include-padding average does not, so ceil mode is refused rather than computed two ways.
  if (a.ceil_mode) throw std::invalid_argument("avg_pool: ceil_mode is not supported");
  const int id = max_pool(x, a, name_or(name, "avgpool", nodes_.size()));
  nodes_[id].op = Op::AvgPool;
  return id;
}

int Graph::global_avg_pool(int x, const std::string& name) {
  const Dims in = checked(x).out;
  if (in.size() != 3) throw std::invalid_argument("global_avg_pool needs a {C,H,W} input");
  Node n;
  n.op = Op::GlobalAvgPool;
  n.name = name_or(name, "gap", nodes_.size());
  n.inputs = {x};
  n.out = {in[0], 1, 1};
  return push(std::move(n));
}

int Graph::fully_connected(const std::string& name, int x, FcAttr a) {
  const int64_t in = numel(checked(x).out);
  if (a.out_features < 1) throw std::invalid_argument(name + ": out_features must be >= 1");
  Node n;
  n.op = Op::FullyConnected;
  n.name = name;
  n.inputs = {x};
  n.fc = a;
  n.out = {a.out_features};
  const int id = push(std::move(n));
  nodes_[id].params.push_back(add_param(id, name + ".weight", {a.out_features, in}));
  if (a.bias) nodes_[id].params.push_back(add_param(id, name + ".bias", {a.out_features}));
  return id;
}

int Graph::add(int a, int b) {
  if (checked(a).out != checked(b).out)
    throw std::invalid_argument("add: shapes differ " + to_string(checked(a).out) + " vs " +
                                to_string(checked(b).out));
  Node n;
  n.op = Op::Add;
  n.name = "add" + std::to_string(nodes_.size());
  n.inputs = {a, b};
  n.out = checked(a).out;
  return push(std::move(n));
}

int Graph::concat(const std::vector<int>& xs, const std::string& name) {
  Node n;
  n.op = Op::Concat;
  n.name = name_or(name, "concat", nodes_.size());
  if (xs.size() < 2) throw std::invalid_argument(n.name + ": concat needs at least two inputs");
  int64_t channels = 0;
  for (int x : xs) {
    const Dims& d = checked(x).out;
    const Dims& first = checked(xs[0]).out;
    if (d.size() != 3 || first.size() != 3 || d[1] != first[1] || d[2] != first[2])
      throw std::invalid_argument(n.name + ": concat needs {C,H,W} inputs of one H,W, got " +
                                  to_string(first) + " and " + to_string(d));
    channels += d[0];
  }
  n.inputs = xs;
  n.out = checked(xs[0]).out;
  n.out[0] = channels;
  return push(std::move(n));
}

int Graph::dropout(int x, DropoutAttr a, const std::string& name) {
  Node n;
  n.op = Op::Dropout;
  n.name = name_or(name, "dropout", nodes_.size());
  if (!(a.p >= 0.f && a.p < 1.f))
    throw std::invalid_argument(n.name + ": dropout probability must be in [0, 1)");
  n.inputs = {x};
  n.dropout = a;
  n.out = checked(x).out;
  return push(std::move(n));
}

int Graph::lrn(int x, LrnAttr a, const std::string& name) {
  Node n;
  n.op = Op::Lrn;
  n.name = name_or(name, "lrn", nodes_.size());
  if (checked(x).out.size() != 3)
    throw std::invalid_argument(n.name + ": LRN needs a {C,H,W} input");
  if (a.size < 1 || a.size % 2 == 0)
    throw std::invalid_argument(n.name +
                                ": LRN size must be odd (oneDNN and PyTorch place even "
                                "windows differently)");
  if (!(a.k > 0.f) || !(a.alpha >= 0.f) || !(a.beta >= 0.f))
    throw std::invalid_argument(n.name + ": LRN needs k > 0, alpha >= 0 and beta >= 0");
  n.inputs = {x};
  n.lrn = a;
  n.out = checked(x).out;
  return push(std::move(n));
}

void Graph::set_output(int x) {
  if (checked(x).out.size() != 1) throw std::invalid_argument("graph output must be a {F} tensor");
  output_ = x;
}

int64_t Graph::classes() const {
  if (output_ < 0) throw std::logic_error("graph has no output");
  return nodes_[output_].out[0];
}

int64_t Graph::forward_macs() const {
  int64_t macs = 0;
  for (const Node& n : nodes_) {
    if (n.op == Op::Conv) {
      const int64_t cin = nodes_[n.inputs[0]].out[0];
      macs = checked_add(macs, checked_mul(checked_mul(numel(n.out), cin),
                                           checked_mul(n.conv.kernel, n.conv.kernel)));
    } else if (n.op == Op::FullyConnected) {
      macs = checked_add(macs, checked_mul(n.fc.out_features, numel(nodes_[n.inputs[0]].out)));
    }
  }
  return macs;
}

namespace {

// Sum over the outputs along one spatial axis of the kernel taps that land inside the input.
int64_t taps_inside(int64_t in, int64_t out, const ConvAttr& c) {
  int64_t taps = 0;
  for (int64_t o = 0; o < out; ++o) {
    const int64_t first = o * c.stride - c.pad;
    taps = checked_add(
        taps, std::max<int64_t>(0, std::min(first + c.kernel, in) - std::max<int64_t>(first, 0)));
  }
  return taps;
}

}  // namespace

int64_t Graph::useful_macs(const Node& n) const {
  if (n.op == Op::Conv) {
    const Dims& in = nodes_[n.inputs[0]].out;
    return checked_mul(
        checked_mul(n.out[0], in[0]),
        checked_mul(taps_inside(in[1], n.out[1], n.conv), taps_inside(in[2], n.out[2], n.conv)));
  }
  if (n.op == Op::FullyConnected)
    return checked_mul(n.fc.out_features, numel(nodes_[n.inputs[0]].out));
  return 0;
}

int64_t Graph::forward_useful_macs() const {
  int64_t macs = 0;
  for (const Node& n : nodes_) macs = checked_add(macs, useful_macs(n));
  return macs;
}

int64_t Graph::training_useful_macs() const {
  int64_t macs = 0;
  for (const Node& n : nodes_) {
    const bool reads_input = !n.inputs.empty() && nodes_[n.inputs[0]].op == Op::Input;
    macs = checked_add(macs, checked_mul(useful_macs(n), reads_input ? 2 : 3));
  }
  return macs;
}

int64_t Graph::flops(int id) const {
  const Node& n = checked(id);
  const int64_t out = numel(n.out);
  switch (n.op) {
    case Op::Input:
    case Op::Concat:
    case Op::Dropout:
      return 0;
    case Op::Conv: {
      const int64_t fan_in =
          checked_mul(nodes_[n.inputs[0]].out[0], checked_mul(n.conv.kernel, n.conv.kernel));
      return checked_mul(out, checked_add(checked_mul(2, fan_in), n.conv.bias ? 1 : 0));
    }
    case Op::FullyConnected:
      return checked_mul(
          out, checked_add(checked_mul(2, numel(nodes_[n.inputs[0]].out)), n.fc.bias ? 1 : 0));
    case Op::BatchNorm:
      return checked_mul(2, out);
    case Op::Relu:
    case Op::Add:
      return out;
    case Op::MaxPool:
    case Op::AvgPool:
      return checked_mul(out, checked_mul(n.pool.kernel, n.pool.kernel));
    case Op::GlobalAvgPool:
      return numel(nodes_[n.inputs[0]].out);
    case Op::Lrn:
      return checked_mul(out, checked_add(checked_mul(2, n.lrn.size), 3));
  }
  return 0;
}

int64_t Graph::forward_flops() const {
  int64_t total = 0;
  for (size_t id = 0; id < nodes_.size(); ++id)
    total = checked_add(total, flops(static_cast<int>(id)));
  return total;
}

std::vector<Bucket> make_buckets(const Graph& g, int64_t bucket_elements) {
  std::vector<Bucket> buckets;
  const auto& ps = g.params();
  int64_t end = g.param_count();
  for (int i = static_cast<int>(ps.size()) - 1; i >= 0; --i) {
    const int64_t begin = ps[i].offset;
    if (end - begin >= bucket_elements || i == 0) {
      buckets.push_back({begin, end});
      end = begin;
    }
  }
  return buckets;
}

}  // namespace gg::kernels
