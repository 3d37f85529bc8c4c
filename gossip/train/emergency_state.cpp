#include "gossip/train/emergency_state.hpp"

#include <semaphore.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>

#include "gossip/resilience/emergency.hpp"
#include "gossip/resilience/full_checkpoint.hpp"

namespace gg::gossip {
namespace {

namespace fs = std::filesystem;

sem_t g_notice;                             // posted by the handler, awaited by the watcher
volatile std::sig_atomic_t g_notified = 0;  // SIGUSR1 came
std::atomic<bool> g_handling{false};        // one thread saves; every other one parks
bool g_installed = false;

void on_notice(int) {
  g_notified = 1;
  sem_post(&g_notice);  // async-signal-safe
}

void install_handler() {
  if (g_installed) return;
  sem_init(&g_notice, 0, 0);
  struct sigaction sa = {};
  sa.sa_handler = on_notice;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  // Left installed for the process's life: SIGUSR1's default action would kill a rank that hears
  // of a death after training (during MPI_Finalize), and nothing else of ours uses it.
  sigaction(SIGUSR1, &sa, nullptr);
  g_installed = true;
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
  install_handler();
  watcher_ = std::thread([this] { watch(); });
}

EmergencyState::~EmergencyState() {
  done_ = true;
  sem_post(&g_notice);
  watcher_.join();
}

bool EmergencyState::handling() { return g_handling.load(); }

void EmergencyState::park() {
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}

void EmergencyState::watch() {
  while (!done_) {
    struct timespec until = {};
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_nsec += 200'000'000;
    if (until.tv_nsec >= 1'000'000'000) {
      until.tv_sec += 1;
      until.tv_nsec -= 1'000'000'000;
    }
    sem_timedwait(&g_notice, &until);
    if (g_notified && !done_) save_and_exit("a peer process died (SIGUSR1 from the launcher)");
  }
}

void EmergencyState::keep(Group& g) {
  if (handling()) park();
  g.trainer.capture_state(scratch_);  // may wait for a pending weight exchange: no lock held
  scratch_.rank = rank_;
  scratch_.ranks = ranks_;
  scratch_.steps_per_epoch = g.per_epoch;
  scratch_.nan_restores = g.recovery.nan_restores();
  scratch_.shuffle.clear();  // a relaunch reassigns the samples (forward recovery)
  std::lock_guard lock(mu_);
  std::swap(kept_, scratch_);
  have_kept_ = true;
}

void EmergencyState::save_and_exit(const std::string& why) {
  bool first = false;
  if (!g_handling.compare_exchange_strong(first, true)) park();  // another thread is saving
  std::unique_lock lock(mu_);  // a boundary state being swapped in completes first
  std::string what;
  if (!have_kept_) {
    what = "no step boundary reached yet: nothing saved";
  } else {
    const std::string path = (fs::path(folder_) / rank_file_name(rank_)).string();
    try {
      const std::vector<uint8_t> bytes = encode_state(kept_);
      write_file_durably(path, bytes.data(), bytes.size());
      what = "emergency state after step " + std::to_string(kept_.step) + " written to " + path;
    } catch (const std::exception& e) {
      what = std::string("emergency state not written: ") + e.what();
    }
  }
  std::fprintf(stderr, "gossipgrad: rank %d: %s: %s; exiting with %d\n", rank_, why.c_str(),
               what.c_str(), kEmergencyExit);
  std::fflush(stderr);
  std::fflush(stdout);
  std::_Exit(kEmergencyExit);  // no MPI_Finalize: it would wait for the dead rank
}

std::unique_ptr<StepHook> make_emergency_hook(Group& g, EmergencyState& e) {
  return std::make_unique<KeepAtBoundary>(g, e);
}

bool take_emergency_states(const Config& c, const mpi::Comm& world, JobState& job) {
  (void)c;
  const char* from = std::getenv(kEmergencyFromEnv);
  if (from == nullptr || *from == '\0') return false;
  std::string error;
  RankState s;
  RecoveryPlan plan;
  try {
    plan = read_recovery_plan(from);
    if (static_cast<int>(plan.survivors.size()) != world.size())
      throw std::runtime_error(std::string(from) + " plans for " +
                               std::to_string(plan.survivors.size()) + " survivors, this job has " +
                               std::to_string(world.size()) + " ranks");
    const int old = plan.survivors[static_cast<size_t>(world.rank())];
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
