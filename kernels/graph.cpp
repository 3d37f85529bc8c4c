#include "kernels/graph.hpp"

#include <stdexcept>

namespace gg::kernels {

int64_t numel(const Dims& d) {
  int64_t n = 1;
  for (int64_t v : d) n *= v;
  return n;
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
  }
  return "?";
}

namespace {
int64_t window_out(int64_t in, int64_t k, int64_t s, int64_t p, const std::string& what) {
  if (k < 1 || s < 1 || p < 0)
    throw std::invalid_argument(what + ": invalid kernel/stride/padding");
  const int64_t out = (in + 2 * p - k) / s + 1;
  if (in + 2 * p < k || out < 1) throw std::invalid_argument(what + ": window larger than input");
  return out;
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
  param_count_ += t.size();
  params_.push_back(std::move(t));
  return static_cast<int>(params_.size()) - 1;
}

int Graph::add_buffer(int node, const std::string& name, Dims dims) {
  TensorSpec t{name, std::move(dims), buffer_count_, node};
  buffer_count_ += t.size();
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

int Graph::max_pool(int x, PoolAttr a) {
  const Dims in = checked(x).out;
  if (in.size() != 3) throw std::invalid_argument("max_pool needs a {C,H,W} input");
  if (2 * a.pad > a.kernel)
    throw std::invalid_argument("max_pool: padding exceeds half the kernel");
  Node n;
  n.op = Op::MaxPool;
  n.name = "maxpool" + std::to_string(nodes_.size());
  n.inputs = {x};
  n.pool = a;
  n.out = {in[0], window_out(in[1], a.kernel, a.stride, a.pad, n.name),
           window_out(in[2], a.kernel, a.stride, a.pad, n.name)};
  return push(std::move(n));
}

int Graph::avg_pool(int x, PoolAttr a) {
  const int id = max_pool(x, a);
  nodes_[id].op = Op::AvgPool;
  nodes_[id].name = "avgpool" + std::to_string(id);
  return id;
}

int Graph::global_avg_pool(int x) {
  const Dims in = checked(x).out;
  if (in.size() != 3) throw std::invalid_argument("global_avg_pool needs a {C,H,W} input");
  Node n;
  n.op = Op::GlobalAvgPool;
  n.name = "gap" + std::to_string(nodes_.size());
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
      macs += numel(n.out) * cin * n.conv.kernel * n.conv.kernel;
    } else if (n.op == Op::FullyConnected) {
      macs += n.fc.out_features * numel(nodes_[n.inputs[0]].out);
    }
  }
  return macs;
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
