#include "gossip/comm/bucket_queue.hpp"

#include <algorithm>

#include "gossip/comm/bounded_wait.hpp"

namespace gg::gossip {

BucketQueue::BucketQueue(size_t buckets, Threading threading, double limit_s)
    : buckets_(buckets),
      threading_(threading),
      limit_s_(limit_s),
      in_flight_(buckets, 0),
      done_now_(buckets, 0) {}

void BucketQueue::begin(int64_t step, const partners::Partners& peers) {
  std::lock_guard lock(mu_);
  step_ = step;
  peers_ = peers;
  done_ = 0;
  std::fill(done_now_.begin(), done_now_.end(), 0);
  next_chained_ = 0;
}

void BucketQueue::push(int b, bool one_in_flight, const std::function<void()>& capture) {
  std::unique_lock lock(mu_);
  if (one_in_flight) {
    // Bounded staleness: the previous exchange of this bucket must be over before what it sent
    // is replaced. (Only one this engine queued: after a resume or a rebuild there is none.)
    wait_with_progress(lock, cv_, progress_, limit_s_,
                       "the previous exchange of bucket " + std::to_string(b) + " (step " +
                           std::to_string(step_) + ")",
                       [&] { return in_flight_[static_cast<size_t>(b)] == 0 || error_; });
    if (error_) std::rethrow_exception(error_);
  }
  if (capture) capture();
  jobs_.push_back({step_, b, peers_});
  ++in_flight_[static_cast<size_t>(b)];
  lock.unlock();
  cv_.notify_all();
}

bool BucketQueue::chained_ready() const {
  return std::any_of(jobs_.begin(), jobs_.end(),
                     [&](const Job& j) { return j.step < step_ || j.bucket == next_chained_; });
}

std::vector<BucketQueue::Job> BucketQueue::take() {
  std::vector<Job> batch;
  {
    std::unique_lock lock(mu_);
    if (threading_ == Threading::Chained) {
      // Strictly in bucket order: wait for the next bucket even if later ones are ready.
      cv_.wait(lock, [&] { return stop_ || chained_ready(); });
      auto it = std::find_if(jobs_.begin(), jobs_.end(), [&](const Job& j) {
        return j.step < step_ || j.bucket == next_chained_;
      });
      if (it == jobs_.end()) return {};  // stopped with nothing left in order
      batch.push_back(*it);
      jobs_.erase(it);
      if (batch[0].step == step_) ++next_chained_;
    } else {
      cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
      if (jobs_.empty()) return {};
      if (threading_ == Threading::Funneled) {
        batch.assign(jobs_.begin(), jobs_.end());
        jobs_.clear();
      } else {
        batch.push_back(jobs_.front());
        jobs_.pop_front();
      }
    }
  }
  cv_.notify_all();  // drain_and_stop may be waiting for an empty queue
  return batch;
}

std::vector<BucketQueue::Job> BucketQueue::take_ready() {
  std::vector<Job> batch;
  {
    std::lock_guard lock(mu_);
    if (threading_ != Threading::Funneled || jobs_.empty()) return batch;
    batch.assign(jobs_.begin(), jobs_.end());
    jobs_.clear();
  }
  cv_.notify_all();  // as in take()
  return batch;
}

void BucketQueue::done(const Job& j) {
  {
    std::lock_guard lock(mu_);
    --in_flight_[static_cast<size_t>(j.bucket)];
    ++progress_;
    if (j.step == step_) {
      ++done_;
      done_now_[static_cast<size_t>(j.bucket)] = 1;
    }
  }
  cv_.notify_all();
}

void BucketQueue::fail(std::exception_ptr e) {
  {
    std::lock_guard lock(mu_);
    if (!error_) error_ = std::move(e);
  }
  cv_.notify_all();
}

void BucketQueue::wait_step() {
  std::unique_lock lock(mu_);
  wait_with_progress(lock, cv_, progress_, limit_s_, "the buckets of step " + std::to_string(step_),
                     [&] { return done_ == buckets_ || error_; });
  if (error_) std::rethrow_exception(error_);
}

void BucketQueue::wait_bucket(int b) {
  std::unique_lock lock(mu_);
  wait_with_progress(lock, cv_, progress_, limit_s_,
                     "bucket " + std::to_string(b) + " of step " + std::to_string(step_),
                     [&] { return done_now_.at(static_cast<size_t>(b)) != 0 || error_; });
  if (error_) std::rethrow_exception(error_);
}

void BucketQueue::check() const {
  std::lock_guard lock(mu_);
  if (error_) std::rethrow_exception(error_);
}

void BucketQueue::drain_and_stop() {
  {
    std::unique_lock lock(mu_);
    // Let exchanges already started finish: the partner is waiting for them. Bounded: a
    // destructor that hangs keeps a failing job from ending.
    try {
      wait_with_progress(lock, cv_, progress_, limit_s_, "the last queued buckets",
                         [&] { return jobs_.empty() || error_; });
    } catch (const std::exception&) {
    }
    stop_ = true;
  }
  cv_.notify_all();
}

int64_t BucketQueue::step() const {
  std::lock_guard lock(mu_);
  return step_;
}

}  // namespace gg::gossip
