// A network built once: its graph, the flat parameter/gradient/statistics buffers, the gradient
// buckets, and one compiled executor per batch size it is run at. Layers hold views into the
// flat buffers, so the optimizer and the exchange engine see every parameter as one array.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "kernels/executor.hpp"
#include "kernels/graph.hpp"
#include "kernels/tensor.hpp"

namespace gg::kernels {

class Net {
 public:
  Net(Graph g, Backend backend, int64_t bucket_elements, Precision precision = Precision::Fp32);
  Net(const Net&) = delete;  // executors point into this object's buffers
  Net& operator=(const Net&) = delete;

  const Graph& graph() const { return graph_; }
  ParamStore& store() { return store_; }
  const std::vector<Bucket>& buckets() const { return buckets_; }
  Backend backend() const { return backend_; }
  Precision precision() const { return precision_; }

  // Views into the flat buffers by torchvision name ("layer1.0.conv1.weight"). A parameter kept
  // in a blocked layout (use_native_layout) has no plain view: std::logic_error.
  Tensor param(const std::string& name);
  Tensor grad(const std::string& name);
  Tensor buffer(const std::string& name);

  // Keeps the parameters, gradients and everything updated with them in the layout the backend
  // reads without reorders (native_param_layout; plain for most backends), from now on and
  // across rebuild(): what leaves or enters the run goes through plain()/from_plain(). Before the
  // first at_batch() only. Returns whether the layout is other than plain.
  bool use_native_layout();
  const ParamLayout& layout() const { return store_.layout; }
  // A parameter-sized buffer (parameters, gradients, momentum) from the store's layout to plain,
  // and back.
  std::vector<float> plain(const float* v) const;
  void from_plain(const std::vector<float>& plain, float* v) const;
  std::vector<float> from_plain(const std::vector<float>& plain) const;

  // Moves the gradient buffer into `memory` (param_count floats that outlive the Net), e.g. a
  // window the exchange engine shares with partners on this node. Only before the first
  // at_batch(): compiled executors hold pointers into the old buffer.
  void share_grads(float* memory);

  // Replaces the network by another graph (a shrunk one: kernels/apoptosis.hpp) with these
  // parameters (plain layout) and running statistics. Executors are dropped (references to them are
  // stale), gradients live in private zeroed memory again (share_grads may be called anew) and the
  // buckets are recomputed at the same size.
  void rebuild(Graph g, std::vector<float> params, std::vector<float> buffers);

  // The executor for this batch size, compiled on first use.
  Executor& at_batch(int64_t batch);
  // Executors compiled from now on compute the same bits every run (compile's deterministic).
  void set_deterministic(bool d) { deterministic_ = d; }

 private:
  Graph graph_;
  Backend backend_;
  Precision precision_;
  ParamStore store_;
  std::vector<Bucket> buckets_;
  int64_t bucket_elements_;
  bool native_ = false;
  bool deterministic_ = false;
  std::map<int64_t, std::unique_ptr<Executor>> executors_;
};

}  // namespace gg::kernels
