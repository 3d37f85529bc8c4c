// RAII over the MPI calls gossipgrad uses. Every call is checked: a failure throws MpiError
// naming the call, the file, the line and MPI's own error string.
#pragma once

#include <mpi.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace gg::mpi {

struct MpiError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

[[noreturn]] void fail(int code, const char* call, const char* file, int line);

#define GG_MPI_CHECK(call)                                                                 \
  do {                                                                                     \
    const int gg_mpi_rc_ = (call);                                                         \
    if (gg_mpi_rc_ != MPI_SUCCESS) ::gg::mpi::fail(gg_mpi_rc_, #call, __FILE__, __LINE__); \
  } while (0)

// MPI_Init_thread(MPI_THREAD_MULTIPLE) on construction, MPI_Finalize on destruction. Errors are
// returned (MPI_ERRORS_RETURN) so they become exceptions instead of aborts.
class Environment {
 public:
  Environment(int* argc, char*** argv);
  ~Environment();
  Environment(const Environment&) = delete;
  Environment& operator=(const Environment&) = delete;
  int thread_level() const { return provided_; }

 private:
  int provided_ = 0;
};

class Request;
class Window;

// A communicator; owns (and frees) the ones it created by splitting or duplicating. It carries
// the peer-lost state, shared with every communicator made from it (dup, split_shared, without):
// set once a partner is known to be dead or hung (a wait on it timed out), when collective
// teardown (MPI_Win_free, MPI_Win_unlock_all) would block forever, so windows are then left to
// the job's end instead of freed.
class Comm {
 public:
  static Comm world() { return Comm(MPI_COMM_WORLD, false); }
  static Comm self() { return Comm(MPI_COMM_SELF, false); }
  // Takes ownership of a communicator made elsewhere (MPI_Comm_create_group).
  static Comm adopt(MPI_Comm c) { return Comm(c, true); }
  Comm() = default;
  ~Comm();
  Comm(Comm&& o) noexcept
      : c_(std::exchange(o.c_, MPI_COMM_NULL)), owned_(o.owned_), lost_(std::move(o.lost_)) {}
  Comm& operator=(Comm&& o) noexcept;
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  MPI_Comm get() const { return c_; }
  // The peer-lost state of this communicator's family (see above).
  void mark_peer_lost() const;
  bool peer_lost() const;
  int rank() const;
  int size() const;
  Comm dup() const;
  Comm split_shared() const;             // the ranks on this node (MPI_COMM_TYPE_SHARED)
  Comm split(int color, int key) const;  // MPI_Comm_split, bounded by the wait watchdog

  void barrier() const;
  void allreduce_sum(float* data, int64_t count) const;  // in place
  void allreduce_sum(double* data, int64_t count) const;
  void allreduce_sum(int64_t* data, int64_t count) const;
  void allreduce_max(double* data, int64_t count) const;
  // Nonblocking MPI_Allreduce(MAX) in place: `data` must outlive the returned request.
  Request iallreduce_max(double* data, int count) const;
  void broadcast(float* data, int64_t count, int root) const;
  void broadcast(std::string& s, int root) const;
  // Every rank's `count` values, in rank order, into `all` (count * size() values).
  void allgather(const double* mine, int count, double* all) const;

  // Point to point: a message of bytes (at most kMaxCount) to rank `to`, and the next one from
  // `from` with `tag`, whatever its length (bounded by the wait watchdog).
  void send_bytes(const std::vector<uint8_t>& bytes, int to, int tag) const;
  std::vector<uint8_t> recv_bytes(int from, int tag) const;
  // The next message with `tag` from any rank if one has arrived (MPI_Iprobe), without waiting.
  std::optional<std::vector<uint8_t>> try_recv_bytes(int tag) const;

  // The ranks of this communicator but `excluded`, over a new one that they alone make
  // (MPI_Comm_create_group with `tag`: the excluded ranks take no part).
  Comm without(const std::vector<int>& excluded, int tag) const;

 private:
  using LostFlag = std::shared_ptr<std::atomic<bool>>;
  friend class Window;  // keeps the flag: its teardown asks it
  Comm(MPI_Comm c, bool owned) : c_(c), owned_(owned) {}
  Comm(MPI_Comm c, bool owned, LostFlag lost) : c_(c), owned_(owned), lost_(std::move(lost)) {}
  MPI_Comm c_ = MPI_COMM_NULL;
  bool owned_ = false;
  LostFlag lost_ = std::make_shared<std::atomic<bool>>(false);
};

// Ends every rank of the job at once with `code` (MPI_Abort on the world); never returns.
[[noreturn]] void abort_job(int code);

// An error one rank met in work that every rank does together (opening the data, reading a
// checkpoint); an empty message means none.
struct RankError {
  std::string message;
  bool usage = false;  // the user's mistake (exit 2), not a runtime failure (exit 1)
};
// Every rank learns the error of the lowest-numbered rank that failed, so that all ranks stop with
// one and the same line (a collective). Returns an empty RankError when no rank failed.
RankError agree_on_error(const Comm& comm, const RankError& mine);

// A nonblocking request; waits on destruction if still active so buffers are never freed early.
class Request {
 public:
  Request() = default;
  ~Request();
  Request(Request&& o) noexcept : r_(std::exchange(o.r_, MPI_REQUEST_NULL)) {}
  Request& operator=(Request&& o) noexcept;
  MPI_Request* out() { return &r_; }
  void wait();
  bool test();
  // Forgets a request that can never complete (a partner is lost) without waiting for it.
  void abandon() { r_ = MPI_REQUEST_NULL; }

 private:
  MPI_Request r_ = MPI_REQUEST_NULL;
};

// An RMA window over memory MPI allocates (MPI_Win_allocate or, on a node communicator,
// MPI_Win_allocate_shared). Freed on destruction, which must happen before MPI_Finalize, unless
// its communicator's peer is lost (then left to the job's end).
class Window {
 public:
  enum class Kind { Allocate, Shared };
  Window(const Comm& comm, int64_t bytes, Kind kind);
  ~Window();
  Window(const Window&) = delete;
  Window& operator=(const Window&) = delete;
  MPI_Win get() const { return w_; }
  void* base() const { return base_; }
  int64_t bytes() const { return bytes_; }
  void* shared_base(int rank) const;  // Kind::Shared only: another rank's segment

 private:
  MPI_Win w_ = MPI_WIN_NULL;
  std::shared_ptr<std::atomic<bool>> lost_;  // its communicator's peer-lost state
  void* base_ = nullptr;
  int64_t bytes_ = 0;
  Kind kind_;
};

// MPI counts are int: large buffers go in chunks.
constexpr int64_t kMaxCount = int64_t{1} << 30;

}  // namespace gg::mpi
