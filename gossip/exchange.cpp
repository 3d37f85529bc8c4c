#include "gossip/exchange.hpp"

#include <chrono>

namespace gg::gossip {

AllreduceExchange::AllreduceExchange(const mpi::Comm& world, float* grads,
                                     std::vector<kernels::Bucket> buckets)
    : comm_(world.dup()),
      grads_(grads),
      buckets_(std::move(buckets)),
      scale_(1.f / static_cast<float>(world.size())),
      worker_([this] { loop(); }) {}

AllreduceExchange::~AllreduceExchange() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

void AllreduceExchange::begin_step(int64_t) {
  std::lock_guard lock(mu_);
  done_ = 0;
  queue_.clear();
}

void AllreduceExchange::on_bucket_ready(int bucket) {
  {
    std::lock_guard lock(mu_);
    queue_.push_back(bucket);
  }
  cv_.notify_all();
}

double AllreduceExchange::finish_step() {
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return done_ == buckets_.size() || error_; });
  if (error_) std::rethrow_exception(error_);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void AllreduceExchange::loop() {
  for (;;) {
    int b = -1;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      b = queue_.front();
      queue_.pop_front();
    }
    try {
      const kernels::Bucket& k = buckets_.at(b);
      float* g = grads_ + k.begin;
      comm_.allreduce_sum(g, k.size());
      for (int64_t i = 0; i < k.size(); ++i) g[i] *= scale_;
    } catch (...) {
      std::lock_guard lock(mu_);
      error_ = std::current_exception();
    }
    {
      std::lock_guard lock(mu_);
      ++done_;
    }
    cv_.notify_all();
  }
}

}  // namespace gg::gossip
