// SGD with momentum and weight decay over the flat parameter buffer, and the learning-rate
// schedule (linear scaling with the global batch, linear warm-up, cosine decay).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace gg::kernels {

struct SgdOptions {
  float momentum = 0.9f;
  float weight_decay = 5e-4f;
  bool nesterov = false;
};

// PyTorch's torch.optim.SGD update: g += wd * w; v = momentum * v + g; w -= lr * v (or, with
// Nesterov, w -= lr * (g + momentum * v)). The first step starts from v = g.
class Sgd {
 public:
  Sgd(int64_t size, SgdOptions o) : o_(o), velocity_(size, 0.f) {}
  void step(float* params, const float* grads, float lr);
  // The same step over elements [begin, end) alone (a bucket updated as soon as its gradients
  // are final), element for element what step() computes; a step is every element in exactly
  // one range, then end_ranges().
  void step_range(float* params, const float* grads, float lr, int64_t begin, int64_t end);
  void end_ranges() { started_ = true; }
  const SgdOptions& options() const { return o_; }
  std::vector<float>& velocity() { return velocity_; }
  // Whether the momentum buffer has been seeded (a checkpoint must restore it with the velocity).
  bool started() const { return started_; }
  void set_started(bool started) { started_ = started; }
  // Replaces the momentum (of another size, e.g. mapped onto a shrunk network); whether the
  // first step has been taken is kept.
  void set_velocity(std::vector<float> v) { velocity_ = std::move(v); }

 private:
  SgdOptions o_;
  std::vector<float> velocity_;
  bool started_ = false;
};

struct LrScheduleOptions {
  double base_lr = 0.1;      // for a global batch of base_batch
  int64_t base_batch = 256;  // linear scaling: peak = base_lr * global_batch / base_batch
  int64_t global_batch = 256;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  double final_lr_fraction = 0.0;  // cosine decays to peak * this
};

class LrSchedule {
 public:
  explicit LrSchedule(LrScheduleOptions o);
  double peak() const { return peak_; }
  double at(int64_t step) const;  // step counts from 0

 private:
  LrScheduleOptions o_;
  double peak_;
};

}  // namespace gg::kernels
