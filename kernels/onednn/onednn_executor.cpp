// The oneDNN executor (executor_impl.hpp): its construction, the dispatch over ops, the buffer,
// layout and gradient helpers every op's compile_* uses, and the step itself (forward, backward,
// the memory plan and the shared scratchpad). The ops' compile_* are in files of their own.
#include "kernels/onednn/onednn_executor.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <string>

#include "kernels/onednn/eltwise.hpp"
#include "kernels/onednn/executor_impl.hpp"

namespace gg::kernels {
namespace onednn_detail {

OneDnnExecutor::OneDnnExecutor(const Graph& g, int64_t batch, ParamStore& store,
                               const std::vector<Bucket>& buckets, Precision precision)
    : Executor(batch),
      g_(g),
      store_(store),
      eng_(dnnl::engine::kind::cpu, 0),
      strm_(eng_),
      act_(precision == Precision::Bf16 ? dt::bf16 : dt::f32) {
  attr_.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  const auto& nodes = g.nodes();
  values_.resize(nodes.size());
  bwd_.resize(nodes.size());
  nan_.assign(nodes.size(), 0);
  redo_.resize(nodes.size());
  for (const Node& n : nodes)
    for (int in : n.inputs) values_[in].consumers++;
  values_[g.output()].consumers++;  // the loss reads the logits too
  for (size_t id = 0; id < nodes.size(); ++id) {
    compile_node(static_cast<int>(id));
    fwd_node_.resize(fwd_.size(), static_cast<int>(id));
  }
  loss_edge_ = edge(g.output());  // where backward puts dlogits
  sum_edges();
  zero_unread_gradients();
  for (int id = static_cast<int>(nodes.size()) - 1; id >= 0; --id) order_.push_back(id);
  ready_at_ = bucket_completion(g, buckets, order_);
  const Value& out = values_[g.output()];
  if (out.md != memory::desc({batch, g.classes()}, dt::f32, tag::nc))
    throw std::logic_error("oneDNN: logits are not in a plain layout");
  share_scratchpad();
  fwd_node_.resize(fwd_.size(), fwd_node_.empty() ? 0 : fwd_node_.back());
  gate_positions(buckets);
  train_plan_ = plan(true);
  eval_plan_ = plan(false);
}

// Several consumers each write their own gradient; sum them before the producer's backward.
void OneDnnExecutor::sum_edges() {
  for (size_t id = 1; id < values_.size(); ++id) {
    Value& v = values_[id];
    if (v.edges.size() < 2) continue;
    if (v.relu_in_place && v.edges.size() == 2) {  // sum + ReLU backward, fused
      const memory y = v.mem, a = v.edges[0], b = v.edges[1], dx = diff_of(static_cast<int>(id));
      bwd_[id].clear();
      bwd_[id].push_back(
          Action{{}, {}, [y, a, b, dx]() { relu_backward_sum2(y, a, b, dx); }, {y, a, b, dx}});
      continue;
    }
    const memory dx = diff_of(static_cast<int>(id));
    if (api::type_of(v.md) == dt::f32) {  // sum_of: oneDNN's f32 sum (simple:any) took 1.5x longer
      const std::vector<memory> edges = v.edges;
      std::vector<memory> touched = edges;
      touched.push_back(dx);
      bwd_[id].insert(bwd_[id].begin(),
                      Action{{}, {}, [edges, dx]() { sum_of(edges, dx); }, std::move(touched)});
      continue;
    }
    std::vector<memory::desc> mds(v.edges.size(), v.md);
    const auto pd = api::sum(eng_, v.md, std::vector<float>(v.edges.size(), 1.f), mds, attr_);
    Args args{{DNNL_ARG_DST, dx}};
    for (size_t i = 0; i < v.edges.size(); ++i)
      args[DNNL_ARG_MULTIPLE_SRC + static_cast<int>(i)] = v.edges[i];
    bwd_[id].insert(bwd_[id].begin(), Action{dnnl::sum(pd), std::move(args), {}, {}});
  }
}

// A tensor that nothing reads and that is not the output gets a zero gradient, as in the
// reference; left unwritten, its producer's backward would read uninitialised memory.
void OneDnnExecutor::zero_unread_gradients() {
  for (size_t id = 1; id < values_.size(); ++id) {
    if (values_[id].consumers > 0 || static_cast<int>(id) == g_.output()) continue;
    const memory d = diff_of(static_cast<int>(id));
    bwd_[id].insert(
        bwd_[id].begin(),
        Action{
            {}, {}, [d]() { std::memset(d.get_data_handle(), 0, d.get_desc().get_size()); }, {d}});
  }
}

const float* OneDnnExecutor::forward(const float* x, bool train) {
  // An executor that only ever runs eval forwards holds only what they need; the first training
  // forward moves it to the training plan for good.
  if (train && bound_ != Bound::Train) bind(Bound::Train);
  if (!train && bound_ == Bound::None) bind(Bound::Eval);
  values_[0].mem.set_data_handle(const_cast<float*>(x));
  // The CPU stream runs primitives on this thread, in order: a node's span is its actions.
  using Clock = std::chrono::steady_clock;
  Clock::time_point begin{};
  for (size_t k = 0; k < fwd_.size(); ++k) {
    ForwardAction& f = fwd_[k];
    if (gate_)
      for (int b : gate_at_[k]) gate_(b);
    if ((f.when == When::Train && !train) || (f.when == When::Eval && train)) continue;
    if (f.only_if && !f.only_if()) continue;
    if (trace_ && begin == Clock::time_point{}) begin = Clock::now();
    run(f.a);
    if (trace_ && (k + 1 == fwd_.size() || fwd_node_[k + 1] != fwd_node_[k])) {
      trace_(fwd_node_[k], false, begin, Clock::now());
      begin = {};
    }
  }
  strm_.wait();
  trained_ = train;
  if (train) ++dropout_step_;
  return static_cast<const float*>(values_[g_.output()].mem.get_data_handle());
}

void OneDnnExecutor::backward(const float* dlogits, const BucketReady& ready) {
  if (!trained_) throw std::logic_error("backward needs a training forward first");
  std::memcpy(loss_edge_.get_data_handle(), dlogits, sizeof(float) * batch_ * g_.classes());
  for (size_t pos = 0; pos < order_.size(); ++pos) {
    const auto begin = std::chrono::steady_clock::now();
    for (Action& a : bwd_[order_[pos]]) run(a);
    if (trace_ && !bwd_[order_[pos]].empty())
      trace_(order_[pos], true, begin, std::chrono::steady_clock::now());
    if (ready && !ready_at_[pos].empty()) {  // an empty callback is allowed, as in reference
      strm_.wait();
      for (int b : ready_at_[pos]) ready(b);
    }
  }
  strm_.wait();
}

void OneDnnExecutor::run(Action& a) {
  if (a.host) {
    strm_.wait();
    a.host();
  } else {
    a.prim.execute(strm_, a.args);
  }
}

memory OneDnnExecutor::param_mem(int index, const memory::desc& md, bool grad) {
  const TensorSpec& p = g_.params()[index];
  float* base = grad ? store_.grads.data() : store_.params.data();
  return memory(md, eng_, base + p.offset);
}

memory OneDnnExecutor::buffer_mem(int index, const memory::desc& md) {
  return memory(md, eng_, store_.buffers.data() + g_.buffers()[index].offset);
}

// A buffer of the step, placed in the arena by the memory plan once every action is known.
memory OneDnnExecutor::fresh(const memory::desc& md) {
  memory m(md, eng_, DNNL_MEMORY_NONE);
  slot_of_[m.get()] = static_cast<int>(slots_.size());
  slots_.push_back({md.get_size(), {m}});
  return m;
}

// Another view (`md`, e.g. a channel slice) of the bytes of `of`, which fresh() made.
memory OneDnnExecutor::alias(const memory::desc& md, const memory& of) {
  memory m(md, eng_, DNNL_MEMORY_NONE);
  const int slot = slot_of_.at(of.get());
  slot_of_[m.get()] = slot;
  slots_[slot].views.push_back(m);
  return m;
}

// The buckets to gate before each forward action: at the first action of the node that first
// reads them (a weight reorder of that node included).
void OneDnnExecutor::gate_positions(const std::vector<Bucket>& buckets) {
  std::vector<int> order;
  std::vector<size_t> first_action;
  for (size_t k = 0; k < fwd_node_.size(); ++k)
    if (k == 0 || fwd_node_[k] != fwd_node_[k - 1]) {
      order.push_back(fwd_node_[k]);
      first_action.push_back(k);
    }
  const std::vector<std::vector<int>> at = bucket_first_use(g_, buckets, order);
  gate_at_.assign(fwd_.size(), {});
  for (size_t i = 0; i < at.size(); ++i)
    gate_at_[first_action[i]].insert(gate_at_[first_action[i]].end(), at[i].begin(), at[i].end());
}

dnnl::reorder OneDnnExecutor::reorder(const memory& from, const memory& to) {
  return dnnl::reorder(dnnl::reorder::primitive_desc(from, to, attr_));
}

// Makes `drop`, and every view of its bytes, use the bytes of `keep` (both from fresh()).
void OneDnnExecutor::merge(const memory& keep, const memory& drop) {
  const int k = slot_of_.at(keep.get()), d = slot_of_.at(drop.get());
  if (k == d) return;
  for (memory& m : slots_[d].views) {
    slot_of_[m.get()] = k;
    slots_[k].views.push_back(m);
  }
  slots_[d] = Slot{};
}

memory& OneDnnExecutor::diff_of(int t) {
  Value& v = values_[t];
  if (!v.diff) v.diff = fresh(v.md);
  return v.diff;
}

// Where consumer writes its gradient w.r.t. tensor t.
memory OneDnnExecutor::edge(int t) {
  Value& v = values_[t];
  if (v.consumers <= 1) return diff_of(t);
  v.edges.push_back(fresh(v.md));
  return v.edges.back();
}

// Makes tensor t available in layout `want` to node `n`: the tensor itself when layouts agree,
// else a reordered copy. `diff_src` receives where n's backward should write d(t) in `want`;
// if that is a private buffer, a reorder into t's gradient follows the node's backward.
memory OneDnnExecutor::conform(int t, const memory::desc& want, memory* diff_src,
                               std::vector<Action>* diff_tail) {
  Value& v = values_[t];
  const bool need_diff = t != 0 && diff_src != nullptr;
  if (v.md == want) {
    if (need_diff) *diff_src = edge(t);
    return v.mem;
  }
  memory copy = fresh(want);
  fwd_.push_back(
      {Action{reorder(v.mem, copy), {{DNNL_ARG_FROM, v.mem}, {DNNL_ARG_TO, copy}}, {}, {}},
       When::Always});
  if (need_diff) {
    memory private_diff = fresh(want);
    memory target = edge(t);
    *diff_src = private_diff;
    diff_tail->push_back(Action{reorder(private_diff, target),
                                {{DNNL_ARG_FROM, private_diff}, {DNNL_ARG_TO, target}},
                                {},
                                {}});
  }
  return copy;
}

// Parameters live in the flat buffer in the store's layout (ParamLayout): plain, or for
// convolution weights the 16 x 16 (AVX-512) or 8 x 8 (AVX2) blocks that the forward and
// backward-weights kernels read and write in place. A primitive that wants another layout gets a
// reordered copy refreshed each step (the weights change every step).
// Whether kernels may read or write `m` in place: its layout is `md` and, if that is a blocked
// layout (read with aligned vector loads), it starts on a cache line (an exchange's shared
// window, for one, may not).
bool OneDnnExecutor::usable(const memory& m, const memory::desc& md) {
  if (m.get_desc() != md) return false;
  return !api::inner_blocked(md) || reinterpret_cast<uintptr_t>(m.get_data_handle()) % 64 == 0;
}

// `m` in layout `want`: itself, or a private copy made by a reorder appended to `list`.
memory OneDnnExecutor::as(const memory& m, const memory::desc& want, std::vector<Action>& list) {
  if (usable(m, want)) return m;
  memory copy = fresh(want);
  list.push_back(Action{reorder(m, copy), {{DNNL_ARG_FROM, m}, {DNNL_ARG_TO, copy}}, {}, {}});
  return copy;
}

// Where to write a result that belongs in `target` but is produced in layout `have`: the
// target itself, or a private buffer reordered into it by an action appended to `after`.
memory OneDnnExecutor::into(const memory& target, const memory::desc& have,
                            std::vector<Action>& after) {
  if (usable(target, have)) return target;
  memory tmp = fresh(have);
  after.push_back(
      Action{reorder(tmp, target), {{DNNL_ARG_FROM, tmp}, {DNNL_ARG_TO, target}}, {}, {}});
  return tmp;
}

void OneDnnExecutor::push_fwd(dnnl::primitive p, Args args, When when) {
  fwd_.push_back({Action{std::move(p), std::move(args), {}, {}}, when});
}

void OneDnnExecutor::compile_node(int id) {
  const Node& n = g_.node(id);
  Value& out = values_[id];
  switch (n.op) {
    case Op::Input:
      out.md =
          memory::desc(batched(batch_, n.out), dt::f32, n.out.size() == 3 ? tag::nchw : tag::nc);
      out.mem = memory(out.md, eng_, nullptr);
      return;
    case Op::Conv:
      return compile_conv(id, n);
    case Op::FullyConnected:
      return compile_fc(id, n);
    case Op::BatchNorm:
      return compile_bn(id, n);
    case Op::Relu:
      return compile_relu(id, n);
    case Op::MaxPool:
    case Op::AvgPool:
    case Op::GlobalAvgPool:
      return compile_pool(id, n);
    case Op::Add:
      return compile_add(id, n);
    case Op::Concat:
      return compile_concat(id, n);
    case Op::Dropout:
      return compile_dropout(id, n);
    case Op::Lrn:
      return compile_lrn(id, n);
  }
}

// Whether a max pool reads tensor t, directly or through concats and dropouts.
bool OneDnnExecutor::feeds_max_pool(int t) const {
  for (size_t id = 0; id < g_.nodes().size(); ++id) {
    const Node& n = g_.node(static_cast<int>(id));
    if (std::find(n.inputs.begin(), n.inputs.end(), t) == n.inputs.end()) continue;
    if (n.op == Op::MaxPool) return true;
    if ((n.op == Op::Concat || n.op == Op::Dropout) && feeds_max_pool(static_cast<int>(id)))
      return true;
  }
  return false;
}

// The ReLU that reads tensor t (reader_is_relu(t)).
int OneDnnExecutor::reader_relu(int t) const {
  for (size_t id = 0; id < g_.nodes().size(); ++id) {
    const Node& n = g_.node(static_cast<int>(id));
    if (n.op == Op::Relu && n.inputs.size() == 1 && n.inputs[0] == t) return static_cast<int>(id);
  }
  throw std::logic_error("oneDNN: no ReLU reads this batch norm");
}

bool OneDnnExecutor::reader_is_relu(int t) const {
  for (const Node& n : g_.nodes())
    if (n.op == Op::Relu && n.inputs.size() == 1 && n.inputs[0] == t) return true;
  return false;
}

// Gives every primitive the one scratchpad, sized for the largest.
void OneDnnExecutor::share_scratchpad() {
  size_t most = 0;
  auto visit = [&](auto&& f) {
    for (ForwardAction& fa : fwd_) f(fa.a);
    for (std::vector<Action>& list : bwd_)
      for (Action& a : list) f(a);
  };
  auto need = [](const Action& a) -> size_t {
    if (a.host) return 0;
    return api::scratchpad_bytes(a.prim);
  };
  visit([&](Action& a) { most = std::max(most, need(a)); });
  if (most == 0) return;
  scratchpad_ = memory(memory::desc({static_cast<memory::dim>(most)}, dt::u8, tag::x), eng_);
  visit([&](Action& a) {
    if (need(a) > 0) a.args[DNNL_ARG_SCRATCHPAD] = scratchpad_;
  });
}

// Lifetimes of the slots over one step (forward actions, then backward nodes in order), or over
// an eval forward alone, and their places in one arena.
MemoryPlan OneDnnExecutor::plan(bool train) const {
  std::vector<Lifetime> life(slots_.size());
  for (size_t i = 0; i < slots_.size(); ++i) life[i] = {slots_[i].bytes, 1 << 30, -1};
  auto use = [&](const memory& m, int pos) {
    const auto it = slot_of_.find(m.get());
    if (it == slot_of_.end()) return;
    Lifetime& t = life[it->second];
    t.first = std::min(t.first, pos);
    t.last = std::max(t.last, pos);
  };
  auto use_all = [&](const Action& a, int pos) {
    for (const auto& [arg, m] : a.args) use(m, pos);
    for (const memory& m : a.touches) use(m, pos);
  };
  const int f = static_cast<int>(fwd_.size());
  for (int k = 0; k < f; ++k) use_all(fwd_[k].a, k);
  int end = f;
  if (train) {
    const std::vector<Lifetime> forward = life;
    for (size_t b = 0; b < order_.size(); ++b)
      for (const Action& a : bwd_[order_[b]]) use_all(a, f + static_cast<int>(b));
    use(loss_edge_, f);  // written before backward starts
    end = f + static_cast<int>(order_.size());
    // What backward reads of the forward stays until backward ends, so that backward may run
    // again on the same forward; dead activations and gradients share what is left.
    for (size_t i = 0; i < life.size(); ++i)
      if (forward[i].used() && life[i].last >= f) life[i].last = end;
  }
  use(values_[g_.output()].mem, end);  // the logits stay valid until the next forward
  return plan_memory(life);
}

void OneDnnExecutor::bind(Bound mode) {
  const MemoryPlan& p = mode == Bound::Train ? train_plan_ : eval_plan_;
  arena_.reset();
  arena_.reset(static_cast<char*>(std::aligned_alloc(4096, (p.total + 4095) / 4096 * 4096)));
  if (!arena_) throw std::bad_alloc();
  // Slots the mode never uses point at the arena's start, unread.
  for (size_t i = 0; i < slots_.size(); ++i)
    for (memory& m : slots_[i].views) m.set_data_handle(arena_.get() + p.offsets[i]);
  bound_ = mode;
}

}  // namespace onednn_detail

ParamLayout onednn_param_layout(const Graph& g) {
  return blocked_conv_layout(g, onednn_weight_block());
}

std::unique_ptr<Executor> make_onednn_executor(const Graph& g, int64_t batch, ParamStore& store,
                                               const std::vector<Bucket>& buckets,
                                               Precision precision) {
  try {
    return std::make_unique<onednn_detail::OneDnnExecutor>(g, batch, store, buckets, precision);
  } catch (const dnnl::error& e) {
    throw std::runtime_error(std::string("oneDNN could not build the network: ") + e.what());
  }
}

}  // namespace gg::kernels
