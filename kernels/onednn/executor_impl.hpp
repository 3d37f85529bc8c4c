// The oneDNN executor's class, private to kernels/onednn (make_onednn_executor in
// onednn_executor.hpp is its only way out). onednn_executor.cpp holds its construction, the
// dispatch over ops, the layout and buffer helpers every op uses, and the step's machinery (run,
// memory plan, scratchpad); each op's compile_* has a file of its own (conv.cpp,
// inner_product.cpp, batch_norm.cpp, relu.cpp, pool.cpp, add.cpp, concat.cpp, dropout.cpp,
// lrn.cpp), and weighted.cpp what the convolution and the fully connected layer share.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <oneapi/dnnl/dnnl.hpp>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kernels/executor.hpp"
#include "kernels/memory_plan.hpp"
#include "kernels/onednn/api.hpp"

namespace gg::kernels::onednn_detail {

using dnnl::memory;
using tag = memory::format_tag;
using dt = memory::data_type;
using Args = std::unordered_map<int, memory>;
namespace api = gg::kernels::onednn;

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

inline memory::dims batched(int64_t n, const Dims& d) {
  memory::dims r{n};
  r.insert(r.end(), d.begin(), d.end());
  return r;
}

// PyTorch's layout of a batch of per-sample dims {C,H,W} or {F}.
inline memory::desc plain_md(int64_t n, const Dims& d) {
  return memory::desc(batched(n, d), dt::f32, d.size() == 3 ? tag::nchw : tag::nc);
}

// A layer with weights (a convolution or a fully connected layer) as the passes that
// compile_conv and compile_fc share see it (weighted.cpp): node `id` reads tensor `in`, its
// weights (params[0]) held in the store as `w_plain` and, with `bias`, its bias (params[1]).
struct Weighted {
  int id = 0, in = 0;
  int w_param = 0, b_param = 0;
  bool bias = false;
  memory::desc src_any, w_any, dw_any;  // oneDNN picks the layouts (gradients stay fp32)
  memory::desc w_plain, b_md;           // b_md: empty without a bias
  // Set by weighted_forward and weighted_backward_weights for the passes after them.
  memory src;                // the input in the forward's layout
  memory diff_src;           // where backward-data writes the input's gradient
  std::vector<Action> tail;  // reorders of diff_src into the input's gradient
  memory w_user, w;          // the weights in the store, and in the forward's layout
  memory ddst;               // the output's gradient in backward-weights' layout
};

class OneDnnExecutor final : public Executor {
 public:
  OneDnnExecutor(const Graph& g, int64_t batch, ParamStore& store,
                 const std::vector<Bucket>& buckets, Precision precision);
  const float* forward(const float* x, bool train) override;
  void backward(const float* dlogits, const BucketReady& ready) override;

 private:
  // Every buffer fresh() made, with the memories that view it.
  struct Slot {
    size_t bytes = 0;
    std::vector<memory> views;
  };
  enum class Bound { None, Eval, Train };
  struct Free {
    void operator()(char* p) const { std::free(p); }
  };

  // The step (onednn_executor.cpp).
  void sum_edges();
  void zero_unread_gradients();
  void run(Action& a);
  void gate_positions(const std::vector<Bucket>& buckets);
  void share_scratchpad();
  MemoryPlan plan(bool train) const;
  void bind(Bound mode);

  // Buffers, layouts and gradients, for every op (onednn_executor.cpp).
  memory param_mem(int index, const memory::desc& md, bool grad);
  memory buffer_mem(int index, const memory::desc& md);
  memory fresh(const memory::desc& md);
  memory alias(const memory::desc& md, const memory& of);
  dnnl::reorder reorder(const memory& from, const memory& to);
  void merge(const memory& keep, const memory& drop);
  memory& diff_of(int t);
  memory edge(int t);
  memory conform(int t, const memory::desc& want, memory* diff_src, std::vector<Action>* diff_tail);
  static bool usable(const memory& m, const memory::desc& md);
  memory as(const memory& m, const memory::desc& want, std::vector<Action>& list);
  memory into(const memory& target, const memory::desc& have, std::vector<Action>& after);
  void push_fwd(dnnl::primitive p, Args args, When when = When::Always);
  bool feeds_max_pool(int t) const;
  int reader_relu(int t) const;
  bool reader_is_relu(int t) const;

  // One op each (their own files), dispatched by compile_node.
  void compile_node(int id);
  void compile_conv(int id, const Node& n);
  void compile_fc(int id, const Node& n);
  void compile_bn(int id, const Node& n);
  void compile_relu(int id, const Node& n);
  void compile_pool(int id, const Node& n);
  void compile_blocked_max_pool(int id, const Node& n, tag t, int block);
  void compile_add(int id, const Node& n);
  void compile_concat(int id, const Node& n);
  void compile_dropout(int id, const Node& n);
  void compile_lrn(int id, const Node& n);

  // What compile_conv and compile_fc share (weighted.cpp).
  Weighted weighted(int id, const Node& n, const memory::dims& w_dims, tag w_tag, bool bias,
                    int64_t outputs) const;
  void weighted_forward(Weighted& l, const dnnl::primitive_desc_base& pd, dnnl::primitive fwd,
                        const memory::desc& dst_md);
  void weighted_backward_weights(Weighted& l, const dnnl::primitive_desc_base& pd,
                                 dnnl::primitive bwd);
  void weighted_backward_data(Weighted& l, const dnnl::primitive_desc_base& pd,
                              dnnl::primitive bwd);

  // Batch norm (batch_norm.cpp).
  memory::desc bn_layout(const memory::desc& md, float eps, dnnl::normalization_flags flags);
  struct BnTensors;
  void push_bn_statistics(int id, const Node& n, const BnTensors& t, bool fuse);
  void push_bn_eval(int id, const BnTensors& t, bool fuse);

  // Pooling and max pool's NaN (pool.cpp).
  void push_max_pool_nan(int id);
  void max_pool_nan(int id, memory src, memory dst);
  bool may_hold_nan(int t) const;

  // Concat (concat.cpp).
  std::vector<memory::desc> channel_slices(const memory::desc& md, const Node& n) const;
  std::optional<tag> common_tag(const Node& n) const;

  const Graph& g_;
  ParamStore& store_;
  dnnl::engine eng_;
  dnnl::stream strm_;
  dnnl::primitive_attr attr_;
  dt act_;  // activations and their gradients
  std::vector<Slot> slots_;
  std::unordered_map<dnnl_memory_t, int> slot_of_;
  MemoryPlan train_plan_, eval_plan_;
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

}  // namespace gg::kernels::onednn_detail
