#include "gossip/comm/hierarchy.hpp"

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <string>

#include "gossip/comm/wait_watch.hpp"

namespace gg::gossip {

namespace {

using Clock = std::chrono::steady_clock;

// Slice l of a bucket of n values split over k ranks: the first n % k slices one value longer.
int slice_count(int64_t n, int k, int l) { return static_cast<int>(n / k + (l < n % k ? 1 : 0)); }

// Waits for `r`, giving up after `timeout_s` (0: never) with a line naming the partner.
void wait_for(mpi::Request& r, double timeout_s, const std::string& what) {
  if (timeout_s <= 0) return r.wait();
  const auto t0 = Clock::now();
  for (int spins = 0; !r.test(); ++spins) {
    if (spins > 200) std::this_thread::sleep_for(std::chrono::microseconds(20));
    if (std::chrono::duration<double>(Clock::now() - t0).count() > timeout_s) {
      mpi::mark_peer_lost();
      throw std::runtime_error(what + ": no answer in " + std::to_string(timeout_s) +
                               " s; that rank died or hangs");
    }
  }
}

}  // namespace

NodeLayout node_layout(const mpi::Comm& world, const mpi::Comm& node) {
  NodeLayout l;
  l.local = node.rank();
  l.per_node = node.size();
  // The node's lowest world rank names it; nodes are numbered in the order of those ranks.
  double neg = -world.rank();
  node.allreduce_max(&neg, 1);  // -(the node's lowest world rank)
  const double lead = -neg;
  std::vector<double> leads(world.size(), -1);
  leads[world.rank()] = lead;
  world.allreduce_max(leads.data(), static_cast<int64_t>(leads.size()));
  std::vector<double> distinct = leads;
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  l.nodes = static_cast<int>(distinct.size());
  l.node =
      static_cast<int>(std::lower_bound(distinct.begin(), distinct.end(), lead) - distinct.begin());
  double sizes[2] = {static_cast<double>(node.size()), -static_cast<double>(node.size())};
  world.allreduce_max(sizes, 2);
  if (sizes[0] != -sizes[1])
    throw std::invalid_argument(
        "gossip.hierarchy = node needs the same number of ranks on every "
        "node; this job's nodes hold " +
        std::to_string(static_cast<int>(-sizes[1])) + " to " +
        std::to_string(static_cast<int>(sizes[0])) +
        " ranks: place them evenly (mpirun -ppn) or use "
        "gossip.hierarchy = none");
  return l;
}

HierarchicalExchange::HierarchicalExchange(const mpi::Comm& world, float* buffer,
                                           std::vector<kernels::Bucket> buckets,
                                           partners::Schedule schedule, double timeout_s)
    : node_(world.split_shared()),
      layout_(node_layout(world, node_)),
      buffer_(buffer),
      buckets_(std::move(buckets)),
      timeout_s_(timeout_s) {
  // One rail per local rank: local rank l of every node, numbered by node.
  MPI_Comm rail;
  GG_MPI_CHECK(MPI_Comm_split(world.get(), layout_.local, layout_.node, &rail));
  GG_MPI_CHECK(MPI_Comm_set_errhandler(rail, MPI_ERRORS_RETURN));
  rail_ = mpi::Comm::adopt(rail);
  schedule_ = schedule;
  schedule_.p = layout_.nodes;
  partners::validate(schedule_);  // e.g. hypercube needs a power of two of nodes
  int64_t largest = 0;
  for (const kernels::Bucket& b : buckets_) largest = std::max(largest, b.size());
  slice_.resize(static_cast<size_t>(largest / layout_.per_node + 1));
  incoming_.resize(slice_.size());
  worker_ = std::thread([this] { loop(); });
}

HierarchicalExchange::~HierarchicalExchange() {
  {
    std::unique_lock lock(mu_);
    // Buckets already queued are finished: the node's ranks and the partner wait for them.
    cv_.wait(lock, [&] { return queue_.empty() || error_; });
    stop_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

partners::Partners HierarchicalExchange::node_partners(int64_t step) const {
  return partners::partners(schedule_, layout_.node, step);
}

void HierarchicalExchange::begin_step(int64_t step) {
  std::lock_guard lock(mu_);
  step_ = step;
  done_ = 0;
}

void HierarchicalExchange::on_bucket_ready(int bucket) {
  {
    std::lock_guard lock(mu_);
    if (error_) std::rethrow_exception(error_);
    queue_.emplace_back(bucket, step_);
  }
  cv_.notify_all();
}

double HierarchicalExchange::finish_step() {
  const auto t0 = Clock::now();
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return done_ == buckets_.size() || error_; });
  if (error_) std::rethrow_exception(error_);
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

int64_t HierarchicalExchange::bytes_sent() const {
  std::lock_guard lock(mu_);
  return bytes_sent_;
}

void HierarchicalExchange::mix(int b, int64_t step) {
  const kernels::Bucket& k = buckets_.at(static_cast<size_t>(b));
  const int per = layout_.per_node, me = layout_.local;
  float* x = buffer_ + k.begin;
  std::vector<int> counts(static_cast<size_t>(per)), displs(static_cast<size_t>(per));
  for (int l = 0, at = 0; l < per; ++l) {
    counts[static_cast<size_t>(l)] = slice_count(k.size(), per, l);
    displs[static_cast<size_t>(l)] = at;
    at += counts[static_cast<size_t>(l)];
  }
  const int n = counts[static_cast<size_t>(me)];
  {
    const mpi::WatchedWait wait("MPI_Reduce_scatter");
    GG_MPI_CHECK(
        MPI_Reduce_scatter(x, slice_.data(), counts.data(), MPI_FLOAT, MPI_SUM, node_.get()));
  }
  const float inv = 1.f / static_cast<float>(per);
  for (int i = 0; i < n; ++i) slice_[static_cast<size_t>(i)] *= inv;
  if (layout_.nodes > 1) {
    const partners::Partners peers = node_partners(step);
    mpi::Request rr, sr;
    GG_MPI_CHECK(
        MPI_Irecv(incoming_.data(), n, MPI_FLOAT, peers.recv_from, b, rail_.get(), rr.out()));
    GG_MPI_CHECK(MPI_Isend(slice_.data(), n, MPI_FLOAT, peers.send_to, b, rail_.get(), sr.out()));
    const std::string about = "gossip.hierarchy: rank " + std::to_string(me) + " of node " +
                              std::to_string(layout_.node) + ", bucket " + std::to_string(b) +
                              " of step " + std::to_string(step) + ", ";
    wait_for(rr, timeout_s_, about + "receiving from node " + std::to_string(peers.recv_from));
    wait_for(sr, timeout_s_, about + "sending to node " + std::to_string(peers.send_to));
    for (int i = 0; i < n; ++i)
      slice_[static_cast<size_t>(i)] =
          0.5f * (slice_[static_cast<size_t>(i)] + incoming_[static_cast<size_t>(i)]);
    std::lock_guard lock(mu_);
    bytes_sent_ += static_cast<int64_t>(n) * static_cast<int64_t>(sizeof(float));
  }
  const mpi::WatchedWait wait("MPI_Allgatherv");
  GG_MPI_CHECK(MPI_Allgatherv(slice_.data(), n, MPI_FLOAT, x, counts.data(), displs.data(),
                              MPI_FLOAT, node_.get()));
}

void HierarchicalExchange::loop() {
  bool named = false;
  for (;;) {
    std::pair<int, int64_t> job;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_
      job = queue_.front();
    }
    if (timeline_ && !named) {
      timeline_->name_thread("hierarchy comm");
      named = true;
    }
    try {
      const mpi::Activity doing("hierarchical exchange of bucket " + std::to_string(job.first) +
                                " in step " + std::to_string(job.second));
      Timeline::Span span(timeline_, "bucket " + std::to_string(job.first), "comm");
      mix(job.first, job.second);
    } catch (...) {
      std::lock_guard lock(mu_);
      error_ = std::current_exception();
      queue_.clear();
      cv_.notify_all();
      return;
    }
    {
      std::lock_guard lock(mu_);
      queue_.pop_front();
      if (job.second == step_) ++done_;
    }
    cv_.notify_all();
  }
}

}  // namespace gg::gossip
