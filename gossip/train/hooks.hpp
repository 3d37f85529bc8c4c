// The training loop's seam (Caffe's solver callbacks, generalised): all that is not the step
// itself — progress and metrics, evaluation and checkpoints, the NaN guard, apoptosis, simulated
// failures, test hooks — is a StepHook that the loop calls at the step boundaries, in order.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "gossip/train/trainer.hpp"
#include "shuffle/loader.hpp"

namespace gg::gossip {

// One step as the hooks see it once it ran. Hooks may amend it: a rollback runs the step again,
// the NaN guard undoes it.
struct StepRecord {
  int64_t step = 0;  // the step that ran (0-based, the job's count)
  int64_t epoch = 0;
  bool last = false;       // the run's last step
  bool epoch_end = false;  // the last step of an epoch (or of the run)
  const shuffle::Batch* batch = nullptr;
  StepStats stats;
  int runs = 1;          // 2 when a rollback ran the step again
  double seconds = 0;    // since the previous step ended: its hooks (not evaluation, checkpoints),
                         // this data, step and sample exchange
  double data_wait = 0;  // of which waiting for the loader
  double shuffle_wait = 0;  // and completing the sample exchange
  bool restored = false;    // the NaN guard went back to an earlier state: the step did not count
};

class StepHook {
 public:
  virtual ~StepHook() = default;
  // Before step s runs, once its batch is there.
  virtual void before_step(int64_t s, shuffle::Batch& batch) { (void)s, (void)batch; }
  // After the step.
  virtual void after_step(StepRecord& r) { (void)r; }
  // Whether training stops after this step (train.stop_at).
  virtual bool stop() const { return false; }
  // After this group's last step (also after a stop).
  virtual void finish() {}
};

// Hooks in the order they run.
class StepHooks {
 public:
  void add(std::unique_ptr<StepHook> h) { hooks_.push_back(std::move(h)); }
  void before_step(int64_t s, shuffle::Batch& batch) {
    for (auto& h : hooks_) h->before_step(s, batch);
  }
  void after_step(StepRecord& r) {
    for (auto& h : hooks_) h->after_step(r);
  }
  bool stop() const {
    for (const auto& h : hooks_)
      if (h->stop()) return true;
    return false;
  }
  void finish() {
    for (auto& h : hooks_) h->finish();
  }

 private:
  std::vector<std::unique_ptr<StepHook>> hooks_;
};

}  // namespace gg::gossip
