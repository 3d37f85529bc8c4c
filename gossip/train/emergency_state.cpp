#include "gossip/train/emergency_state.hpp"

#include <fcntl.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <thread>
#include <vector>

#include "gossip/comm/wait_watch.hpp"
#include "gossip/resilience/emergency.hpp"
#include "gossip/resilience/full_checkpoint.hpp"
#include "gossip/train/trainer.hpp"

namespace gg::gossip {
namespace {

namespace fs = std::filesystem;

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

class KeepAtBoundary : public StepHook {
 public:
  KeepAtBoundary(Group& g, EmergencyState& e) : g_(g), e_(e) {}
  void before_step(int64_t, shuffle::Batch&) override {
    if (EmergencyState::handling()) EmergencyState::park();
  }
  void after_step(StepRecord&) override { e_.keep(g_); }

 private:
  Group& g_;
  EmergencyState& e_;
};

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

void EmergencyState::keep(Group& g) {
  if (handling()) park();
  check_saver();
  g.trainer.capture_state(scratch_);  // may wait for a pending weight exchange
  scratch_.rank = rank_;
  scratch_.ranks = ranks_;
  scratch_.steps_per_epoch = g.per_epoch;
  scratch_.nan_restores = g.recovery.guard().restores();
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

std::unique_ptr<StepHook> make_emergency_hook(Group& g, EmergencyState& e) {
  return std::make_unique<KeepAtBoundary>(g, e);
}

namespace {

// The rank whose state `slot`, lost, starts from (supervise --replace-lost): the survivor it
// last sent to (its schedule partner, which mixed its latest contribution), looking back over
// the steps before `step`; the lowest survivor if none is found.
int replacement_source(const Config& c, const RecoveryPlan& plan, int slot) {
  const auto survived = [&](int r) {
    return std::find(plan.survivors.begin(), plan.survivors.end(), r) != plan.survivors.end();
  };
  if (survived(slot)) return slot;
  const partners::Schedule schedule = gossip_schedule(c, plan.ranks_before);
  for (int64_t t = plan.step - 1, seen = 0; t >= 0 && seen < 4 * plan.ranks_before; --t, ++seen) {
    const int to = partners::partners(schedule, slot, t).send_to;
    if (survived(to)) return to;
  }
  return plan.survivors.front();
}

}  // namespace

bool take_emergency_states(const Config& c, const mpi::Comm& world, JobState& job) {
  const char* from = std::getenv(kEmergencyFromEnv);
  if (from == nullptr || *from == '\0') return false;
  std::string error;
  RankState s;
  RecoveryPlan plan;
  try {
    plan = read_recovery_plan(from);
    if (plan.ranks_after() != world.size())
      throw std::runtime_error(std::string(from) + " plans for " +
                               std::to_string(plan.ranks_after()) + " ranks, this job has " +
                               std::to_string(world.size()));
    const int old = plan.replace ? replacement_source(c, plan, world.rank())
                                 : plan.survivors[static_cast<size_t>(world.rank())];
    const std::string path = (fs::path(from) / rank_file_name(old)).string();
    const std::vector<uint8_t> bytes = read_file(path);
    s = decode_state(bytes.data(), bytes.size(), path);
    if (s.rank != old || s.ranks != plan.ranks_before || s.step < plan.step)
      throw std::runtime_error(path + ": rank, ranks or step differ from the recovery plan");
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
    return false;
  }
  job.carry_per_epoch = s.steps_per_epoch;
  job.carry_step = plan.step;
  job.carry = std::move(s);
  job.real_failure = plan;
  return true;
}

}  // namespace gg::gossip
