#include "kernels/net.hpp"

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
      buckets_(make_buckets(graph_, bucket_elements)) {}

Tensor Net::param(const std::string& name) {
  const TensorSpec& t = find(graph_.params(), name);
  return Tensor::view(store_.params.data() + t.offset, t.dims);
}

Tensor Net::grad(const std::string& name) {
  const TensorSpec& t = find(graph_.params(), name);
  return Tensor::view(store_.grads.data() + t.offset, t.dims);
}

Tensor Net::buffer(const std::string& name) {
  const TensorSpec& t = find(graph_.buffers(), name);
  return Tensor::view(store_.buffers.data() + t.offset, t.dims);
}

void Net::share_grads(float* memory) {
  if (!executors_.empty()) throw std::logic_error("Net::share_grads after executors were compiled");
  store_.grads.adopt(memory);
}

Executor& Net::at_batch(int64_t batch) {
  auto it = executors_.find(batch);
  if (it == executors_.end())
    it = executors_.emplace(batch, compile(graph_, backend_, batch, store_, buckets_, precision_))
             .first;
  return *it->second;
}

}  // namespace gg::kernels
