#include "kernels/loss.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

namespace gg::kernels {

LossResult softmax_cross_entropy(const float* logits, const int32_t* labels, int64_t n,
                                 int64_t classes, float* dlogits, float grad_scale) {
  LossResult r;
  int64_t valid = 0;
  for (int64_t i = 0; i < n; ++i) valid += labels[i] >= 0;
  const double inv = valid ? 1.0 / static_cast<double>(valid) : 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const float* z = logits + i * classes;
    float* dz = dlogits ? dlogits + i * classes : nullptr;
    const int32_t y = labels[i];
    if (y < 0) {
      if (dz) std::fill(dz, dz + classes, 0.f);
      continue;
    }
    if (y >= classes) throw std::out_of_range("label " + std::to_string(y) + " >= classes");
    const float zmax = *std::max_element(z, z + classes);
    double sum = 0;
    for (int64_t c = 0; c < classes; ++c) sum += std::exp(static_cast<double>(z[c] - zmax));
    const double log_sum = std::log(sum) + zmax;
    r.loss += (log_sum - z[y]) * inv;
    // Classes ranked above the true one; ties go to the lower index, as argmax does, and a NaN
    // ranks above every number, as in torch.argmax and topk (else NaN logits, which compare
    // false with everything, would count as correct).
    int64_t rank = 0;
    const bool nan_y = std::isnan(z[y]);
    for (int64_t c = 0; c < classes; ++c) {
      const bool tie_wins = c < y;
      if (std::isnan(z[c]))
        rank += !nan_y || tie_wins;
      else
        rank += !nan_y && (z[c] > z[y] || (z[c] == z[y] && tie_wins));
    }
    r.correct += rank == 0;
    r.top5 += rank < 5;
    if (dz) {
      for (int64_t c = 0; c < classes; ++c) {
        const double p = std::exp(static_cast<double>(z[c]) - log_sum);
        dz[c] = static_cast<float>((p - (c == y ? 1.0 : 0.0)) * inv * grad_scale);
      }
    }
  }
  return r;
}

}  // namespace gg::kernels
