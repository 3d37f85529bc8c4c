#include "gossip/comm/mpi.hpp"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "gossip/comm/wait_watch.hpp"

namespace gg::mpi {

void fail(int code, const char* call, const char* file, int line) {
  char msg[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  MPI_Error_string(code, msg, &len);
  throw MpiError(std::string(call) + " failed at " + file + ":" + std::to_string(line) + ": " +
                 std::string(msg, len));
}

Environment::Environment(int* argc, char*** argv) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) GG_MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided_));
  GG_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
}

Environment::~Environment() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

Comm::~Comm() {
  if (owned_ && c_ != MPI_COMM_NULL) MPI_Comm_free(&c_);
}

Comm& Comm::operator=(Comm&& o) noexcept {
  if (this != &o) {
    if (owned_ && c_ != MPI_COMM_NULL) MPI_Comm_free(&c_);
    c_ = std::exchange(o.c_, MPI_COMM_NULL);
    owned_ = o.owned_;
    lost_ = std::move(o.lost_);
  }
  return *this;
}

int Comm::rank() const {
  int r = 0;
  GG_MPI_CHECK(MPI_Comm_rank(c_, &r));
  return r;
}

int Comm::size() const {
  int s = 0;
  GG_MPI_CHECK(MPI_Comm_size(c_, &s));
  return s;
}

Comm Comm::dup() const {
  MPI_Comm c;
  const WatchedWait wait("MPI_Comm_dup");  // a collective: bounded like the others
  GG_MPI_CHECK(MPI_Comm_dup(c_, &c));
  GG_MPI_CHECK(MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN));
  return Comm(c, true, lost_);
}

Comm Comm::split_shared() const {
  MPI_Comm c;
  // Test hook: GG_RANKS_PER_NODE=N pretends that every N consecutive ranks form a node, so that
  // the paths across nodes (auto's p2p half) run on one machine.
  const char* per_node = std::getenv("GG_RANKS_PER_NODE");
  const WatchedWait wait("MPI_Comm_split_type");
  if (per_node != nullptr && *per_node != '\0') {
    char* end = nullptr;
    const long n = std::strtol(per_node, &end, 10);
    if (*end != '\0' || n < 1 || n > (1L << 30))
      throw std::invalid_argument(std::string("GG_RANKS_PER_NODE = ") + per_node +
                                  ": must be a positive number of ranks (or unset)");
    GG_MPI_CHECK(MPI_Comm_split(c_, rank() / static_cast<int>(n), rank(), &c));
  } else {
    GG_MPI_CHECK(MPI_Comm_split_type(c_, MPI_COMM_TYPE_SHARED, rank(), MPI_INFO_NULL, &c));
  }
  GG_MPI_CHECK(MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN));
  return Comm(c, true, lost_);
}

Comm Comm::split(int color, int key) const {
  MPI_Comm c;
  {
    const WatchedWait wait("MPI_Comm_split");
    GG_MPI_CHECK(MPI_Comm_split(c_, color, key, &c));
  }
  GG_MPI_CHECK(MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN));
  return Comm(c, true, lost_);
}

void Comm::barrier() const {
  const WatchedWait wait("MPI_Barrier");
  GG_MPI_CHECK(MPI_Barrier(c_));
}

namespace {
template <typename T>
void allreduce_chunks(MPI_Comm c, T* data, int64_t count, MPI_Datatype type, MPI_Op op) {
  const WatchedWait wait("MPI_Allreduce");
  for (int64_t off = 0; off < count; off += kMaxCount) {
    const int n = static_cast<int>(std::min(kMaxCount, count - off));
    GG_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, data + off, n, type, op, c));
  }
}
}  // namespace

void Comm::allreduce_sum(float* d, int64_t n) const {
  allreduce_chunks(c_, d, n, MPI_FLOAT, MPI_SUM);
}
void Comm::allreduce_sum(double* d, int64_t n) const {
  allreduce_chunks(c_, d, n, MPI_DOUBLE, MPI_SUM);
}
void Comm::allreduce_sum(int64_t* d, int64_t n) const {
  allreduce_chunks(c_, d, n, MPI_INT64_T, MPI_SUM);
}
void Comm::allreduce_max(double* d, int64_t n) const {
  allreduce_chunks(c_, d, n, MPI_DOUBLE, MPI_MAX);
}

Request Comm::iallreduce_max(double* d, int n) const {
  Request r;
  GG_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, d, n, MPI_DOUBLE, MPI_MAX, c_, r.out()));
  return r;
}

void Comm::broadcast(float* d, int64_t count, int root) const {
  const WatchedWait wait("MPI_Bcast");
  for (int64_t off = 0; off < count; off += kMaxCount) {
    const int n = static_cast<int>(std::min(kMaxCount, count - off));
    GG_MPI_CHECK(MPI_Bcast(d + off, n, MPI_FLOAT, root, c_));
  }
}

void Comm::broadcast(std::string& s, int root) const {
  const WatchedWait wait("MPI_Bcast");
  int64_t len = static_cast<int64_t>(s.size());
  GG_MPI_CHECK(MPI_Bcast(&len, 1, MPI_INT64_T, root, c_));
  s.resize(len);
  if (len > 0) GG_MPI_CHECK(MPI_Bcast(s.data(), static_cast<int>(len), MPI_CHAR, root, c_));
}

void Comm::allgather(const double* mine, int count, double* all) const {
  const WatchedWait wait("MPI_Allgather");
  GG_MPI_CHECK(MPI_Allgather(mine, count, MPI_DOUBLE, all, count, MPI_DOUBLE, c_));
}

void Comm::send_bytes(const std::vector<uint8_t>& bytes, int to, int tag) const {
  if (static_cast<int64_t>(bytes.size()) > kMaxCount)
    throw std::logic_error("send_bytes: more than kMaxCount bytes in one message");
  GG_MPI_CHECK(MPI_Send(bytes.data(), static_cast<int>(bytes.size()), MPI_BYTE, to, tag, c_));
}

std::vector<uint8_t> Comm::recv_bytes(int from, int tag) const {
  MPI_Status st;
  const WatchedWait wait("MPI_Probe");
  GG_MPI_CHECK(MPI_Probe(from, tag, c_, &st));
  int bytes = 0;
  GG_MPI_CHECK(MPI_Get_count(&st, MPI_BYTE, &bytes));
  std::vector<uint8_t> out(static_cast<size_t>(bytes));
  GG_MPI_CHECK(MPI_Recv(out.data(), bytes, MPI_BYTE, from, tag, c_, MPI_STATUS_IGNORE));
  return out;
}

std::optional<std::vector<uint8_t>> Comm::try_recv_bytes(int tag) const {
  MPI_Status st;
  int here = 0;
  GG_MPI_CHECK(MPI_Iprobe(MPI_ANY_SOURCE, tag, c_, &here, &st));
  if (!here) return std::nullopt;
  return recv_bytes(st.MPI_SOURCE, tag);
}

Comm Comm::without(const std::vector<int>& excluded, int tag) const {
  MPI_Group all = MPI_GROUP_NULL, kept = MPI_GROUP_NULL;
  GG_MPI_CHECK(MPI_Comm_group(c_, &all));
  GG_MPI_CHECK(MPI_Group_excl(all, static_cast<int>(excluded.size()), excluded.data(), &kept));
  MPI_Comm next = MPI_COMM_NULL;
  const int rc = MPI_Comm_create_group(c_, kept, tag, &next);
  MPI_Group_free(&kept);
  MPI_Group_free(&all);
  GG_MPI_CHECK(rc);
  return Comm(next, true, lost_);
}

void abort_job(int code) {
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);  // MPI_Abort does not return
}

RankError agree_on_error(const Comm& comm, const RankError& mine) {
  // The max of the negated ranks is the lowest failing rank (size() when none failed).
  double lowest = -(mine.message.empty() ? comm.size() : comm.rank());
  comm.allreduce_max(&lowest, 1);
  const int first = static_cast<int>(-lowest);
  if (first >= comm.size()) return {};
  std::string wire = (mine.usage ? "U" : "R") + mine.message;
  comm.broadcast(wire, first);
  return {wire.substr(1), wire[0] == 'U'};
}

Request::~Request() {
  if (r_ != MPI_REQUEST_NULL) MPI_Wait(&r_, MPI_STATUS_IGNORE);
}

Request& Request::operator=(Request&& o) noexcept {
  if (this != &o) {
    if (r_ != MPI_REQUEST_NULL) MPI_Wait(&r_, MPI_STATUS_IGNORE);
    r_ = std::exchange(o.r_, MPI_REQUEST_NULL);
  }
  return *this;
}

void Request::wait() {
  if (r_ == MPI_REQUEST_NULL) return;
  const WatchedWait wait("MPI_Wait");
  GG_MPI_CHECK(MPI_Wait(&r_, MPI_STATUS_IGNORE));
}

bool Request::test() {
  int done = 1;
  if (r_ != MPI_REQUEST_NULL) GG_MPI_CHECK(MPI_Test(&r_, &done, MPI_STATUS_IGNORE));
  return done != 0;
}

Window::Window(const Comm& comm, int64_t bytes, Kind kind)
    : lost_(comm.lost_), bytes_(bytes), kind_(kind) {
  const MPI_Aint size = static_cast<MPI_Aint>(bytes);
  if (kind == Kind::Shared) {
    // Non-contiguous: every rank's segment starts on its own page (and so its own cache line),
    // in memory first touched by its owner.
    MPI_Info info;
    GG_MPI_CHECK(MPI_Info_create(&info));
    GG_MPI_CHECK(MPI_Info_set(info, "alloc_shared_noncontig", "true"));
    const int rc = MPI_Win_allocate_shared(size, 1, info, comm.get(), &base_, &w_);
    MPI_Info_free(&info);
    GG_MPI_CHECK(rc);
  } else {
    GG_MPI_CHECK(MPI_Win_allocate(size, 1, MPI_INFO_NULL, comm.get(), &base_, &w_));
  }
  GG_MPI_CHECK(MPI_Win_set_errhandler(w_, MPI_ERRORS_RETURN));
}

void Comm::mark_peer_lost() const {
  if (lost_) *lost_ = true;
}

bool Comm::peer_lost() const { return lost_ && lost_->load(); }

Window::~Window() {
  if (w_ != MPI_WIN_NULL && !(lost_ && lost_->load())) MPI_Win_free(&w_);
}

void* Window::shared_base(int rank) const {
  if (kind_ != Kind::Shared) throw std::logic_error("shared_base on a non-shared window");
  MPI_Aint size = 0;
  int disp = 0;
  void* p = nullptr;
  GG_MPI_CHECK(MPI_Win_shared_query(w_, rank, &size, &disp, &p));
  return p;
}

}  // namespace gg::mpi
