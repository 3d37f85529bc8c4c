#include "kernels/net.hpp"

#include <stdexcept>
#include <string>

namespace gg::kernels {

namespace {
const TensorSpec& find(const std::vector<TensorSpec>& specs, const std::string& name) {
  for (const TensorSpec& t : specs)
    if (t.name == name) return t;
  throw std::out_of_range("the network has no tensor named '" + name + "'");
}
}  // namespace

Net::Net(Graph g, Backend backend, int64_t bucket_elements, Precision precision)
    : graph_(std::move(g)),
      backend_(backend),
      precision_(precision),
      store_(graph_),
      buckets_(make_buckets(graph_, bucket_elements)),
      bucket_elements_(bucket_elements) {}

namespace {
const TensorSpec& plain_param(const Graph& g, const ParamLayout& l, const std::string& name) {
  const TensorSpec& t = find(g.params(), name);
  const auto index = static_cast<int>(&t - g.params().data());
  if (l.block_of(index) != 0)
    throw std::logic_error("parameter '" + name + "' is kept in a blocked layout");
  return t;
}
}  // namespace

Tensor Net::param(const std::string& name) {
  const TensorSpec& t = plain_param(graph_, store_.layout, name);
  return Tensor::view(store_.params.data() + t.offset, t.dims);
}

Tensor Net::grad(const std::string& name) {
  const TensorSpec& t = plain_param(graph_, store_.layout, name);
  return Tensor::view(store_.grads.data() + t.offset, t.dims);
}

bool Net::use_native_layout() {
  if (!executors_.empty())
    throw std::logic_error("Net::use_native_layout after executors were compiled");
  native_ = true;
  if (!store_.layout.plain()) return true;
  ParamLayout l = native_param_layout(graph_, backend_);
  make_native(graph_, l, store_.params.data());
  make_native(graph_, l, store_.grads.data());
  store_.layout = std::move(l);
  return !store_.layout.plain();
}

std::vector<float> Net::plain(const float* v) const { return plain_copy(graph_, store_.layout, v); }

void Net::from_plain(const std::vector<float>& plain, float* v) const {
  if (static_cast<int64_t>(plain.size()) != graph_.param_count())
    throw std::invalid_argument("Net::from_plain: " + std::to_string(plain.size()) +
                                " values for " + std::to_string(graph_.param_count()) +
                                " parameters");
  to_layout(graph_, store_.layout, plain.data(), v);
}

std::vector<float> Net::from_plain(const std::vector<float>& plain) const {
  std::vector<float> v(plain.size());
  from_plain(plain, v.data());
  return v;
}

Tensor Net::buffer(const std::string& name) {
  const TensorSpec& t = find(graph_.buffers(), name);
  return Tensor::view(store_.buffers.data() + t.offset, t.dims);
}

void Net::share_grads(float* memory) {
  if (!executors_.empty()) throw std::logic_error("Net::share_grads after executors were compiled");
  store_.grads.adopt(memory);
}

void Net::rebuild(Graph g, std::vector<float> params, std::vector<float> buffers) {
  if (static_cast<int64_t>(params.size()) != g.param_count() ||
      static_cast<int64_t>(buffers.size()) != g.buffer_count())
    throw std::invalid_argument("Net::rebuild: buffers do not match the graph");
  executors_.clear();
  graph_ = std::move(g);
  store_.params.reallocate(graph_.param_count());
  store_.params = params;
  store_.buffers.reallocate(graph_.buffer_count());
  store_.buffers = buffers;
  store_.grads.reallocate(graph_.param_count());
  store_.layout = {};
  if (native_) use_native_layout();
  buckets_ = make_buckets(graph_, bucket_elements_);
}

Executor& Net::at_batch(int64_t batch) {
  auto it = executors_.find(batch);
  if (it == executors_.end())
    it = executors_
             .emplace(batch, compile(graph_, backend_, batch, store_, buckets_, precision_,
                                     deterministic_))
             .first;
  return *it->second;
}

}  // namespace gg::kernels
