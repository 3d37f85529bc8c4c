// Softmax cross-entropy on plain logits, shared by every backend (it is tiny next to the net).
#pragma once

#include <cstdint>

namespace gg::kernels {

struct LossResult {
  double loss = 0;      // mean over the batch
  int64_t correct = 0;  // top-1 hits
  int64_t top5 = 0;     // top-5 hits
};

// logits: n x classes. labels in [0, classes). If dlogits is non-null it receives the gradient
// of the mean loss multiplied by `grad_scale`. Labels < 0 mark padding rows: they add nothing to
// the loss, the accuracy or the gradient, and the mean is taken over the other rows.
LossResult softmax_cross_entropy(const float* logits, const int32_t* labels, int64_t n,
                                 int64_t classes, float* dlogits, float grad_scale = 1.f);

}  // namespace gg::kernels
