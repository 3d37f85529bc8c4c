#include "kernels/train_state.hpp"

#include <algorithm>
#include <limits>
#include <stdexcept>

#include "kernels/loss.hpp"

namespace gg::kernels {

void TrainState::to_host(unsigned parts) {
  const unsigned due = parts & stale_;
  if (due == 0) return;
  download(due);
  stale_ &= ~due;
}

void TrainState::to_host_buckets(unsigned part, const std::vector<Bucket>& buckets,
                                 const std::function<void(int)>& landed) {
  if ((stale_ & part) == 0 || (part != kParams && part != kVelocity)) {
    to_host(part);  // current already, or not a part the weight exchanges send
    for (size_t b = 0; b < buckets.size(); ++b) landed(static_cast<int>(b));
    return;
  }
  download_buckets(part, part == kParams ? store_.params.data() : host_sgd_.velocity().data(),
                   buckets, landed);
  stale_ &= ~part;
}

void TrainState::download_buckets(unsigned part, float*, const std::vector<Bucket>& buckets,
                                  const std::function<void(int)>& landed) {
  download(part);
  for (size_t b = 0; b < buckets.size(); ++b) landed(static_cast<int>(b));
}

void TrainState::from_host(unsigned parts) {
  if (!detached_ || parts == 0) return;
  upload(parts);
  stale_ &= ~parts;
}

namespace {

// The loss on the host from the executor's host logits, and its gradient for backward.
class HostLoss {
 public:
  HostLoss(int64_t batch, int64_t classes)
      : classes_(classes), dlogits_(static_cast<size_t>(batch * classes)) {}
  StepLoss forward(Executor& e, const float* x, const int32_t* y) {
    StepLoss l;
    const float* logits = e.forward(x, true);
    if (!logits) return l;  // emulated compute computes none
    const LossResult r = softmax_cross_entropy(logits, y, e.batch(), classes_, dlogits_.data());
    l.loss = r.loss;
    l.correct = r.correct;
    l.known = true;
    return l;
  }
  const float* dlogits() const { return dlogits_.data(); }

 private:
  int64_t classes_;
  std::vector<float> dlogits_;
};

class HostState final : public TrainState {
 public:
  HostState(Executor& e, ParamStore& s, Sgd& sgd, int64_t classes)
      : TrainState(e, s, sgd), loss_(e.batch(), classes) {}
  const char* where() const override { return "host"; }
  StepLoss forward(const float* x, const int32_t* y) override { return loss_.forward(exec_, x, y); }
  void backward(const BucketReady& ready) override { exec_.backward(loss_.dlogits(), ready); }
  void update(float lr) override { host_sgd_.step(store_.params.data(), store_.grads.data(), lr); }
  void update_range(float lr, int64_t begin, int64_t end) override {
    host_sgd_.step_range(store_.params.data(), store_.grads.data(), lr, begin, end);
  }
  void end_ranges() override { host_sgd_.end_ranges(); }

 protected:
  void download(unsigned) override {}
  void upload(unsigned) override {}

 private:
  HostLoss loss_;
};

// The executor computes in the ParamStore, so the state is copied in before forward, its
// statistics and gradients out after; between steps, the host copies of what the state changed
// hold NaN until to_host.
class DetachedHostState final : public TrainState {
 public:
  DetachedHostState(Executor& e, ParamStore& s, Sgd& sgd, int64_t classes, bool late_loss)
      : TrainState(e, s, sgd),
        late_loss_(late_loss),
        loss_(e.batch(), classes),
        params_(s.params),
        grads_(s.grads),
        buffers_(s.buffers),
        sgd_(s.params.size(), sgd.options()) {
    detached_ = true;
    sgd_.velocity() = sgd.velocity();
    sgd_.set_started(sgd.started());
  }
  const char* where() const override { return "host copy (GG_TEST_DETACHED_STATE)"; }

  StepLoss forward(const float* x, const int32_t* y) override {
    std::copy(params_.begin(), params_.end(), store_.params.begin());
    std::copy(buffers_.begin(), buffers_.end(), store_.buffers.begin());
    StepLoss l = loss_.forward(exec_, x, y);
    std::copy(store_.buffers.begin(), store_.buffers.end(), buffers_.begin());
    mark_stale(kBuffers);
    if (late_loss_) {  // as a device state reports it: the step before's, none the first time
      std::swap(l, pending_);
      l.lag = 1;
    }
    return l;
  }
  void backward(const BucketReady& ready) override {
    exec_.backward(loss_.dlogits(), ready);  // reads the weights forward copied in
    std::copy(store_.grads.begin(), store_.grads.end(), grads_.begin());
    if (!staged_grads_) mark_stale(kGrads);
    // Forward copied the weights in: their host copy is as stale as it was before.
    poison(stale_);
  }
  void update(float lr) override {
    sgd_.step(params_.data(), grads_.data(), lr);
    mark_stale(kParams | kVelocity);
    poison(kParams | kVelocity);
  }
  void update_range(float, int64_t, int64_t) override {
    throw std::logic_error("a detached state updates all of its weights at once");
  }
  void end_ranges() override {}

 protected:
  // As a device state does: each bucket's host copy current (the rest still NaN) when landed(b)
  // is called.
  void download_buckets(unsigned part, float* host, const std::vector<Bucket>& buckets,
                        const std::function<void(int)>& landed) override {
    const std::vector<float>& mine = part == kParams ? params_ : sgd_.velocity();
    for (size_t b = 0; b < buckets.size(); ++b) {
      std::copy(mine.begin() + buckets[b].begin, mine.begin() + buckets[b].end,
                host + buckets[b].begin);
      landed(static_cast<int>(b));
    }
    if (part == kVelocity) host_sgd_.set_started(sgd_.started());
  }
  void download(unsigned parts) override { copy(parts, true); }
  void upload(unsigned parts) override { copy(parts, false); }

 private:
  void copy(unsigned parts, bool to_host) {
    const auto move = [to_host](std::vector<float>& mine, float* host) {
      if (to_host)
        std::copy(mine.begin(), mine.end(), host);
      else
        std::copy(host, host + mine.size(), mine.begin());
    };
    if (parts & kParams) move(params_, store_.params.data());
    if (parts & kGrads) move(grads_, store_.grads.data());
    if (parts & kBuffers) move(buffers_, store_.buffers.data());
    if (parts & kVelocity) {
      move(sgd_.velocity(), host_sgd_.velocity().data());
      if (to_host)
        host_sgd_.set_started(sgd_.started());
      else
        sgd_.set_started(host_sgd_.started());
    }
  }
  void poison(unsigned parts) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    if (parts & kParams) std::fill(store_.params.begin(), store_.params.end(), nan);
    if (parts & kGrads) std::fill(store_.grads.begin(), store_.grads.end(), nan);
    if (parts & kBuffers) std::fill(store_.buffers.begin(), store_.buffers.end(), nan);
    if (parts & kVelocity) std::fill(host_sgd_.velocity().begin(), host_sgd_.velocity().end(), nan);
  }

  const bool late_loss_;
  StepLoss pending_;  // late_loss_: this step's, reported with the next
  HostLoss loss_;
  std::vector<float> params_, grads_, buffers_;
  Sgd sgd_;
};

}  // namespace

std::unique_ptr<TrainState> make_host_state(Executor& exec, ParamStore& store, Sgd& sgd,
                                            int64_t classes) {
  return std::make_unique<HostState>(exec, store, sgd, classes);
}

std::unique_ptr<TrainState> make_detached_host_state(Executor& exec, ParamStore& store, Sgd& sgd,
                                                     int64_t classes, bool late_loss) {
  return std::make_unique<DetachedHostState>(exec, store, sgd, classes, late_loss);
}

#ifndef GG_HAVE_CUDA
std::unique_ptr<TrainState> make_device_state(Executor&, ParamStore&, Sgd&) {
  throw std::invalid_argument("a device-resident state needs the CUDA backend, not in this build");
}
#endif

}  // namespace gg::kernels
