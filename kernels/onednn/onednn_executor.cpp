#include "kernels/onednn/onednn_executor.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <oneapi/dnnl/dnnl.hpp>
#include <optional>
#include <stdexcept>
#include <unordered_map>
#include <utility>

#include "kernels/memory_plan.hpp"
#include "kernels/onednn/api.hpp"
#include "kernels/onednn/eltwise.hpp"
#include "kernels/onednn/max_pool.hpp"

namespace gg::kernels {
namespace {

using dnnl::memory;
using tag = memory::format_tag;
using dt = memory::data_type;
using Args = std::unordered_map<int, memory>;
namespace api = onednn;

// One unit of work in a step: a primitive with its arguments, or a small host function and the
// memories it touches (so that the memory plan sees its uses).
struct Action {
  dnnl::primitive prim;
  Args args;
  std::function<void()> host;
  std::vector<memory> touches;
};

enum class When { Always, Train, Eval };

struct ForwardAction {
  ForwardAction(Action action, When w = When::Always, std::function<bool()> condition = {})
      : a(std::move(action)), when(w), only_if(std::move(condition)) {}
  Action a;
  When when;
  std::function<bool()> only_if;  // a rare path: runs only when this says so
};

// What a tensor (the output of one node) looks like on this backend.
struct Value {
  memory::desc md;
  memory mem;
  memory diff;                // total gradient, in md
  std::vector<memory> edges;  // per-consumer gradients when there are several
  int consumers = 0;
  bool diff_in_place = false;  // its backward writes its input's gradient over its own
  bool relu_fused = false;     // a batch norm that applies the ReLU that reads it
  bool relu_in_place = false;  // the output of a ReLU that overwrote its input
  // An add whose only reader, a ReLU, computes it: the sum and the ReLU in one pass.
  std::vector<memory> add_terms;
};

memory::dims batched(int64_t n, const Dims& d) {
  memory::dims r{n};
  r.insert(r.end(), d.begin(), d.end());
  return r;
}

// PyTorch's layout of a batch of per-sample dims {C,H,W} or {F}.
memory::desc plain_md(int64_t n, const Dims& d) {
  return memory::desc(batched(n, d), dt::f32, d.size() == 3 ? tag::nchw : tag::nc);
}

class OneDnnExecutor final : public Executor {
 public:
  OneDnnExecutor(const Graph& g, int64_t batch, ParamStore& store,
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
    // Several consumers each write their own gradient; sum them before the producer's backward.
    for (size_t id = 1; id < nodes.size(); ++id) {
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
      if (api::type_of(v.md) ==
          dt::f32) {  // sum_of: oneDNN's f32 sum (simple:any) took 1.5x longer
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
    // A tensor that nothing reads and that is not the output gets a zero gradient, as in the
    // reference; left unwritten, its producer's backward would read uninitialised memory.
    for (size_t id = 1; id < nodes.size(); ++id) {
      if (values_[id].consumers > 0 || static_cast<int>(id) == g.output()) continue;
      const memory d = diff_of(static_cast<int>(id));
      bwd_[id].insert(
          bwd_[id].begin(),
          Action{{},
                 {},
                 [d]() { std::memset(d.get_data_handle(), 0, d.get_desc().get_size()); },
                 {d}});
    }
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

  const float* forward(const float* x, bool train) override {
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

  void backward(const float* dlogits, const BucketReady& ready) override {
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

 private:
  void run(Action& a) {
    if (a.host) {
      strm_.wait();
      a.host();
    } else {
      a.prim.execute(strm_, a.args);
    }
  }

  memory param_mem(int index, const memory::desc& md, bool grad) {
    const TensorSpec& p = g_.params()[index];
    float* base = grad ? store_.grads.data() : store_.params.data();
    return memory(md, eng_, base + p.offset);
  }
  memory buffer_mem(int index, const memory::desc& md) {
    return memory(md, eng_, store_.buffers.data() + g_.buffers()[index].offset);
  }

  // A buffer of the step, placed in the arena by the memory plan once every action is known.
  memory fresh(const memory::desc& md) {
    memory m(md, eng_, DNNL_MEMORY_NONE);
    slot_of_[m.get()] = static_cast<int>(slots_.size());
    slots_.push_back({md.get_size(), {m}});
    return m;
  }
  // Another view (`md`, e.g. a channel slice) of the bytes of `of`, which fresh() made.
  memory alias(const memory::desc& md, const memory& of) {
    memory m(md, eng_, DNNL_MEMORY_NONE);
    const int slot = slot_of_.at(of.get());
    slot_of_[m.get()] = slot;
    slots_[slot].views.push_back(m);
    return m;
  }
  // The buckets to gate before each forward action: at the first action of the node that first
  // reads them (a weight reorder of that node included).
  void gate_positions(const std::vector<Bucket>& buckets) {
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

  dnnl::reorder reorder(const memory& from, const memory& to) {
    return dnnl::reorder(dnnl::reorder::primitive_desc(from, to, attr_));
  }

  // Makes `drop`, and every view of its bytes, use the bytes of `keep` (both from fresh()).
  void merge(const memory& keep, const memory& drop) {
    const int k = slot_of_.at(keep.get()), d = slot_of_.at(drop.get());
    if (k == d) return;
    for (memory& m : slots_[d].views) {
      slot_of_[m.get()] = k;
      slots_[k].views.push_back(m);
    }
    slots_[d] = Slot{};
  }

  memory& diff_of(int t) {
    Value& v = values_[t];
    if (!v.diff) v.diff = fresh(v.md);
    return v.diff;
  }

  // Where consumer writes its gradient w.r.t. tensor t.
  memory edge(int t) {
    Value& v = values_[t];
    if (v.consumers <= 1) return diff_of(t);
    v.edges.push_back(fresh(v.md));
    return v.edges.back();
  }

  // Makes tensor t available in layout `want` to node `n`: the tensor itself when layouts agree,
  // else a reordered copy. `diff_src` receives where n's backward should write d(t) in `want`;
  // if that is a private buffer, a reorder into t's gradient follows the node's backward.
  memory conform(int t, const memory::desc& want, memory* diff_src,
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
  static bool usable(const memory& m, const memory::desc& md) {
    if (m.get_desc() != md) return false;
    return !api::inner_blocked(md) || reinterpret_cast<uintptr_t>(m.get_data_handle()) % 64 == 0;
  }

  // `m` in layout `want`: itself, or a private copy made by a reorder appended to `list`.
  memory as(const memory& m, const memory::desc& want, std::vector<Action>& list) {
    if (usable(m, want)) return m;
    memory copy = fresh(want);
    list.push_back(Action{reorder(m, copy), {{DNNL_ARG_FROM, m}, {DNNL_ARG_TO, copy}}, {}, {}});
    return copy;
  }

  // Where to write a result that belongs in `target` but is produced in layout `have`: the
  // target itself, or a private buffer reordered into it by an action appended to `after`.
  memory into(const memory& target, const memory::desc& have, std::vector<Action>& after) {
    if (usable(target, have)) return target;
    memory tmp = fresh(have);
    after.push_back(
        Action{reorder(tmp, target), {{DNNL_ARG_FROM, tmp}, {DNNL_ARG_TO, target}}, {}, {}});
    return tmp;
  }

  void push_fwd(dnnl::primitive p, Args args, When when = When::Always) {
    fwd_.push_back({Action{std::move(p), std::move(args), {}, {}}, when});
  }

  void compile_node(int id) {
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

  // A convolution's primitive descriptor by Winograd where `prefer` and oneDNN has such a kernel
  // for it, else by `alg`.
  template <class Make>
  static auto prefer_winograd(dnnl::algorithm alg, bool prefer, Make make) {
    if (prefer) {
      try {
        return make(dnnl::algorithm::convolution_winograd);
      } catch (const dnnl::error&) {
      }
    }
    return make(alg);
  }

  void compile_conv(int id, const Node& n) {
    const int in = n.inputs[0];
    const Dims& xin = g_.node(in).out;
    const memory::dims src_dims = batched(batch_, xin), dst_dims = batched(batch_, n.out);
    const memory::dims w_dims{n.conv.out_channels, xin[0], n.conv.kernel, n.conv.kernel};
    const memory::dims strides{n.conv.stride, n.conv.stride}, pad{n.conv.pad, n.conv.pad};
    const memory::desc src_any(src_dims, act_, tag::any), dst_any(dst_dims, act_, tag::any);
    // The weights (and their gradients) as the flat buffers hold them: plain, or in 16 x 16 or
    // 8 x 8 blocks (ParamLayout), which is what the forward and backward-weights kernels want here.
    const int block = store_.layout.block_of(n.params[0]);
    const memory::desc w_any(w_dims, act_, tag::any),
        w_plain(w_dims, dt::f32,
                block == 16  ? tag::OIhw16i16o
                : block == 8 ? tag::OIhw8i8o
                : block == 0 ? tag::oihw
                             : throw std::invalid_argument("unsupported parameter layout"));
    const memory::desc dw_any(w_dims, dt::f32, tag::any);  // gradients stay fp32
    const memory::desc b_md =
        n.conv.bias ? memory::desc({n.conv.out_channels}, dt::f32, tag::x) : memory::desc();
    // 3x3 stride-1 fp32 convolutions may use Winograd where oneDNN judges it faster (ResNet-50 at
    // 224: about 10% off a training step; the oneDNN-vs-reference and torchvision tests hold),
    // except where winograd_pays says direct is faster in the step.
    const auto alg = n.conv.kernel == 3 && n.conv.stride == 1 && act_ == dt::f32 &&
                             onednn::winograd_pays(xin[0], n.out[0], n.out[1], n.out[2])
                         ? dnnl::algorithm::convolution_auto
                         : dnnl::algorithm::convolution_direct;

    const api::ConvFwd fpd =
        api::conv_fwd(eng_, alg, src_any, w_any, b_md, dst_any, strides, pad, pad, attr_);
    std::vector<Action> tail;
    memory diff_src;
    memory src = conform(in, fpd.src_desc(), in == 0 ? nullptr : &diff_src, &tail);
    std::vector<Action> pre;
    const memory w_user = param_mem(n.params[0], w_plain, false);
    const memory w = as(w_user, fpd.weights_desc(), pre);
    for (Action& a : pre) fwd_.push_back({std::move(a), When::Always});
    Value& out = values_[id];
    out.md = fpd.dst_desc();
    out.mem = fresh(out.md);
    Args fa{{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, w}, {DNNL_ARG_DST, out.mem}};
    if (n.conv.bias) fa[DNNL_ARG_BIAS] = param_mem(n.params[1], b_md, false);
    push_fwd(dnnl::convolution_forward(fpd), std::move(fa));

    std::vector<Action>& bwd = bwd_[id];
    // Backward picks its own layouts too; reorders bridge any difference from the forward's.
    // Where oneDNN picked Winograd for the forward, the backward passes use it too if they can
    // (oneDNN's own choice leaves backward-weights direct at 56x56 and 28x28 in ResNet-50, about
    // 3% of a step at 224 px; forcing Winograd on layers whose forward is direct gains nothing).
    const bool wino_fwd = std::string(fpd.impl_info_str()).find("wino") != std::string::npos;
    dnnl::convolution_backward_weights::primitive_desc wpd =
        prefer_winograd(alg, wino_fwd, [&](dnnl::algorithm a) {
          return api::conv_bwd_weights(eng_, a, src_any, dw_any, b_md, dst_any, strides, pad, pad,
                                       fpd, attr_);
        });
    const memory ddst_w = as(diff_of(id), wpd.diff_dst_desc(), bwd);
    const memory src_w = as(src, wpd.src_desc(), bwd);
    const memory dw_user = param_mem(n.params[0], w_plain, true);
    std::vector<Action> after_w;
    const memory dw = into(dw_user, wpd.diff_weights_desc(), after_w);
    Args wa{{DNNL_ARG_SRC, src_w}, {DNNL_ARG_DIFF_DST, ddst_w}, {DNNL_ARG_DIFF_WEIGHTS, dw}};
    if (n.conv.bias) wa[DNNL_ARG_DIFF_BIAS] = param_mem(n.params[1], b_md, true);
    bwd.push_back(Action{dnnl::convolution_backward_weights(wpd), std::move(wa), {}, {}});
    for (Action& a : after_w) bwd.push_back(std::move(a));
    if (in == 0) return;  // no gradient w.r.t. the data
    dnnl::convolution_backward_data::primitive_desc dpd =
        prefer_winograd(alg, wino_fwd, [&](dnnl::algorithm a) {
          return api::conv_bwd_data(eng_, a, src_any, w_any, dst_any, strides, pad, pad, fpd,
                                    attr_);
        });
    const memory ddst_d = as(ddst_w, dpd.diff_dst_desc(), bwd);
    const memory wd = dpd.weights_desc() == w.get_desc() ? w : as(w_user, dpd.weights_desc(), bwd);
    std::vector<Action> after_d;
    const memory dsrc = into(diff_src, dpd.diff_src_desc(), after_d);
    bwd.push_back(
        Action{dnnl::convolution_backward_data(dpd),
               {{DNNL_ARG_DIFF_DST, ddst_d}, {DNNL_ARG_WEIGHTS, wd}, {DNNL_ARG_DIFF_SRC, dsrc}},
               {},
               {}});
    for (Action& a : after_d) bwd.push_back(std::move(a));
    for (Action& a : tail) bwd.push_back(std::move(a));
  }

  // A fully connected layer's weights and their gradient stay in PyTorch's layout where oneDNN
  // runs the same implementation on it as on the layout it prefers: its gemm (AVX2), which asks
  // for a transposed copy, reads the plain weights as fast. The weights are then not reordered
  // into that copy before every step, nor their gradient back out of it after. Where the plain
  // layout would get another implementation (AVX-512's brgemm wants its own blocks), nothing
  // changes. fp32 only: bf16 runs convert anyway.
  template <class Pd, class Make>
  Pd prefer_plain(Pd preferred, Make plain) {
    if (act_ != dt::f32) return preferred;
    try {
      Pd candidate = plain();
      if (std::string(candidate.impl_info_str()) == preferred.impl_info_str() &&
          candidate.src_desc() == preferred.src_desc())
        return candidate;
    } catch (const dnnl::error&) {  // no implementation takes the plain layout
    }
    return preferred;
  }

  void compile_fc(int id, const Node& n) {
    const int in = n.inputs[0];
    const Dims& xin = g_.node(in).out;
    const int64_t o = n.fc.out_features;
    const memory::dims src_dims = batched(batch_, xin);
    memory::dims w_dims{o};
    w_dims.insert(w_dims.end(), xin.begin(), xin.end());
    const bool spatial = xin.size() == 3;
    const memory::desc src_any(src_dims, act_, tag::any), w_any(w_dims, act_, tag::any);
    const memory::desc w_plain(w_dims, dt::f32, spatial ? tag::oihw : tag::oi);
    const memory::desc dw_any(w_dims, dt::f32, tag::any);
    // The output is fp32 in either precision (the logits are); its gradient is taken in the
    // activations' type.
    const memory::desc dst_md({batch_, o}, dt::f32, tag::nc), ddst_md({batch_, o}, act_, tag::nc);
    const memory::desc b_md = n.fc.bias ? memory::desc({o}, dt::f32, tag::x) : memory::desc();

    const auto forward = [&](const memory::desc& w_md) {
      return api::ip_fwd(eng_, src_any, w_md, b_md, dst_md, attr_);
    };
    const dnnl::inner_product_forward::primitive_desc fpd =
        prefer_plain(forward(w_any), [&] { return forward(w_plain); });
    std::vector<Action> tail;
    memory diff_src;
    memory src = conform(in, fpd.src_desc(), in == 0 ? nullptr : &diff_src, &tail);
    std::vector<Action> pre;
    const memory w_user = param_mem(n.params[0], w_plain, false);
    const memory w = as(w_user, fpd.weights_desc(), pre);
    for (Action& a : pre) fwd_.push_back({std::move(a), When::Always});
    Value& out = values_[id];
    out.md = dst_md;
    out.mem = fresh(out.md);
    Args fa{{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, w}, {DNNL_ARG_DST, out.mem}};
    if (n.fc.bias) fa[DNNL_ARG_BIAS] = param_mem(n.params[1], b_md, false);
    push_fwd(dnnl::inner_product_forward(fpd), std::move(fa));

    std::vector<Action>& bwd = bwd_[id];
    const auto backward_weights = [&](const memory::desc& dw_md) {
      return api::ip_bwd_weights(eng_, src_any, dw_md, b_md, ddst_md, fpd, attr_);
    };
    const dnnl::inner_product_backward_weights::primitive_desc wpd =
        prefer_plain(backward_weights(dw_any), [&] { return backward_weights(w_plain); });
    const memory ddst_w = as(diff_of(id), wpd.diff_dst_desc(), bwd);
    const memory src_w = as(src, wpd.src_desc(), bwd);
    const memory dw_user = param_mem(n.params[0], w_plain, true);
    std::vector<Action> after_w;
    const memory dw = into(dw_user, wpd.diff_weights_desc(), after_w);
    Args wa{{DNNL_ARG_SRC, src_w}, {DNNL_ARG_DIFF_DST, ddst_w}, {DNNL_ARG_DIFF_WEIGHTS, dw}};
    if (n.fc.bias) wa[DNNL_ARG_DIFF_BIAS] = param_mem(n.params[1], b_md, true);
    bwd.push_back(Action{dnnl::inner_product_backward_weights(wpd), std::move(wa), {}, {}});
    for (Action& a : after_w) bwd.push_back(std::move(a));
    if (in == 0) return;
    const api::IpBwdD dpd = api::ip_bwd_data(eng_, src_any, w_any, ddst_md, fpd, attr_);
    const memory ddst_d = as(ddst_w, dpd.diff_dst_desc(), bwd);
    const memory wd = dpd.weights_desc() == w.get_desc() ? w : as(w_user, dpd.weights_desc(), bwd);
    std::vector<Action> after_d;
    const memory dsrc = into(diff_src, dpd.diff_src_desc(), after_d);
    bwd.push_back(
        Action{dnnl::inner_product_backward_data(dpd),
               {{DNNL_ARG_DIFF_DST, ddst_d}, {DNNL_ARG_WEIGHTS, wd}, {DNNL_ARG_DIFF_SRC, dsrc}},
               {},
               {}});
    for (Action& a : after_d) bwd.push_back(std::move(a));
    for (Action& a : tail) bwd.push_back(std::move(a));
  }

  // oneDNN's JIT batch norm does not take every layout: bf16 channels-last with a channel count
  // that is not a multiple of 16 (what AMX convolutions give narrow layers) falls to a scalar
  // implementation (30 steps of resnet8 at width 8: oneDNN's time 9.3 s with it, 1.0 s without;
  // bench/results/bf16-narrow-bn-xeon-vm.md). Such a batch norm runs on the 16-channel blocks
  // instead, with a reorder in and out.
  memory::desc bn_layout(const memory::desc& md, float eps, dnnl::normalization_flags flags) {
    const auto jit = [&](const memory::desc& d) {
      const api::BnFwd pd =
          api::bn_fwd(eng_, dnnl::prop_kind::forward_training, d, eps, flags, attr_);
      return std::string(pd.impl_info_str()).find("jit") != std::string::npos;
    };
    if (api::dims_of(md).size() != 4 || jit(md)) return md;
    const memory::desc blocked(api::dims_of(md), api::type_of(md), tag::nChw16c);
    return jit(blocked) ? blocked : md;
  }

  void compile_bn(int id, const Node& n) {
    const int in = n.inputs[0];
    const int64_t c = n.out[0];
    const memory::desc c_md({c}, dt::f32, tag::x);
    // A ReLU that is the only reader of this batch norm runs inside it (fuse_norm_relu): its
    // forward and backward passes over the tensor disappear; a bit mask (workspace) remembers
    // where it was active.
    const bool fuse = values_[id].consumers == 1 && reader_is_relu(id);
    const auto affine = dnnl::normalization_flags::use_scale | dnnl::normalization_flags::use_shift;
    auto flags = affine;
    if (fuse) flags |= dnnl::normalization_flags::fuse_norm_relu;
    const memory::desc md = in == 0 ? values_[in].md : bn_layout(values_[in].md, n.bn.eps, flags);
    memory diff_src;
    std::vector<Action> diff_tail;
    const memory src = in == 0 ? values_[in].mem : conform(in, md, &diff_src, &diff_tail);
    const api::BnFwd fpd =
        api::bn_fwd(eng_, dnnl::prop_kind::forward_training, md, n.bn.eps, flags, attr_);
    // Eval never fuses the ReLU: see the NaN rule below.
    const api::BnFwd ipd = api::bn_fwd(eng_, dnnl::prop_kind::forward_inference, md, n.bn.eps,
                                       affine | dnnl::normalization_flags::use_global_stats, attr_);
    Value& out = values_[id];
    out.md = fpd.dst_desc();
    out.mem = fresh(out.md);
    const memory scale = param_mem(n.params[0], c_md, false),
                 shift = param_mem(n.params[1], c_md, false);
    const memory mean = fresh(fpd.mean_desc()), var = fresh(fpd.variance_desc());
    out.relu_fused = fuse;
    Args fa{{DNNL_ARG_SRC, src},     {DNNL_ARG_DST, out.mem}, {DNNL_ARG_SCALE, scale},
            {DNNL_ARG_SHIFT, shift}, {DNNL_ARG_MEAN, mean},   {DNNL_ARG_VARIANCE, var}};
    const memory ws = fuse ? fresh(fpd.workspace_desc()) : memory();
    if (fuse) fa[DNNL_ARG_WORKSPACE] = ws;
    push_fwd(dnnl::batch_normalization_forward(fpd), std::move(fa), When::Train);
    const memory run_mean = buffer_mem(n.buffers[0], c_md),
                 run_var = buffer_mem(n.buffers[1], c_md);
    // oneDNN reports the biased batch variance; PyTorch's running_var tracks the unbiased one.
    const double m = static_cast<double>(batch_) * numel(n.out) / c;
    const float unbias = m > 1 ? static_cast<float>(m / (m - 1)) : 1.f;
    const float mom = n.bn.momentum;
    // NaN, as in PyTorch: relu(NaN) = NaN, but the fused ReLU gives 0. In training the batch's
    // statistics decide: with a finite mean, variance, scale and shift every input and output of
    // a channel is finite (a NaN or inf input makes its channel's mean or variance non-finite), so
    // the fused result is exact. Otherwise (rare: the run is going wrong) the output is computed
    // again without the fusion and with relu_keeping_nan. Backward keeps the fused mask, which
    // drops the gradient at NaN outputs where PyTorch passes it; the gradients are NaN there
    // anyway. Eval has no batch statistics to tell, so it runs batch norm and then
    // relu_keeping_nan, one more pass over the tensor, in eval only.
    fwd_.push_back({Action{{},
                           {},
                           [=, this]() {
                             const float* bm = static_cast<const float*>(mean.get_data_handle());
                             const float* bv = static_cast<const float*>(var.get_data_handle());
                             float* rm = static_cast<float*>(run_mean.get_data_handle());
                             float* rv = static_cast<float*>(run_var.get_data_handle());
                             for (int64_t i = 0; i < c; ++i) {
                               rm[i] = (1 - mom) * rm[i] + mom * bm[i];
                               rv[i] = (1 - mom) * rv[i] + mom * bv[i] * unbias;
                             }
                             if (fuse) nan_[id] = !all_finite({mean, var, scale, shift});
                           },
                           {mean, var}},
                    When::Train});
    if (fuse) {
      const api::BnFwd rpd =
          api::bn_fwd(eng_, dnnl::prop_kind::forward_training, md, n.bn.eps, affine);
      const Args ra{{DNNL_ARG_SRC, src},     {DNNL_ARG_DST, out.mem}, {DNNL_ARG_SCALE, scale},
                    {DNNL_ARG_SHIFT, shift}, {DNNL_ARG_MEAN, mean},   {DNNL_ARG_VARIANCE, var}};
      fwd_.push_back({Action{{},
                             {},
                             [this, id, rpd, ra, y = out.mem]() {
                               if (!redo_[id]) redo_[id] = dnnl::batch_normalization_forward(rpd);
                               redo_[id]->execute(strm_, ra);
                               strm_.wait();
                               nan_[id] = relu_keeping_nan(y, y, true);
                             },
                             {src, out.mem, mean, var}},
                      When::Train, [this, id]() { return nan_[id] != 0; }});
    }
    push_fwd(dnnl::batch_normalization_forward(ipd),
             {{DNNL_ARG_SRC, src},
              {DNNL_ARG_DST, out.mem},
              {DNNL_ARG_SCALE, scale},
              {DNNL_ARG_SHIFT, shift},
              {DNNL_ARG_MEAN, run_mean},
              {DNNL_ARG_VARIANCE, run_var}},
             When::Eval);
    if (fuse)
      fwd_.push_back({Action{{},
                             {},
                             [this, id, y = out.mem, report = feeds_max_pool(reader_relu(id))]() {
                               nan_[id] = relu_keeping_nan(y, y, report);
                             },
                             {out.mem}},
                      When::Eval});

    const api::BnBwd bpd = api::bn_bwd(eng_, out.md, md, n.bn.eps, flags, fpd, attr_);
    Args ba{{DNNL_ARG_SRC, src},
            {DNNL_ARG_MEAN, mean},
            {DNNL_ARG_VARIANCE, var},
            {DNNL_ARG_SCALE, scale},
            {DNNL_ARG_DIFF_DST, diff_of(id)},
            {DNNL_ARG_DIFF_SCALE, param_mem(n.params[0], c_md, true)},
            {DNNL_ARG_DIFF_SHIFT, param_mem(n.params[1], c_md, true)}};
    // 2.6's bf16 backward fails without the shift; 3.x refuses it (backward does not read it).
    if (!GG_ONEDNN3) ba[DNNL_ARG_SHIFT] = shift;
    if (fuse) ba[DNNL_ARG_WORKSPACE] = ws;
    ba[DNNL_ARG_DIFF_SRC] = in == 0 ? fresh(md) : diff_src;
    bwd_[id].push_back(Action{dnnl::batch_normalization_backward(bpd), std::move(ba), {}, {}});
    for (Action& a : diff_tail) bwd_[id].push_back(std::move(a));
  }

  // Whether the tensor of node t may hold a NaN in this forward, so far as the forward knows
  // without another pass: a ReLU's pass and a fused batch norm's statistics tell; a copy, a
  // dropout or a max pool holds one only if its inputs do; any other tensor may. Asked only of
  // the inputs of max pools: ReLUs that no max pool reads (feeds_max_pool) do not report.
  bool may_hold_nan(int t) const {
    const Node& n = g_.node(t);
    switch (n.op) {
      case Op::Relu:
        return values_[n.inputs[0]].relu_fused ? nan_[n.inputs[0]] != 0 : nan_[t] != 0;
      case Op::BatchNorm:
        return values_[t].relu_fused ? nan_[t] != 0 : true;
      case Op::Dropout:
      case Op::MaxPool:
        return may_hold_nan(n.inputs[0]);
      case Op::Concat:
        return std::any_of(n.inputs.begin(), n.inputs.end(),
                           [&](int in) { return may_hold_nan(in); });
      default:
        return true;
    }
  }

  // PyTorch's max pool gives NaN for a window that holds a NaN; oneDNN's never picks one. When
  // the input may hold a NaN (rare: the run is going wrong), the output is put right in plain
  // copies made here; backward keeps oneDNN's choice of maximum.
  void max_pool_nan(int id, memory src, memory dst) {
    const Node& n = g_.node(id);
    const Dims& xin = g_.node(n.inputs[0]).out;
    memory x(plain_md(batch_, xin), eng_), y(plain_md(batch_, n.out), eng_);
    dnnl::reorder(src, x).execute(strm_, src, x);
    dnnl::reorder(dst, y).execute(strm_, dst, y);
    strm_.wait();
    const float* xp = static_cast<const float*>(x.get_data_handle());
    float* yp = static_cast<float*>(y.get_data_handle());
    const int64_t k = n.pool.kernel, st = n.pool.stride, p = n.pool.pad;
    const int64_t ih = xin[1], iw = xin[2], oh = n.out[1], ow = n.out[2];
    bool any = false;
    for (int64_t plane = 0; plane < batch_ * n.out[0]; ++plane)
      for (int64_t r = 0; r < oh; ++r)
        for (int64_t c = 0; c < ow; ++c) {
          bool nan = false;
          for (int64_t a = std::max<int64_t>(0, r * st - p); a < std::min(ih, r * st - p + k); ++a)
            for (int64_t b = std::max<int64_t>(0, c * st - p); b < std::min(iw, c * st - p + k);
                 ++b)
              nan |= std::isnan(xp[(plane * ih + a) * iw + b]);
          if (nan) yp[(plane * oh + r) * ow + c] = std::numeric_limits<float>::quiet_NaN();
          any |= nan;
        }
    if (!any) return;
    dnnl::reorder(y, dst).execute(strm_, y, dst);
    strm_.wait();
  }

  static bool all_finite(std::initializer_list<memory> ms) {
    for (const memory& m : ms) {
      const float* v = static_cast<const float*>(m.get_data_handle());
      const size_t n = m.get_desc().get_size() / sizeof(float);
      for (size_t i = 0; i < n; ++i)
        if (!std::isfinite(v[i])) return false;
    }
    return true;
  }

  // Whether a max pool reads tensor t, directly or through concats and dropouts.
  bool feeds_max_pool(int t) const {
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
  int reader_relu(int t) const {
    for (size_t id = 0; id < g_.nodes().size(); ++id) {
      const Node& n = g_.node(static_cast<int>(id));
      if (n.op == Op::Relu && n.inputs.size() == 1 && n.inputs[0] == t) return static_cast<int>(id);
    }
    throw std::logic_error("oneDNN: no ReLU reads this batch norm");
  }

  bool reader_is_relu(int t) const {
    for (const Node& n : g_.nodes())
      if (n.op == Op::Relu && n.inputs.size() == 1 && n.inputs[0] == t) return true;
    return false;
  }

  void compile_relu(int id, const Node& n) {
    const int in = n.inputs[0];
    Value& src = values_[in];
    if (src.relu_fused) {  // the batch norm before it applied it already, forward and backward
      Value& out = values_[id];
      out.md = src.md;
      out.mem = src.mem;
      out.diff = diff_of(in);  // what the ReLU's readers write is what the batch norm reads
      return;
    }
    // In place when nothing else reads the input: backward then works from the output.
    const bool in_place = in != 0 && src.consumers == 1;
    const auto alg =
        in_place ? dnnl::algorithm::eltwise_relu_use_dst_for_bwd : dnnl::algorithm::eltwise_relu;
    const api::EltFwd fpd = api::eltwise_fwd(eng_, alg, src.md, 0.f, attr_);
    Value& out = values_[id];
    out.md = fpd.dst_desc();
    out.mem = in_place ? src.mem : fresh(out.md);
    if (in_place) {
      out.diff = diff_of(in);
      out.diff_in_place = true;
      out.relu_in_place = in != 0;
    }
    // Forward is relu_keeping_nan (oneDNN's maps NaN to 0); oneDNN's backward already passes
    // the gradient at a NaN, as PyTorch does.
    // An add that left its sum to this ReLU (compile_add) is computed here, in the same pass.
    const std::vector<memory> terms = src.add_terms;
    std::vector<memory> uses = terms.empty() ? std::vector<memory>{src.mem} : terms;
    uses.push_back(out.mem);
    fwd_.push_back(
        {Action{{},
                {},
                [this, id, terms, x = src.mem, y = out.mem, report = feeds_max_pool(id)]() {
                  nan_[id] = terms.empty() ? relu_keeping_nan(x, y, report)
                                           : add_relu_keeping_nan(terms[0], terms[1], y, report);
                },
                std::move(uses)},
         When::Always});
    if (in == 0) return;
    const api::EltBwd bpd = api::eltwise_bwd(eng_, alg, out.md, src.md, 0.f, fpd, attr_);
    Args ba{{DNNL_ARG_DIFF_DST, diff_of(id)},
            {DNNL_ARG_DIFF_SRC, in_place ? diff_of(in) : edge(in)}};
    ba[in_place ? DNNL_ARG_DST : DNNL_ARG_SRC] = in_place ? out.mem : src.mem;
    bwd_[id].push_back(Action{dnnl::eltwise_backward(bpd), std::move(ba), {}, {}});
  }

  void compile_pool(int id, const Node& n) {
    const int in = n.inputs[0];
    const Value& src = values_[in];
    const Dims& xin = g_.node(in).out;
    memory::dims kernel, strides, pad, pad_r;
    dnnl::algorithm alg;
    if (n.op == Op::GlobalAvgPool) {
      kernel = {xin[1], xin[2]};
      strides = kernel;
      pad = {0, 0};
      pad_r = pad;
      alg = dnnl::algorithm::pooling_avg_exclude_padding;
    } else {
      const int64_t k = n.pool.kernel, s = n.pool.stride, p = n.pool.pad;
      kernel = {k, k};
      strides = {s, s};
      pad = {p, p};
      // Ceil mode as right padding: enough for the last window. Max pool never picks padding, and
      // in floor mode this is the left padding again (avg pool, which counts padding, is floor).
      for (int d = 1; d <= 2; ++d)
        pad_r.push_back(std::max(p, (n.out[d] - 1) * s + k - xin[d] - p));
      alg = n.op == Op::MaxPool ? dnnl::algorithm::pooling_max
                                : dnnl::algorithm::pooling_avg_include_padding;
    }
    // Our own loops over f32 channel blocks (AVX2's 8, AVX-512's 16), where oneDNN 2.6's training
    // max pool is slow (kernels/onednn/max_pool.hpp has the figures).
    for (const auto& [t, block] : {std::pair{tag::nChw8c, 8}, std::pair{tag::nChw16c, 16}})
      if (n.op == Op::MaxPool && n.pool.kernel * n.pool.kernel < 255 &&
          src.md == memory::desc(batched(batch_, xin), dt::f32, t))
        return compile_blocked_max_pool(id, n, t, block);
    const memory::desc dst_any(batched(batch_, n.out), api::type_of(src.md), tag::any);
    const api::PoolFwd fpd =
        api::pool_fwd(eng_, alg, src.md, dst_any, strides, kernel, pad, pad_r, attr_);
    Value& out = values_[id];
    out.md = fpd.dst_desc();
    out.mem = fresh(out.md);
    Args fa{{DNNL_ARG_SRC, src.mem}, {DNNL_ARG_DST, out.mem}};
    memory ws;
    if (alg == dnnl::algorithm::pooling_max) {
      ws = fresh(fpd.workspace_desc());
      fa[DNNL_ARG_WORKSPACE] = ws;
    }
    push_fwd(dnnl::pooling_forward(fpd), std::move(fa));
    if (alg == dnnl::algorithm::pooling_max) push_max_pool_nan(id);
    if (in == 0) return;
    const api::PoolBwd bpd =
        api::pool_bwd(eng_, alg, src.md, out.md, strides, kernel, pad, pad_r, fpd, attr_);
    Args ba{{DNNL_ARG_DIFF_DST, diff_of(id)}, {DNNL_ARG_DIFF_SRC, edge(in)}};
    if (ws) ba[DNNL_ARG_WORKSPACE] = ws;
    bwd_[id].push_back(Action{dnnl::pooling_backward(bpd), std::move(ba), {}, {}});
  }

  // NaN in a max pool's window: see max_pool_nan (a rare path, only when the input may hold one).
  void push_max_pool_nan(int id) {
    const int in = g_.node(id).inputs[0];
    fwd_.push_back(
        {Action{{},
                {},
                [this, id, x = values_[in].mem, y = values_[id].mem]() { max_pool_nan(id, x, y); },
                {values_[in].mem, values_[id].mem}},
         When::Always, [this, in]() { return may_hold_nan(in); }});
  }

  // Max pooling of a channel-blocked f32 tensor by kernels/onednn/max_pool.hpp instead of
  // oneDNN's pooling (slow on AVX2 for training); the same layout out, the argmax in a byte per
  // output kept for backward.
  void compile_blocked_max_pool(int id, const Node& n, tag t, int block) {
    const int in = n.inputs[0];
    const Value& src = values_[in];
    const Dims& xin = g_.node(in).out;
    Value& out = values_[id];
    out.md = memory::desc(batched(batch_, n.out), dt::f32, t);
    out.mem = fresh(out.md);
    const BlockedPool s = blocked_pool(n, xin, batch_, block);
    const memory ws = fresh(memory::desc({s.n * s.blocks * s.oh * s.ow * block}, dt::u8, tag::x));
    fwd_.push_back({Action{{},
                           {},
                           [x = src.mem, y = out.mem, ws, s]() {
                             blocked_max_pool_forward(
                                 static_cast<const float*>(x.get_data_handle()),
                                 static_cast<float*>(y.get_data_handle()),
                                 static_cast<uint8_t*>(ws.get_data_handle()), s);
                           },
                           {src.mem, out.mem, ws}},
                    When::Always});
    push_max_pool_nan(id);
    if (in == 0) return;
    const memory dy = diff_of(id), dx = edge(in);
    bwd_[id].push_back(Action{{},
                              {},
                              [dy, dx, ws, s]() {
                                blocked_max_pool_backward(
                                    static_cast<const float*>(dy.get_data_handle()),
                                    static_cast<const uint8_t*>(ws.get_data_handle()),
                                    static_cast<float*>(dx.get_data_handle()), s);
                              },
                              {dy, dx, ws}});
  }

  void compile_add(int id, const Node& n) {
    const Value& a = values_[n.inputs[0]];
    const Value& b = values_[n.inputs[1]];
    Value& out = values_[id];
    if (a.md == b.md && out.consumers == 1 && reader_is_relu(id)) {
      out.md = a.md;  // the ReLU's forward adds: add_relu_keeping_nan
      out.mem = fresh(out.md);
      out.add_terms = {a.mem, b.mem};
    } else {
      const auto pd = api::sum(eng_, a.md, {1.f, 1.f}, {a.md, b.md}, attr_);
      out.md = pd.dst_desc();
      out.mem = fresh(out.md);
      push_fwd(dnnl::sum(pd), {{DNNL_ARG_MULTIPLE_SRC, a.mem},
                               {DNNL_ARG_MULTIPLE_SRC + 1, b.mem},
                               {DNNL_ARG_DST, out.mem}});
    }
    // d(a + b) passes the gradient unchanged to both inputs: an input in the same layout takes
    // the add's gradient itself (as its gradient, or as one of the edges its sum reads), unless
    // its own backward overwrites its gradient in place while the other input still needs it;
    // else a reorder copies it.
    for (int in : n.inputs) {
      if (in == 0) continue;
      Value& v = values_[in];
      if (v.md == out.md && v.consumers > 1) {
        v.edges.push_back(diff_of(id));
        continue;
      }
      if (v.md == out.md && !v.diff_in_place) {
        merge(diff_of(id), diff_of(in));
        continue;
      }
      memory target = edge(in);
      memory from = diff_of(id);
      bwd_[id].push_back(
          Action{reorder(from, target), {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, target}}, {}, {}});
    }
  }

  // Channel slice i of a tensor of layout `md` holding the concatenation of `n`'s inputs, or an
  // empty vector when the layout cannot be sliced there (a blocked layout whose block straddles
  // a boundary between inputs).
  std::vector<memory::desc> channel_slices(const memory::desc& md, const Node& n) const {
    std::vector<memory::desc> slices;
    memory::dim first = 0;
    for (int in : n.inputs) {
      const memory::dims dims = batched(batch_, g_.node(in).out);
      const std::optional<memory::desc> sub = api::submemory(md, dims, {0, first, 0, 0});
      if (!sub) return {};
      slices.push_back(*sub);
      first += dims[1];
    }
    return slices;
  }

  // The format tag all of n's inputs are laid out in, if they share one of the usual ones.
  std::optional<tag> common_tag(const Node& n) const {
    for (tag t : {tag::nChw16c, tag::nChw8c, tag::nhwc, tag::nchw}) {
      const bool all = std::all_of(n.inputs.begin(), n.inputs.end(), [&](int in) {
        const memory::desc& md = values_[in].md;
        return md == memory::desc(batched(batch_, g_.node(in).out), api::type_of(md), t);
      });
      if (all) return t;
    }
    return std::nullopt;
  }

  // Forward: one concat primitive, reading every input in its own layout. Backward: each input's
  // gradient is a reorder out of a view (submemory) of the concat's gradient, no copy in between.
  // The output keeps the inputs' common layout (so that consumers that want it need no reorder),
  // else takes oneDNN's choice, else NCHW: the first of these that can be sliced at every input.
  void compile_concat(int id, const Node& n) {
    std::vector<memory::desc> srcs;
    Args fa;
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      srcs.push_back(values_[n.inputs[i]].md);
      fa[DNNL_ARG_MULTIPLE_SRC + static_cast<int>(i)] = values_[n.inputs[i]].mem;
    }
    const memory::dims dims = batched(batch_, n.out);
    const dt type = api::type_of(srcs[0]);
    std::vector<memory::desc> candidates;
    if (const std::optional<tag> t = common_tag(n)) candidates.emplace_back(dims, type, *t);
    candidates.emplace_back(dims, type, tag::any);
    candidates.emplace_back(dims, type, tag::nchw);  // always sliceable
    dnnl::concat::primitive_desc pd;
    std::vector<memory::desc> slices;
    for (const memory::desc& dst : candidates) {
      pd = api::concat(eng_, dst, 1, srcs, attr_);
      slices = channel_slices(pd.dst_desc(), n);
      if (!slices.empty()) break;
    }
    if (slices.empty()) throw std::logic_error(n.name + ": NCHW concat cannot be sliced");
    Value& out = values_[id];
    out.md = pd.dst_desc();
    out.mem = fresh(out.md);
    fa[DNNL_ARG_DST] = out.mem;
    push_fwd(dnnl::concat(pd), std::move(fa));
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      if (n.inputs[i] == 0) continue;
      memory from = alias(slices[i], diff_of(id));
      memory target = edge(n.inputs[i]);
      bwd_[id].push_back(
          Action{reorder(from, target), {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, target}}, {}, {}});
    }
  }

  // Training: y = x * mask, the mask drawn on the host in NCHW order (dropout_multiplier, the
  // reference's draw) and reordered into x's layout; backward dx = dy * mask. In place over x when
  // nothing else reads it, as ReLU; then eval has nothing to do, else it copies.
  void compile_dropout(int id, const Node& n) {
    const int in = n.inputs[0];
    Value& src = values_[in];
    const bool in_place = in != 0 && src.consumers == 1;
    Value& out = values_[id];
    out.md = src.md;
    out.mem = in_place ? src.mem : fresh(out.md);
    if (in_place) {
      out.diff = diff_of(in);
      out.diff_in_place = true;
    }
    const memory::desc plain = plain_md(batch_, n.out);
    const memory mask_plain = fresh(plain);
    const DropoutAttr attr = n.dropout;
    fwd_.push_back({Action{{},
                           {},
                           [this, mask_plain, attr, id]() {
                             float* m = static_cast<float*>(mask_plain.get_data_handle());
                             const int64_t count =
                                 static_cast<int64_t>(mask_plain.get_desc().get_size() / 4);
                             for (int64_t i = 0; i < count; ++i)
                               m[i] = dropout_multiplier(attr, id, dropout_step_, i);
                           },
                           {mask_plain}},
                    When::Train});
    std::vector<Action> to_layout;
    const memory mask = as(mask_plain, out.md, to_layout);
    for (Action& a : to_layout) fwd_.push_back({std::move(a), When::Train});
    const auto mul = api::binary(eng_, dnnl::algorithm::binary_mul, out.md, out.md, out.md, attr_);
    push_fwd(dnnl::binary(mul),
             {{DNNL_ARG_SRC_0, src.mem}, {DNNL_ARG_SRC_1, mask}, {DNNL_ARG_DST, out.mem}},
             When::Train);
    if (!in_place)
      push_fwd(reorder(src.mem, out.mem), {{DNNL_ARG_FROM, src.mem}, {DNNL_ARG_TO, out.mem}},
               When::Eval);
    if (in == 0) return;
    bwd_[id].push_back(Action{dnnl::binary(mul),
                              {{DNNL_ARG_SRC_0, diff_of(id)},
                               {DNNL_ARG_SRC_1, mask},
                               {DNNL_ARG_DST, in_place ? diff_of(in) : edge(in)}},
                              {},
                              {}});
  }

  // oneDNN's LRN across channels on the input's own layout, its workspace kept for backward.
  void compile_lrn(int id, const Node& n) {
    const int in = n.inputs[0];
    const Value& src = values_[in];
    const auto alg = dnnl::algorithm::lrn_across_channels;
    const LrnAttr& a = n.lrn;
    const api::LrnFwd fpd = api::lrn_fwd(eng_, alg, src.md, a.size, a.alpha, a.beta, a.k, attr_);
    Value& out = values_[id];
    out.md = fpd.dst_desc();
    out.mem = fresh(out.md);
    Args fa{{DNNL_ARG_SRC, src.mem}, {DNNL_ARG_DST, out.mem}};
    memory ws;
    if (fpd.workspace_desc().get_size() > 0) {
      ws = fresh(fpd.workspace_desc());
      fa[DNNL_ARG_WORKSPACE] = ws;
    }
    push_fwd(dnnl::lrn_forward(fpd), std::move(fa));
    if (in == 0) return;
    const api::LrnBwd bpd =
        api::lrn_bwd(eng_, alg, src.md, out.md, a.size, a.alpha, a.beta, a.k, fpd, attr_);
    std::vector<Action>& bwd = bwd_[id];
    const memory ddst = as(diff_of(id), bpd.diff_dst_desc(), bwd);
    std::vector<Action> after;
    const memory dsrc = into(edge(in), bpd.diff_src_desc(), after);
    Args ba{{DNNL_ARG_SRC, src.mem}, {DNNL_ARG_DIFF_DST, ddst}, {DNNL_ARG_DIFF_SRC, dsrc}};
    if (ws) ba[DNNL_ARG_WORKSPACE] = ws;
    bwd.push_back(Action{dnnl::lrn_backward(bpd), std::move(ba), {}, {}});
    for (Action& x : after) bwd.push_back(std::move(x));
  }

  // Every buffer fresh() made, with the memories that view it.
  struct Slot {
    size_t bytes = 0;
    std::vector<memory> views;
  };
  enum class Bound { None, Eval, Train };

  // Gives every primitive the one scratchpad, sized for the largest.
  void share_scratchpad() {
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
  MemoryPlan plan(bool train) const {
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

  void bind(Bound mode) {
    const MemoryPlan& p = mode == Bound::Train ? train_plan_ : eval_plan_;
    arena_.reset();
    arena_.reset(static_cast<char*>(std::aligned_alloc(4096, (p.total + 4095) / 4096 * 4096)));
    if (!arena_) throw std::bad_alloc();
    // Slots the mode never uses point at the arena's start, unread.
    for (size_t i = 0; i < slots_.size(); ++i)
      for (memory& m : slots_[i].views) m.set_data_handle(arena_.get() + p.offsets[i]);
    bound_ = mode;
  }

  const Graph& g_;
  ParamStore& store_;
  dnnl::engine eng_;
  dnnl::stream strm_;
  dnnl::primitive_attr attr_;
  dt act_;  // activations and their gradients
  std::vector<Slot> slots_;
  std::unordered_map<dnnl_memory_t, int> slot_of_;
  MemoryPlan train_plan_, eval_plan_;
  struct Free {
    void operator()(char* p) const { std::free(p); }
  };
  std::unique_ptr<char, Free> arena_;
  Bound bound_ = Bound::None;
  memory scratchpad_;
  std::vector<Value> values_;
  std::vector<ForwardAction> fwd_;
  std::vector<int> fwd_node_;              // the node each forward action belongs to
  std::vector<std::vector<int>> gate_at_;  // buckets first read by each forward action
  std::vector<std::vector<Action>> bwd_;   // per node, run in reverse node order
  std::vector<int> order_;
  std::vector<std::vector<int>> ready_at_;
  memory loss_edge_;
  bool trained_ = false;
  std::vector<uint8_t> nan_;  // per node: its tensor may hold a NaN in this forward
  std::vector<std::optional<dnnl::primitive>> redo_;  // per fused batch norm: the rare NaN path
};

}  // namespace

bool onednn::winograd_pays(int64_t in_channels, int64_t out_channels, int64_t height,
                           int64_t width) {
  return in_channels >= 32 && out_channels >= 64 && height >= 7 && width >= 7;
}

ParamLayout onednn_param_layout(const Graph& g) {
  return blocked_conv_layout(g, onednn_weight_block());
}

std::unique_ptr<Executor> make_onednn_executor(const Graph& g, int64_t batch, ParamStore& store,
                                               const std::vector<Bucket>& buckets,
                                               Precision precision) {
  try {
    return std::make_unique<OneDnnExecutor>(g, batch, store, buckets, precision);
  } catch (const dnnl::error& e) {
    throw std::runtime_error(std::string("oneDNN could not build the network: ") + e.what());
  }
}

}  // namespace gg::kernels
