#include "gossip/comm/exchange.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "gossip/comm/bounded_wait.hpp"
#include "gossip/comm/mixing.hpp"
#include "gossip/comm/wait_watch.hpp"

namespace gg::gossip {

Threading parse_threading(const std::string& name) {
  if (name == "funneled") return Threading::Funneled;
  if (name == "concurrent") return Threading::Concurrent;
  if (name == "chained") return Threading::Chained;
  throw std::invalid_argument("unknown threading '" + name +
                              "' (expected funneled, concurrent or chained)");
}

AllreduceExchange::AllreduceExchange(const mpi::Comm& world, float* grads,
                                     std::vector<kernels::Bucket> buckets)
    : comm_(world.dup()),
      grads_(grads),
      buckets_(std::move(buckets)),
      ranks_(world.size()),
      worker_([this] { loop(); }) {}

AllreduceExchange::~AllreduceExchange() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

void AllreduceExchange::begin_step(int64_t step) {
  std::lock_guard lock(mu_);
  step_ = step;
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
  bool named = false;
  for (;;) {
    int b = -1;
    int64_t step = 0;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      step = step_;
      b = queue_.front();
      queue_.pop_front();
    }
    if (timeline_ && !named) {
      timeline_->name_thread("allreduce comm");
      named = true;
    }
    try {
      const mpi::Activity doing("allreduce of gradient bucket " + std::to_string(b) + " in step " +
                                std::to_string(step));
      Timeline::Span span(timeline_, "allreduce bucket " + std::to_string(b), "comm");
      const kernels::Bucket& k = buckets_.at(b);
      float* g = grads_ + k.begin;
      comm_.allreduce_sum(g, k.size());
      mean_of_sum({g, static_cast<size_t>(k.size())}, ranks_);
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

namespace gg::gossip {

GossipExchange::GossipExchange(const mpi::Comm& world, float* buffer,
                               std::vector<kernels::Bucket> buckets, GossipOptions o)
    : comm_(world.dup()),
      buffer_(buffer),
      buckets_(std::move(buckets)),
      o_(std::move(o)),
      rank_(world.rank()),
      latest_step_(buckets_.size(), -1),
      in_flight_(buckets_.size(), 0) {
  if (o_.schedule.p != comm_.size())
    throw std::invalid_argument("gossip schedule is for " + std::to_string(o_.schedule.p) +
                                " ranks but the job has " + std::to_string(comm_.size()));
  if (o_.staleness != 0 && o_.staleness != 1)
    throw std::invalid_argument("staleness must be 0 or 1");
  if (o_.skip_late && o_.staleness != 1)
    throw std::invalid_argument("skipping late buckets needs staleness 1");
  partners::validate(o_.schedule);
  BufferLayout layout;
  layout.count = buckets_.empty() ? 0 : buckets_.front().end;
  layout.buckets = buckets_;
  const bool bf16 = o_.wire == Wire::Bf16;
  if (o_.error_feedback && !bf16) throw std::invalid_argument("error feedback needs the bf16 wire");
  BufferLayout wire = layout;
  if (bf16) {
    // Bucket b travels as ceil(n / 2) floats' room, two bf16 values in each, laid out in the
    // same order as the buckets (bucket 0 last).
    wire_.resize(buckets_.size());
    int64_t at = 0;
    for (size_t b = buckets_.size(); b-- > 0;) {
      wire_[b] = {at, at + wire_floats(o_.wire, buckets_[b].size())};
      at = wire_[b].end;
    }
    wire.count = at;
    wire.buckets = wire_;
    packed_out_.assign(at, 0.f);
    unpacked_.assign(layout.count, 0.f);
    if (o_.error_feedback) residue_.assign(layout.count, 0.f);
  }
  // The bf16 wire never averages in place: the window holds packed buckets, not the buffer.
  transport_ = make_transport(o_.transport, comm_, wire, buffer_ == nullptr && !bf16);
  transport_->set_timeout(o_.timeout_s);
  if (!buffer_) {
    buffer_ = transport_->shared_home();
    if (!buffer_) {
      own_.assign(layout.count, 0.f);
      buffer_ = own_.data();
    }
  }
  if (o_.staleness == 1) {
    send_stage_.resize(layout.count);
    latest_.resize(layout.count);
  }
  if (o_.delayed) {
    if (o_.staleness != 0) throw std::invalid_argument("delayed mixing needs staleness 0");
    send_stage_.resize(layout.count);
    delta_.resize(layout.count);
  }
  const int threads = o_.threading == Threading::Concurrent ? std::max(1, o_.comm_threads) : 1;
  for (int i = 0; i < threads; ++i) workers_.emplace_back([this, i] { worker(i); });
}

GossipExchange::~GossipExchange() {
  {
    std::unique_lock lock(mu_);
    // Let exchanges already started finish: the partner is waiting for them. Bounded: a
    // destructor that hangs keeps a failing job from ending.
    try {
      wait_with_progress(lock, cv_, progress_, engine_limit(), "the last queued buckets",
                         [&] { return queue_.empty() || error_; });
    } catch (const std::exception&) {
    }
    stop_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

partners::Partners GossipExchange::partners_at(int64_t step) const {
  return partners::partners(o_.schedule, rank_, step);
}

void GossipExchange::begin_step(int64_t step) {
  const partners::Partners peers = partners_at(step);
  std::lock_guard lock(mu_);
  step_ = step;
  peers_ = peers;
  done_ = 0;
  next_chained_ = 0;
}

bool GossipExchange::in_place(const partners::Partners& peers) const {
  return buffer_ == transport_->shared_home() && o_.staleness == 0 && !o_.delayed &&
         peers.send_to == peers.recv_from && transport_->pairs_in_place(peers.send_to);
}

const float* GossipExchange::source(int b) const {
  return (o_.staleness == 1 || o_.delayed ? send_stage_.data() : buffer_) + buckets_[b].begin;
}

const float* GossipExchange::outgoing(int b) {
  const float* x = source(b);
  if (o_.wire == Wire::Fp32) return x;
  const kernels::Bucket& k = buckets_[b];
  float* room = packed_out_.data() + wire_[b].begin;
  const auto n = static_cast<size_t>(k.size());
  pack_bf16({x, n},
            residue_.empty() ? std::span<float>() : std::span<float>(residue_.data() + k.begin, n),
            reinterpret_cast<uint16_t*>(room));
  return room;
}

const float* GossipExchange::incoming(int b, const float* in) {
  if (o_.wire == Wire::Fp32) return in;
  const kernels::Bucket& k = buckets_[b];
  float* x = unpacked_.data() + k.begin;
  unpack_bf16(reinterpret_cast<const uint16_t*>(in), {x, static_cast<size_t>(k.size())});
  return x;
}

BucketExchange::Lateness GossipExchange::lateness() const {
  std::lock_guard lock(mu_);
  return lateness_;
}

int64_t GossipExchange::bytes_sent() const {
  int64_t bytes = 0;
  for (const TransportTraffic& t : transport_->traffic())
    for (const PeerTraffic& p : t.peers) bytes += p.bytes_sent;
  return bytes;
}

void GossipExchange::on_bucket_ready(int b) {
  std::unique_lock lock(mu_);
  if (o_.staleness == 1) {
    // Bounded staleness: the previous exchange of this bucket must be over before its staging
    // copy is reused. (Only one this exchange queued: after a resume or a rebuild there is none.)
    wait_with_progress(lock, cv_, progress_, engine_limit(),
                       "the previous exchange of bucket " + std::to_string(b) + " (step " +
                           std::to_string(step_) + ")",
                       [&] { return in_flight_[b] == 0 || error_; });
    if (error_) std::rethrow_exception(error_);
    const kernels::Bucket& k = buckets_[b];
    std::copy(buffer_ + k.begin, buffer_ + k.end, send_stage_.begin() + k.begin);
  }
  queue_.push_back({step_, b, peers_});
  ++in_flight_[b];
  lock.unlock();
  cv_.notify_all();
}

void GossipExchange::start(Job& j) {
  j.started = Timeline::Clock::now();
  const int64_t t = j.step - first_step_;
  if (in_place(j.peers)) return transport_->publish(j.peers.send_to, t, j.bucket);
  transport_->expect(j.peers.recv_from, t, j.bucket);
  transport_->send(j.peers.send_to, t, j.bucket, outgoing(j.bucket));
}

void GossipExchange::complete(const Job& j) {
  const int64_t t = j.step - first_step_;
  if (in_place(j.peers)) return transport_->average_in_place(j.peers.send_to, t, j.bucket);
  const kernels::Bucket& k = buckets_[j.bucket];
  const float* in = incoming(j.bucket, transport_->received(j.peers.recv_from, t, j.bucket));
  // The outgoing bucket may still be read by MPI (p2p rendezvous) until the send completes:
  // only then may it be overwritten by the mix.
  transport_->finish_send(j.peers.send_to, t, j.bucket);
  const auto n = static_cast<size_t>(k.size());
  if (o_.delayed) {
    mix_correction({send_stage_.data() + k.begin, n}, {in, n}, {delta_.data() + k.begin, n});
  } else if (o_.staleness == 0) {
    mix_pair({buffer_ + k.begin, n}, {in, n});
  } else {
    std::lock_guard lock(mu_);
    std::copy(in, in + k.size(), latest_.begin() + k.begin);
    latest_step_[j.bucket] = j.step;
  }
  transport_->release(j.peers.recv_from, t, j.bucket);
}

void GossipExchange::mark_done(const Job& j) {
  if (timeline_ && timeline_->enabled())
    timeline_->record(
        "bucket " + std::to_string(j.bucket), "comm", j.started, Timeline::Clock::now(),
        "{\"step\":" + std::to_string(j.step) + ",\"send_to\":" + std::to_string(j.peers.send_to) +
            ",\"recv_from\":" + std::to_string(j.peers.recv_from) +
            ",\"in_place\":" + (in_place(j.peers) ? "true" : "false") + "}");
  {
    std::lock_guard lock(mu_);
    --in_flight_[j.bucket];
    ++progress_;
    if (j.step == step_) ++done_;
  }
  cv_.notify_all();
}

void GossipExchange::run_blocking(Job& j) {
  start(j);
  complete(j);
  mark_done(j);
}

void GossipExchange::worker(int id) {
  bool named = false;
  for (;;) {
    std::vector<Job> batch;
    {
      std::unique_lock lock(mu_);
      if (o_.threading == Threading::Chained) {
        // Strictly in bucket order: wait for the next bucket even if later ones are ready.
        cv_.wait(lock, [&] {
          if (stop_) return true;
          for (const Job& j : queue_)
            if (j.step < step_ || j.bucket == next_chained_) return true;
          return false;
        });
        if (stop_ && queue_.empty()) return;
        auto it = std::find_if(queue_.begin(), queue_.end(), [&](const Job& j) {
          return j.step < step_ || j.bucket == next_chained_;
        });
        if (it == queue_.end()) continue;
        batch.push_back(*it);
        queue_.erase(it);
        if (batch[0].step == step_) ++next_chained_;
      } else {
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (stop_ && queue_.empty()) return;
        if (o_.threading == Threading::Funneled) {
          batch.assign(queue_.begin(), queue_.end());
          queue_.clear();
        } else {
          batch.push_back(queue_.front());
          queue_.pop_front();
        }
      }
    }
    cv_.notify_all();  // the destructor may be waiting for an empty queue
    if (timeline_ && !named) {
      timeline_->name_thread("gossip comm " + std::to_string(id));
      named = true;
    }
    try {
      if (batch.size() == 1) {
        run_blocking(batch[0]);
      } else {
        // Funneled: every ready bucket is on the wire before the first one is waited for.
        for (Job& j : batch) start(j);
        for (const Job& j : batch) {
          complete(j);
          mark_done(j);
        }
      }
    } catch (const PartnerTimeout& e) {
      mpi::mark_peer_lost();
      std::lock_guard lock(mu_);
      char what[384];
      std::snprintf(what, sizeof what,
                    "gossip: rank %d waited more than %g s for rank %d at step %lld, bucket %d "
                    "(%s); that rank died or hangs",
                    rank_, o_.timeout_s, e.peer, static_cast<long long>(step_), e.bucket, e.what());
      error_ = std::make_exception_ptr(std::runtime_error(what));
      cv_.notify_all();
      return;
    } catch (...) {
      std::lock_guard lock(mu_);
      error_ = std::current_exception();
      cv_.notify_all();
      return;
    }
  }
}

double GossipExchange::finish_step() {
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_lock lock(mu_);
  if (o_.staleness == 0) {
    wait_with_progress(lock, cv_, progress_, engine_limit(),
                       "the buckets of step " + std::to_string(step_),
                       [&] { return done_ == buckets_.size() || error_; });
    if (error_) std::rethrow_exception(error_);
  } else {
    if (error_) std::rethrow_exception(error_);
    for (size_t b = 0; b < buckets_.size(); ++b) {
      const Freshness f = freshness(latest_step_[b], step_, o_.skip_late);
      if (f == Freshness::Unmixed) {
        ++lateness_.unmixed;
        continue;
      }
      if (f == Freshness::Late) ++lateness_.late;
      const kernels::Bucket& k = buckets_[b];
      const auto n = static_cast<size_t>(k.size());
      mix_pair({buffer_ + k.begin, n}, {latest_.data() + k.begin, n});
    }
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void GossipExchange::queue_all(int64_t step) {
  begin_step(step);
  for (int b = 0; b < static_cast<int>(buckets_.size()); ++b) on_bucket_ready(b);
}

double GossipExchange::exchange_all(int64_t step) {
  const auto t0 = std::chrono::steady_clock::now();
  queue_all(step);
  finish_step();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void GossipExchange::start_delayed(int64_t step) {
  if (!o_.delayed) throw std::logic_error("start_delayed on an exchange built without delayed");
  finish_delayed();
  const int64_t n = static_cast<int64_t>(send_stage_.size());
  std::copy(buffer_, buffer_ + n, send_stage_.begin());
  queue_all(step);
  pending_ = true;
}

void GossipExchange::settle_delayed() {
  if (!pending_ || settled_) return;
  finish_step();
  settled_ = true;
}

std::vector<float> GossipExchange::delayed_delta() {
  if (!pending_) return {};
  settle_delayed();
  return delta_;
}

void GossipExchange::set_delayed_delta(const std::vector<float>& delta) {
  if (!o_.delayed) throw std::logic_error("set_delayed_delta on an exchange built without delayed");
  if (pending_) finish_delayed();
  if (delta.empty()) return;
  if (delta.size() != delta_.size())
    throw std::invalid_argument("delayed correction of " + std::to_string(delta.size()) +
                                " values for a buffer of " + std::to_string(delta_.size()));
  delta_ = delta;
  pending_ = settled_ = true;
}

double GossipExchange::finish_delayed() {
  if (!pending_) return 0;
  const double waited = settled_ ? 0.0 : finish_step();
  pending_ = settled_ = false;
  apply_correction({buffer_, delta_.size()}, delta_);
  return waited;
}

}  // namespace gg::gossip
