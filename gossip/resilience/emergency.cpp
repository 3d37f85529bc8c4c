// Emergency states (gossip/resilience/emergency.hpp): the saver and the supervisor's scan of what
// the savers left, then the rank's side (EmergencyState: the shared memory, the saver's start and
// restarts, the notice's signal handler) and the relaunch's reading of the survivors' states.
#include "gossip/resilience/emergency.hpp"

#include <fcntl.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <thread>

#include "gossip/comm/wait_watch.hpp"
#include "gossip/resilience/full_checkpoint.hpp"
#include "kernels/durable_file.hpp"

namespace gg::gossip {
namespace fs = std::filesystem;

namespace {

constexpr char kGoneCode = 'g';

// "rank-00000.EXT": the files a rank's saver leaves beside its state.
std::string rank_file(int rank, const char* ext) {
  char name[48];
  std::snprintf(name, sizeof name, "rank-%05d.%s", rank, ext);
  return name;
}

// A saver's "<unix seconds> <code>" file (emergency_when_name); code 0: none, or unreadable.
struct SaverEnd {
  double unix = 0;
  char code = 0;
};
SaverEnd read_saver_end(const fs::path& path) {
  std::ifstream f(path);
  SaverEnd e;
  if (!(f >> e.unix >> e.code)) return {};
  return e;
}

double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

std::string saving_mark_name(int rank) { return rank_file(rank, "saving"); }

namespace {

// One byte from the rank's pipe into `byte`: 1 when one came, 0 at the pipe's end, -1 on error.
ssize_t read_pipe(char& byte) {
  ssize_t got;
  do {
    got = ::read(kSaverPipeFd, &byte, 1);
  } while (got < 0 && errno == EINTR);
  return got;
}

// The active slot of the shared memory (`total` bytes at `p`, or none) written as the rank's
// state file; returns what happened, for the rank's line.
std::string save_active_slot(const std::string& folder, int rank, const EmergencyHeader* header,
                             const void* p, size_t total) {
  try {
    if (header == nullptr) throw std::runtime_error("cannot map the shared memory");
    const uint32_t active = header->active.load(std::memory_order_acquire);
    if (active == kNoState) return "no step boundary reached yet: nothing saved";
    const uint64_t size = header->size[active];
    const uint64_t at = kEmergencySlotsAt + active * header->capacity;
    if (active > 1 || size > header->capacity || at + size > total)
      throw std::runtime_error("the shared memory is inconsistent");
    const auto* bytes = static_cast<const uint8_t*>(p) + at;
    const std::string path = (fs::path(folder) / rank_file_name(rank)).string();
    const RankState s = decode_state(bytes, size, path);  // checks it before it goes to disk
    write_file_durably(path, bytes, size);
    return "emergency state after step " + std::to_string(s.step) + " written to " + path;
  } catch (const std::exception& e) {
    return std::string("emergency state not written: ") + e.what();
  }
}

}  // namespace

int run_emergency_saver(const std::string& folder, int rank) {
  // Nothing the rank had open but the pipe and the shared memory (hydra's sockets among them).
  std::vector<int> open_fds;
  for (const auto& entry : fs::directory_iterator("/proc/self/fd"))
    open_fds.push_back(std::atoi(entry.path().filename().c_str()));
  for (int fd : open_fds)
    if (fd > kSaverMemFd) ::close(fd);
  std::ofstream(fs::path(folder) / emergency_started_name(rank)).put('\n');
  char why = 0;
  const ssize_t got = read_pipe(why);
  struct stat st = {};
  void* p = MAP_FAILED;
  if (::fstat(kSaverMemFd, &st) == 0 && static_cast<uint64_t>(st.st_size) >= kEmergencySlotsAt)
    p = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_SHARED, kSaverMemFd, 0);
  const auto* header = p == MAP_FAILED ? nullptr : static_cast<const EmergencyHeader*>(p);
  if (got != 1 && header != nullptr && header->ended.load()) return 0;  // a clean end: no save
  {  // when and how this rank's end was seen: the supervisor names the first rank process gone
    char when[64];
    std::snprintf(when, sizeof when, "%.6f %c\n", wall_seconds(), got != 1 ? kGoneCode : why);
    std::ofstream(fs::path(folder) / emergency_when_name(rank)) << when;
  }
  const fs::path mark = fs::path(folder) / saving_mark_name(rank);
  std::ofstream(mark).put('\n');
  const std::string what =
      save_active_slot(folder, rank, header, p, static_cast<size_t>(st.st_size));
  const char* reason = got != 1             ? "the rank's process is gone (killed or crashed)"
                       : why == kNoticeByte ? "a peer process died (SIGUSR1 from the launcher)"
                                            : "a partner timed out (no notice came: a lost link?)";
  std::ofstream(fs::path(folder) / emergency_log_name(rank))
      << "gossipgrad: rank " << rank << ": " << reason << ": " << what << "\n";
  std::error_code ec;
  fs::remove(mark, ec);
  // Saved for a timeout: whether the launcher's notice still reaches this rank (the supervisor
  // sends one to all ranks) tells the supervisor whether its node can be reached at all.
  char byte = 0;
  if (got == 1 && why == kTimeoutByte && read_pipe(byte) == 1 && byte == kNoticeByte)
    std::ofstream(fs::path(folder) / emergency_reached_name(rank)).put('\n');
  return 0;
}

std::string emergency_when_name(int rank) { return rank_file(rank, "when"); }

std::string emergency_started_name(int rank) { return rank_file(rank, "started"); }

std::string emergency_reached_name(int rank) { return rank_file(rank, "reached"); }

std::string emergency_log_name(int rank) { return rank_file(rank, "log"); }

std::vector<std::string> emergency_logs(const std::string& folder, int ranks) {
  std::vector<std::string> out;
  for (int r = 0; r < ranks; ++r) {
    std::ifstream f(fs::path(folder) / emergency_log_name(r));
    for (std::string line; std::getline(f, line);) out.push_back(line);
  }
  return out;
}

EmergencyActivity emergency_activity(const std::string& folder) {
  EmergencyActivity a;
  std::error_code ec;
  for (fs::directory_iterator it(folder, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind("rank-", 0) != 0) continue;
    if (name.ends_with(".saving")) ++a.saving;
    if (name.ends_with(".bin")) ++a.states;
    if (name.ends_with(".started")) ++a.started;
    if (name.ends_with(".when") && read_saver_end(it->path()).code == kTimeoutByte) ++a.timeouts;
  }
  return a;
}

EmergencyScan scan_emergency_states(const std::string& folder, int ranks, double ended_unix) {
  EmergencyScan scan;
  // When every save was for a partner timeout (no process died: a link did), the ranks that the
  // supervisor's notice reached afterwards are the connected ones; the others' nodes are cut off.
  std::vector<SaverEnd> ends(static_cast<size_t>(ranks));
  std::vector<char> code(static_cast<size_t>(ranks), 0);
  std::vector<bool> reached(static_cast<size_t>(ranks), false);
  for (int r = 0; r < ranks; ++r) {
    const SaverEnd e = ends[static_cast<size_t>(r)] =
        read_saver_end(fs::path(folder) / emergency_when_name(r));
    if (e.code == 0) continue;
    if (ended_unix > 0 && e.unix >= ended_unix) continue;  // ended by the supervisor: says nothing
    const char c = code[static_cast<size_t>(r)] = e.code;
    reached[static_cast<size_t>(r)] =
        c == kNoticeByte || fs::exists(fs::path(folder) / emergency_reached_name(r));
  }
  const bool timeouts_only =
      std::all_of(code.begin(), code.end(), [](char c) { return c == 0 || c == kTimeoutByte; }) &&
      std::any_of(code.begin(), code.end(), [](char c) { return c == kTimeoutByte; });
  const bool any_reached = std::any_of(reached.begin(), reached.end(), [](bool b) { return b; });
  bool first = true;
  for (int r = 0; r < ranks; ++r) {
    const std::string path = (fs::path(folder) / rank_file_name(r)).string();
    struct stat st = {};
    if (::stat(path.c_str(), &st) != 0) {
      scan.lost.push_back(r);
      continue;
    }
    if (timeouts_only && any_reached && !reached[static_cast<size_t>(r)]) {
      scan.lost.push_back(r);
      scan.unreachable.push_back(r);
      continue;
    }
    try {
      const std::vector<uint8_t> bytes = read_file(path);
      const RankState s = decode_state(bytes.data(), bytes.size(), path);
      if (s.rank != r || s.ranks != ranks)
        throw std::runtime_error(path + ": written by rank " + std::to_string(s.rank) + " of " +
                                 std::to_string(s.ranks) + ", expected rank " + std::to_string(r) +
                                 " of " + std::to_string(ranks));
      scan.min_step = first ? s.step : std::min(scan.min_step, s.step);
      scan.max_step = first ? s.step : std::max(scan.max_step, s.step);
      double t = static_cast<double>(st.st_mtim.tv_sec) + 1e-9 * st.st_mtim.tv_nsec;
      const SaverEnd& e = ends[static_cast<size_t>(r)];
      if (e.code != 0) {
        t = e.unix;
        if (e.code == kGoneCode && (scan.first_gone < 0 || e.unix < scan.first_gone_unix)) {
          scan.first_gone = r;
          scan.first_gone_unix = e.unix;
        }
      }
      scan.first_written_unix = first ? t : std::min(scan.first_written_unix, t);
      first = false;
      scan.survivors.push_back(r);
    } catch (const std::exception& e) {
      if (scan.corrupt.empty()) scan.corrupt = e.what();
    }
  }
  return scan;
}

void write_recovery_plan(const std::string& folder, const RecoveryPlan& p) {
  const nlohmann::json j = {{"format", "gossipgrad-recovery-plan"},
                            {"survivors", p.survivors},
                            {"lost", p.lost},
                            {"first_gone", p.first_gone},
                            {"ranks_before", p.ranks_before},
                            {"step", p.step},
                            {"steps_redone", p.steps_redone},
                            {"failed_unix", p.failed_unix},
                            {"replace", p.replace}};
  kernels::write_file_durably((fs::path(folder) / kRecoveryPlanFile).string(), j.dump() + "\n");
}

RecoveryPlan read_recovery_plan(const std::string& folder) {
  const std::string path = (fs::path(folder) / kRecoveryPlanFile).string();
  std::ifstream f(path);
  if (!f) throw std::runtime_error(path + " is missing");
  RecoveryPlan p;
  try {
    const nlohmann::json j = nlohmann::json::parse(f);
    if (j.value("format", "") != "gossipgrad-recovery-plan")
      throw std::runtime_error("not a recovery plan");
    p.survivors = j.at("survivors").get<std::vector<int>>();
    p.lost = j.at("lost").get<std::vector<int>>();
    p.first_gone = j.at("first_gone").get<int>();
    p.ranks_before = j.at("ranks_before").get<int>();
    p.step = j.at("step").get<int64_t>();
    p.steps_redone = j.at("steps_redone").get<int64_t>();
    p.failed_unix = j.at("failed_unix").get<double>();
    p.replace = j.value("replace", false);
    if (p.survivors.empty() || p.step < 0 || p.ranks_before < 1)
      throw std::runtime_error("survivors, step or ranks_before out of range");
    for (int r : p.survivors)
      if (r < 0 || r >= p.ranks_before) throw std::runtime_error("a survivor out of range");
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(path + ": malformed (" + std::string(e.what()) + ")");
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(path + ": " + e.what());
  }
  return p;
}

namespace {

// Set once in the constructor, read by the signal handler.
volatile std::sig_atomic_t g_notified = 0;  // SIGUSR1 came
std::atomic<bool> g_handling{false};        // a save was asked for; every thread parks
int g_devnull = -1;
int g_saver_pipe = -1;  // the writing end of the saver's pipe
bool g_installed = false;
EmergencyState* g_instance = nullptr;  // the watchdog's timeout handler saves through it

// Hydra's proxy, once it has reaped a dead rank, kills every other rank of the node at the next
// output any of them writes (MPICH 4.0.2, -disable-auto-cleanup). So from the notice on, this
// process's stdout and stderr go to /dev/null (their pipes stay open through the copies kept at
// install: a closed pipe would be an event too). dup2 and write are async-signal-safe.
void silence_output() {
  if (g_devnull < 0) return;
  ::dup2(g_devnull, STDOUT_FILENO);
  ::dup2(g_devnull, STDERR_FILENO);
}

void tell_saver(char why) {
  if (g_saver_pipe < 0) return;
  while (::write(g_saver_pipe, &why, 1) < 0 && errno == EINTR) {
  }
}

void on_notice(int) {
  silence_output();
  if (g_notified) return;
  g_notified = 1;
  tell_saver(kNoticeByte);
}

void install_handler() {
  if (g_installed) return;
  g_devnull = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
  (void)::fcntl(STDOUT_FILENO, F_DUPFD_CLOEXEC, 10);  // kept open for the process's life
  (void)::fcntl(STDERR_FILENO, F_DUPFD_CLOEXEC, 10);
  struct sigaction sa = {};
  sa.sa_handler = on_notice;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  // Left installed for the process's life: SIGUSR1's default action would kill a rank that hears
  // of a death after training (during MPI_Finalize), and nothing else of ours uses it.
  sigaction(SIGUSR1, &sa, nullptr);
  g_installed = true;
}

[[noreturn]] void fail(const std::string& what) {
  throw std::runtime_error("emergency state: " + what + ": " + std::strerror(errno));
}

}  // namespace

std::unique_ptr<EmergencyState> EmergencyState::from_environment(int rank, int ranks) {
  const char* dir = std::getenv(kEmergencyDirEnv);
  if (dir == nullptr || *dir == '\0') return nullptr;
  return std::make_unique<EmergencyState>(dir, rank, ranks);
}

EmergencyState::EmergencyState(std::string folder, int rank, int ranks)
    : folder_(std::move(folder)), rank_(rank), ranks_(ranks) {
  memfd_ = ::memfd_create("gossipgrad-emergency", MFD_CLOEXEC);
  if (memfd_ < 0) fail("memfd_create");
  reserve(0);
  start_saver();
  install_handler();
  // A blocking collective that outlasts gossip.timeout_s (a partner timeout outside the gossip
  // exchange) saves too, instead of MPI_Abort.
  g_instance = this;
  mpi::set_wait_timeout_handler([] { g_instance->save_and_wait(); });
}

void EmergencyState::start_saver() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) fail("pipe");
  // The saver: this program again, in a session of its own, with no output (output reaches
  // hydra's proxy, see silence_output) and only its pipe and the shared memory open.
  posix_spawn_file_actions_t actions;
  posix_spawnattr_t attr;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, fds[0], kSaverPipeFd);
  posix_spawn_file_actions_adddup2(&actions, memfd_, kSaverMemFd);
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSID);
  const std::string rank_text = std::to_string(rank_);
  std::vector<char*> argv = {const_cast<char*>("gossipgrad"), const_cast<char*>("_emergency-saver"),
                             folder_.data(), const_cast<char*>(rank_text.c_str()), nullptr};
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, "/proc/self/exe", &actions, &attr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  ::close(fds[0]);
  if (rc != 0) {
    ::close(fds[1]);
    errno = rc;
    fail("cannot start the saver");
  }
  saver_ = pid;
  const int old = g_saver_pipe;
  g_saver_pipe = fds[1];
  if (old >= 0) ::close(old);
}

void EmergencyState::check_saver() {
  if (saver_ <= 0) return;
  int status = 0;
  const pid_t r = ::waitpid(saver_, &status, WNOHANG);
  // Reaped by someone else (SIGCHLD ignored): gone when no such process is left.
  if (r == 0 || (r < 0 && !(errno == ECHILD && ::kill(saver_, 0) != 0 && errno == ESRCH))) return;
  // The saver is this rank's only protection: without it a death of this rank loses its state.
  const std::string how = r != saver_ ? std::string("ended")
                          : WIFSIGNALED(status)
                              ? "was killed by signal " + std::to_string(WTERMSIG(status))
                              : "exited with code " + std::to_string(WEXITSTATUS(status));
  const pid_t gone = saver_;
  saver_ = -1;
  std::string what;
  if (++saver_restarts_ > kSaverRestarts) {
    what = "not restarted again (" + std::to_string(kSaverRestarts) +
           " restarts): this rank's state is lost if it dies";
  } else {
    try {
      start_saver();
      what = "started a new one (pid " + std::to_string(saver_) + ")";
    } catch (const std::exception& e) {
      what = std::string(e.what()) + ": this rank's state is lost if it dies";
    }
  }
  std::fprintf(stderr, "gossipgrad: rank %d: warning: its emergency saver (pid %d) %s: %s\n", rank_,
               static_cast<int>(gone), how.c_str(), what.c_str());
  std::fflush(stderr);
}

EmergencyState::~EmergencyState() {
  mpi::set_wait_timeout_handler(nullptr);
  g_instance = nullptr;
  const int pipe = g_saver_pipe;
  g_saver_pipe = -1;
  if (shared_ != nullptr) shared_->ended.store(1);
  if (pipe >= 0) ::close(pipe);  // the saver ends without saving
  if (saver_ > 0) ::waitpid(saver_, nullptr, 0);
  if (shared_ != nullptr) ::munmap(shared_, mapped_);
  if (memfd_ >= 0) ::close(memfd_);
}

bool EmergencyState::handling() { return g_notified != 0 || g_handling.load(); }

void EmergencyState::park() {
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}

void EmergencyState::reserve(size_t bytes) {
  if (shared_ != nullptr && shared_->capacity >= bytes) return;
  const size_t capacity = bytes + bytes / 8;  // a little room: the state's size rarely changes
  const size_t total = kEmergencySlotsAt + 2 * capacity;
  if (::ftruncate(memfd_, static_cast<off_t>(total)) != 0) fail("cannot size the shared memory");
  if (shared_ != nullptr) {
    shared_->active.store(kNoState);  // the slots move: no state until the next one is complete
    ::munmap(shared_, mapped_);
  }
  void* p = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, memfd_, 0);
  if (p == MAP_FAILED) fail("cannot map the shared memory");
  shared_ = static_cast<EmergencyHeader*>(p);
  mapped_ = total;
  shared_->active.store(kNoState);
  shared_->ended.store(0);
  shared_->capacity = capacity;
}

void EmergencyState::keep(const std::function<void(RankState&)>& capture) {
  if (handling()) park();
  check_saver();
  capture(scratch_);  // may wait for a pending weight exchange
  scratch_.rank = rank_;
  scratch_.ranks = ranks_;
  scratch_.shuffle.clear();  // a relaunch reassigns the samples (forward recovery)
  reserve(encode_state_into(scratch_, nullptr));
  const uint32_t active = shared_->active.load(std::memory_order_acquire);
  const uint32_t next = active == 0 ? 1 : 0;
  uint8_t* slot =
      reinterpret_cast<uint8_t*>(shared_) + kEmergencySlotsAt + next * shared_->capacity;
  shared_->size[next] = encode_state_into(scratch_, slot);
  // The saver reads the slot `active` names: a notice from here on parks this rank before it
  // writes that slot again.
  shared_->active.store(next, std::memory_order_release);
}

void EmergencyState::save_and_wait() {
  bool first = false;
  if (g_handling.compare_exchange_strong(first, true)) {
    silence_output();
    if (!g_notified) tell_saver(kTimeoutByte);
  }
  // Under hydra, the first survivor to exit gets the others killed: the supervisor ends the job
  // once the saves are done. Without one, exit in the end.
  std::this_thread::sleep_for(std::chrono::seconds(kEmergencyWaitSeconds));
  std::_Exit(kEmergencyExit);  // no MPI_Finalize: it would wait for the dead rank
}

namespace {

// The rank whose state `slot`, lost, starts from (supervise --replace-lost): the survivor it
// last sent to (its schedule partner, which mixed its latest contribution), looking back over
// the steps before `step`; the lowest survivor if none is found.
int replacement_source(const partners::Schedule& schedule, const RecoveryPlan& plan, int slot) {
  const auto survived = [&](int r) {
    return std::find(plan.survivors.begin(), plan.survivors.end(), r) != plan.survivors.end();
  };
  if (survived(slot)) return slot;
  for (int64_t t = plan.step - 1, seen = 0; t >= 0 && seen < 4 * plan.ranks_before; --t, ++seen) {
    const int to = partners::partners(schedule, slot, t).send_to;
    if (survived(to)) return to;
  }
  return plan.survivors.front();
}

// This rank's survivor state in `from` (the failed attempt's folder), checked against the plan.
SurvivorState read_survivor_state(const std::string& from, int rank, int ranks,
                                  const std::function<partners::Schedule(int ranks)>& schedule) {
  SurvivorState s;
  RecoveryPlan& plan = s.plan;
  plan = read_recovery_plan(from);
  if (plan.ranks_after() != ranks)
    throw std::runtime_error(from + " plans for " + std::to_string(plan.ranks_after()) +
                             " ranks, this job has " + std::to_string(ranks));
  const int old = plan.replace ? replacement_source(schedule(plan.ranks_before), plan, rank)
                               : plan.survivors[static_cast<size_t>(rank)];
  const std::string path = (fs::path(from) / rank_file_name(old)).string();
  const std::vector<uint8_t> bytes = read_file(path);
  s.state = decode_state(bytes.data(), bytes.size(), path);
  if (s.state.rank != old || s.state.ranks != plan.ranks_before || s.state.step < plan.step)
    throw std::runtime_error(path + ": rank, ranks or step differ from the recovery plan");
  return s;
}

}  // namespace

std::optional<SurvivorState> take_emergency_states(
    const mpi::Comm& world, const std::function<partners::Schedule(int ranks)>& schedule) {
  const char* from = std::getenv(kEmergencyFromEnv);
  if (from == nullptr || *from == '\0') return std::nullopt;
  std::string error;
  SurvivorState s;
  try {
    s = read_survivor_state(from, world.rank(), world.size(), schedule);
  } catch (const std::exception& e) {
    error = e.what();
  }
  const mpi::RankError agreed = mpi::agree_on_error(world, {error, false});
  if (!agreed.message.empty()) {
    if (world.rank() == 0) {
      std::printf(
          "gossipgrad: emergency state unusable (%s): resuming from the newest full checkpoint "
          "instead\n",
          agreed.message.c_str());
      std::fflush(stdout);
    }
    return std::nullopt;
  }
  return s;
}

}  // namespace gg::gossip
