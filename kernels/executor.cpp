#include "kernels/executor.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "kernels/onednn/onednn_executor.hpp"
#include "kernels/reference/reference_executor.hpp"
#ifdef GG_HAVE_CUDA
#include "kernels/cuda/cuda_executor.hpp"
#endif

namespace gg::kernels {

namespace {
// A name of `table` as its enum; std::invalid_argument naming `what` and the names otherwise.
template <typename E, size_t N>
E parse_name(const std::pair<E, std::string_view> (&table)[N], const std::string& name,
             const char* what) {
  std::string valid;
  for (size_t i = 0; i < N; ++i) {
    if (name == table[i].second) return table[i].first;
    valid.append(i == 0 ? "" : i + 1 == N ? " or " : ", ").append(table[i].second);
  }
  throw std::invalid_argument("unknown " + std::string(what) + " '" + name + "' (expected " +
                              valid + ")");
}
template <typename E, size_t N>
const char* name_in(const std::pair<E, std::string_view> (&table)[N], E e) {
  for (const auto& [v, n] : table)
    if (v == e) return n.data();  // the table's literals end in a NUL
  return "?";
}
}  // namespace

Backend parse_backend(const std::string& name) {
  const Backend b = parse_name(kBackendNames, name, "backend");
  if (b == Backend::Cuda && !cuda_built())
    throw std::invalid_argument(
        "backend 'cuda': this gossipgrad was built without CUDA (rebuild with GG_CUDA=ON where "
        "nvcc and cuDNN are installed)");
  return b;
}

const char* backend_name(Backend b) { return name_in(kBackendNames, b); }

bool cuda_built() {
#ifdef GG_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

void bind_device(Backend b, int local_rank) {
  if (b != Backend::Cuda) return;
#ifdef GG_HAVE_CUDA
  select_cuda_device(local_rank);
#else
  (void)local_rank;
  throw std::invalid_argument("backend 'cuda': this gossipgrad was built without CUDA");
#endif
}

Precision parse_precision(const std::string& name) {
  return parse_name(kPrecisionNames, name, "precision");
}

const char* precision_name(Precision p) { return name_in(kPrecisionNames, p); }

void FlatBuffer::adopt(float* memory) {
  if (memory == data_) return;
  std::copy(begin(), end(), memory);
  data_ = memory;
  decltype(own_)().swap(own_);
}

FlatBuffer& FlatBuffer::assign(const float* v, int64_t n) {
  if (n != size_)
    throw std::invalid_argument("FlatBuffer: assigning " + std::to_string(n) +
                                " values to a buffer of " + std::to_string(size_));
  if (v != data_) std::copy(v, v + n, data_);
  return *this;
}

void FlatBuffer::reallocate(int64_t n) {
  decltype(own_)(n, 0.f).swap(own_);
  data_ = own_.data();
  size_ = n;
}

ParamLayout native_param_layout(const Graph& g, Backend backend) {
  return backend == Backend::OneDnn ? onednn_param_layout(g) : ParamLayout{};
}

std::unique_ptr<Executor> compile(const Graph& g, Backend backend, int64_t batch, ParamStore& store,
                                  const std::vector<Bucket>& buckets, Precision precision,
                                  bool deterministic) {
  (void)deterministic;  // the CPU backends always are
  if (batch < 1) throw std::invalid_argument("batch must be >= 1");
  if (g.output() < 0) throw std::invalid_argument("graph has no output");
  if (backend != Backend::OneDnn && !store.layout.plain())
    throw std::invalid_argument(std::string("the ") + backend_name(backend) +
                                " backend reads parameters in the plain layout only");
  if (static_cast<int64_t>(store.params.size()) != g.param_count() ||
      static_cast<int64_t>(store.buffers.size()) != g.buffer_count())
    throw std::invalid_argument("parameter store does not match the graph");
  if (precision == Precision::Bf16 && backend == Backend::Reference)
    throw std::invalid_argument("bf16 precision needs the onednn or cuda backend");
  if (precision == Precision::Bf16 && backend == Backend::OneDnn && !bf16_supported())
    throw std::invalid_argument(
        "bf16 precision needs a CPU with AVX512_BF16 (or AMX); this one has neither: use fp32");
  switch (backend) {
    case Backend::Reference:
      return make_reference_executor(g, batch, store, buckets);
    case Backend::OneDnn:
      return make_onednn_executor(g, batch, store, buckets, precision);
    case Backend::Cuda:
#ifdef GG_HAVE_CUDA
    {
      CudaOptions o;
      o.deterministic = deterministic;
      return make_cuda_executor(g, batch, store, buckets, precision, o);
    }
#else
      throw std::invalid_argument("backend 'cuda': this gossipgrad was built without CUDA");
#endif
  }
  throw std::logic_error("unhandled backend");
}

namespace {
// Calls f with the position (pos_of_node) of the node of every parameter that overlaps `bucket`;
// `pass` names the pass in the error for a node it never visits.
template <class F>
void for_each_position(const Graph& g, const Bucket& bucket, const std::vector<int>& pos_of_node,
                       const char* pass, F f) {
  for (const TensorSpec& p : g.params()) {
    if (p.offset + p.size() <= bucket.begin || p.offset >= bucket.end) continue;
    if (pos_of_node[p.node] < 0)
      throw std::logic_error(std::string("parameter of a node ") + pass + " never visits");
    f(pos_of_node[p.node]);
  }
}
}  // namespace

std::vector<std::vector<int>> bucket_completion(const Graph& g, const std::vector<Bucket>& buckets,
                                                const std::vector<int>& order) {
  std::vector<std::vector<int>> at(order.size());
  std::vector<int> pos_of_node(g.nodes().size(), -1);
  for (size_t i = 0; i < order.size(); ++i) pos_of_node[order[i]] = static_cast<int>(i);
  int floor = 0;
  for (size_t b = 0; b < buckets.size(); ++b) {
    int last = 0;
    for_each_position(g, buckets[b], pos_of_node, "backward",
                      [&](int pos) { last = std::max(last, pos); });
    floor = std::max(floor, last);  // fire in bucket order even if a graph visits out of order
    at[floor].push_back(static_cast<int>(b));
  }
  return at;
}

std::vector<std::vector<int>> bucket_first_use(const Graph& g, const std::vector<Bucket>& buckets,
                                               const std::vector<int>& order) {
  std::vector<std::vector<int>> at(order.size());
  if (order.empty()) return at;
  std::vector<int> pos_of_node(g.nodes().size(), -1);
  for (size_t i = 0; i < order.size(); ++i)
    if (pos_of_node[order[i]] < 0) pos_of_node[order[i]] = static_cast<int>(i);
  for (size_t b = 0; b < buckets.size(); ++b) {
    int first = static_cast<int>(order.size()) - 1;
    for_each_position(g, buckets[b], pos_of_node, "forward",
                      [&](int pos) { first = std::min(first, pos); });
    at[first].push_back(static_cast<int>(b));
  }
  return at;
}

}  // namespace gg::kernels
