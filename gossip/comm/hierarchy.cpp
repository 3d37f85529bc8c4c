#include "gossip/comm/hierarchy.hpp"

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <string>

#include "gossip/comm/bounded_wait.hpp"
#include "gossip/comm/mixing.hpp"
#include "gossip/comm/wait_watch.hpp"

namespace gg::gossip {

namespace {

using Clock = std::chrono::steady_clock;

// Slice l of a bucket of n values split over k ranks: the first n % k slices one value longer.
int slice_count(int64_t n, int k, int l) { return static_cast<int>(n / k + (l < n % k ? 1 : 0)); }

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
  rail_ = world.split(layout_.local, layout_.node);
  schedule_ = schedule;
  schedule_.p = layout_.nodes;
  partners::validate(schedule_);  // e.g. hypercube needs a power of two of nodes
  gather_ = node_.dup();          // the allgathers, ordered apart from the reduce-scatters
  for (int b = 0; b < static_cast<int>(buckets_.size()); ++b) {
    const size_t n = static_cast<size_t>(counts(b)[static_cast<size_t>(layout_.local)]);
    slice_.emplace_back(n);
    incoming_.emplace_back(n);
  }
  worker_ = std::thread([this] { loop(); });
}

HierarchicalExchange::~HierarchicalExchange() {
  {
    std::unique_lock lock(mu_);
    // Buckets already queued are finished: the node's ranks and the partner wait for them.
    try {
      wait_with_progress(lock, cv_, progress_, 2 * timeout_s_, "the last queued buckets",
                         [&] { return (queue_.empty() && in_flight_ == 0) || error_; });
    } catch (const std::exception&) {
    }
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
  wait_with_progress(lock, cv_, progress_, 2 * timeout_s_,
                     "the buckets of step " + std::to_string(step_),
                     [&] { return done_ == buckets_.size() || error_; });
  if (error_) std::rethrow_exception(error_);
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

int64_t HierarchicalExchange::bytes_sent() const {
  std::lock_guard lock(mu_);
  return bytes_sent_;
}

struct HierarchicalExchange::Flight {
  int bucket = 0;
  int64_t step = 0;
  enum Phase { Reduce, Exchange, Mixed, Gather } phase = Reduce;
  mpi::Request reduce, recv, send, gather;
  Clock::time_point since{};  // the phase under way began
  Timeline::Clock::time_point started{};
};

std::vector<int> HierarchicalExchange::counts(int b) const {
  const int per = layout_.per_node;
  std::vector<int> c(static_cast<size_t>(per));
  for (int l = 0; l < per; ++l)
    c[static_cast<size_t>(l)] = slice_count(buckets_.at(static_cast<size_t>(b)).size(), per, l);
  return c;
}

std::vector<int> HierarchicalExchange::displs(int b) const {
  const std::vector<int> c = counts(b);
  std::vector<int> d(c.size());
  for (size_t l = 0, at = 0; l < c.size(); ++l) {
    d[l] = static_cast<int>(at);
    at += static_cast<size_t>(c[l]);
  }
  return d;
}

void HierarchicalExchange::start(Flight& f) {
  const std::vector<int> c = counts(f.bucket);
  float* x = buffer_ + buckets_.at(static_cast<size_t>(f.bucket)).begin;
  f.started = Timeline::Clock::now();
  f.since = Clock::now();
  GG_MPI_CHECK(MPI_Ireduce_scatter(x, slice_[static_cast<size_t>(f.bucket)].data(), c.data(),
                                   MPI_FLOAT, MPI_SUM, node_.get(), f.reduce.out()));
}

bool HierarchicalExchange::advance(Flight& f) {
  const size_t b = static_cast<size_t>(f.bucket);
  std::vector<float>& slice = slice_[b];
  const int n = static_cast<int>(slice.size());
  switch (f.phase) {
    case Flight::Reduce: {
      if (!f.reduce.test()) return false;
      mean_of_sum(slice, layout_.per_node);
      f.since = Clock::now();
      if (layout_.nodes == 1) {
        f.phase = Flight::Mixed;
        return true;
      }
      const partners::Partners peers = node_partners(f.step);
      GG_MPI_CHECK(MPI_Irecv(incoming_[b].data(), n, MPI_FLOAT, peers.recv_from, f.bucket,
                             rail_.get(), f.recv.out()));
      GG_MPI_CHECK(MPI_Isend(slice.data(), n, MPI_FLOAT, peers.send_to, f.bucket, rail_.get(),
                             f.send.out()));
      f.phase = Flight::Exchange;
      return true;
    }
    case Flight::Exchange: {
      if (!f.recv.test() || !f.send.test()) return false;
      mix_pair(slice, incoming_[b]);
      {
        std::lock_guard lock(mu_);
        bytes_sent_ += static_cast<int64_t>(n) * static_cast<int64_t>(sizeof(float));
      }
      f.phase = Flight::Mixed;
      return true;
    }
    case Flight::Mixed:
      return false;  // the loop starts the allgathers, in bucket order
    case Flight::Gather:
      return f.gather.test();
  }
  return false;
}

void HierarchicalExchange::check_time(const Flight& f) const {
  if (timeout_s_ <= 0 || f.phase == Flight::Mixed) return;
  if (std::chrono::duration<double>(Clock::now() - f.since).count() <= timeout_s_) return;
  const char* what = f.phase == Flight::Reduce     ? "MPI_Ireduce_scatter inside the node"
                     : f.phase == Flight::Exchange ? "the exchange with the partner node"
                                                   : "MPI_Iallgatherv inside the node";
  const partners::Partners peers = node_partners(f.step);
  throw std::runtime_error("gossip.hierarchy: rank " + std::to_string(layout_.local) + " of node " +
                           std::to_string(layout_.node) + ", bucket " + std::to_string(f.bucket) +
                           " of step " + std::to_string(f.step) + " (partner nodes " +
                           std::to_string(peers.send_to) + " / " + std::to_string(peers.recv_from) +
                           "): " + what + " took more than " + std::to_string(timeout_s_) +
                           " s; a rank died or hangs");
}

void HierarchicalExchange::loop() {
  const mpi::Activity doing("the hierarchical exchange's communication thread");
  bool named = false;
  std::deque<Flight> flights;  // in the order the buckets were handed over
  for (;;) {
    std::deque<std::pair<int, int64_t>> fresh;
    {
      std::unique_lock lock(mu_);
      if (flights.empty()) cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (flights.empty() && queue_.empty()) return;  // stop_
      fresh.swap(queue_);
      in_flight_ += fresh.size();
    }
    if (timeline_ && !named) {
      timeline_->name_thread("hierarchy comm");
      named = true;
    }
    try {
      for (const auto& [bucket, step] : fresh) {
        flights.emplace_back();
        flights.back().bucket = bucket;
        flights.back().step = step;
        start(flights.back());
      }
      bool moved = false;
      for (Flight& f : flights) moved |= advance(f);
      moved |= start_gathers(flights);
      moved |= retire(flights);
      if (!moved) std::this_thread::yield();
    } catch (...) {
      return fail(flights);
    }
  }
}

bool HierarchicalExchange::start_gathers(std::deque<Flight>& flights) {
  // The allgathers start in bucket order on every rank of the node (collectives on one
  // communicator must), so a bucket mixed early waits for the ones handed over before it.
  bool moved = false;
  for (Flight& f : flights) {
    if (f.phase < Flight::Mixed) break;
    if (f.phase == Flight::Gather) continue;
    const std::vector<int> c = counts(f.bucket), d = displs(f.bucket);
    float* x = buffer_ + buckets_.at(static_cast<size_t>(f.bucket)).begin;
    const std::vector<float>& slice = slice_[static_cast<size_t>(f.bucket)];
    GG_MPI_CHECK(MPI_Iallgatherv(slice.data(), static_cast<int>(slice.size()), MPI_FLOAT, x,
                                 c.data(), d.data(), MPI_FLOAT, gather_.get(), f.gather.out()));
    f.phase = Flight::Gather;
    f.since = Clock::now();
    moved = true;
  }
  return moved;
}

bool HierarchicalExchange::retire(std::deque<Flight>& flights) {
  bool moved = false;
  for (auto it = flights.begin(); it != flights.end();) {
    if (it->phase != Flight::Gather || !it->gather.test()) {
      check_time(*it);
      ++it;
      continue;
    }
    if (timeline_ && timeline_->enabled())
      timeline_->record("bucket " + std::to_string(it->bucket), "comm", it->started,
                        Timeline::Clock::now(), "{\"step\":" + std::to_string(it->step) + "}");
    {
      std::lock_guard lock(mu_);
      --in_flight_;
      ++progress_;
      if (it->step == step_) ++done_;
    }
    cv_.notify_all();
    it = flights.erase(it);
    moved = true;
  }
  return moved;
}

void HierarchicalExchange::fail(std::deque<Flight>& flights) {
  // The requests still open can never complete (a partner is lost): forget them rather than
  // wait for them.
  node_.mark_peer_lost();
  for (Flight& f : flights)
    for (mpi::Request* r : {&f.reduce, &f.recv, &f.send, &f.gather}) r->abandon();
  std::lock_guard lock(mu_);
  error_ = std::current_exception();
  queue_.clear();
  in_flight_ = 0;
  cv_.notify_all();
}

}  // namespace gg::gossip
