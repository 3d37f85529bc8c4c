// Dropout on oneDNN: a mask drawn on the host, multiplied in by a binary primitive.
#include "kernels/onednn/executor_impl.hpp"

namespace gg::kernels::onednn_detail {

// Training: y = x * mask, the mask drawn on the host in NCHW order (dropout_multiplier, the
// reference's draw) and reordered into x's layout; backward dx = dy * mask. In place over x when
// nothing else reads it, as ReLU; then eval has nothing to do, else it copies.
void OneDnnExecutor::compile_dropout(int id, const Node& n) {
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

}  // namespace gg::kernels::onednn_detail
