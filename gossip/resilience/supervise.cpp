// The supervisor's machinery (the command itself is gossip/cli/supervise.cpp): a job's command
// line across restarts, one attempt run and watched in a process group of its own, the survivors'
// emergency states turned into a recovery plan, and the checkpoints a restart may resume from.
#include "gossip/resilience/supervise.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>

#include "gossip/resilience/emergency.hpp"
#include "gossip/resilience/full_checkpoint.hpp"

namespace gg::gossip {
namespace {

std::atomic<pid_t> g_child{0};  // the running job, for the signal handler only
std::atomic<int> g_stop{0};     // SIGTERM or SIGINT received: the job is to stop, not restart

// A scheduler's preemption (SIGTERM) or a user's Ctrl-C (SIGINT) stops the job: the job hears it
// once, as SIGTERM (mpirun forwards it to the ranks, which write a checkpoint and exit; a
// second SIGINT would make mpirun kill them at once), and is not restarted.
void stop_job(int sig) {
  int none = 0;
  if (!g_stop.compare_exchange_strong(none, sig)) return;
  const pid_t child = g_child.load();
  if (child > 0) ::kill(child, SIGTERM);
}

const char* signal_name(int sig) { return sig == SIGINT ? "SIGINT" : "SIGTERM"; }

}  // namespace

void install_stop_handlers() {
  std::signal(SIGINT, stop_job);
  std::signal(SIGTERM, stop_job);
}

int stop_requested() { return g_stop.load(); }

bool is_count(const std::string& s) {
  return !s.empty() && s.size() < 8 &&
         std::all_of(s.begin(), s.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
}

bool names_ranks(const std::vector<std::string>& job) {
  for (size_t i = 0; i + 1 < job.size(); ++i)
    if ((job[i] == "-n" || job[i] == "-np") && is_count(job[i + 1])) return true;
  return false;
}

std::vector<std::string> restart_command(const std::vector<std::string>& job, int attempt,
                                         bool shrink, int min_ranks,
                                         const std::optional<std::string>& resume) {
  std::vector<std::string> out;
  bool has_resume = false;
  for (size_t i = 0; i < job.size(); ++i) {
    const std::string& a = job[i];
    const bool named = a == "--checkpoint.resume" || a.rfind("--checkpoint.resume=", 0) == 0;
    has_resume |= named;
    if (named && resume) {
      if (a == "--checkpoint.resume") ++i;  // and its value
      continue;
    }
    out.push_back(a);
  }
  if (resume ? !resume->empty() : !has_resume) {
    out.push_back("--checkpoint.resume");
    out.push_back(resume ? *resume : "auto");
  }
  if (shrink) {
    for (size_t i = 0; i + 1 < out.size(); ++i) {
      if ((out[i] == "-n" || out[i] == "-np") && is_count(out[i + 1])) {
        const int p = std::max(min_ranks, std::stoi(out[i + 1]) - attempt);
        out[i + 1] = std::to_string(p);
        break;
      }
    }
  }
  return out;
}

std::vector<std::string> with_failure_notice(const std::vector<std::string>& job) {
  if (job.empty() || !is_hydra_launcher(job[0])) return job;
  for (const std::string& a : job)
    if (a == "-disable-auto-cleanup" || a == "--disable-auto-cleanup") return job;
  std::vector<std::string> out = job;
  out.insert(out.begin() + 1, "-disable-auto-cleanup");
  return out;
}

std::vector<std::string> with_ranks(const std::vector<std::string>& job, int ranks) {
  std::vector<std::string> out = job;
  for (size_t i = 0; i + 1 < out.size(); ++i)
    if ((out[i] == "-n" || out[i] == "-np") && is_count(out[i + 1])) {
      out[i + 1] = std::to_string(ranks);
      break;
    }
  return out;
}

int job_ranks(const std::vector<std::string>& job) {
  for (size_t i = 0; i + 1 < job.size(); ++i)
    if ((job[i] == "-n" || job[i] == "-np") && is_count(job[i + 1])) return std::stoi(job[i + 1]);
  return 1;
}

bool is_hydra_launcher(const std::string& launcher) {
  const std::string base = std::filesystem::path(launcher).filename().string();
  if (base.rfind("mpirun", 0) != 0 && base.rfind("mpiexec", 0) != 0) return false;
  // Debian's mpirun/mpiexec are alternatives: hydra is the one whose real name says so.
  std::string path = launcher;
  if (launcher.find('/') == std::string::npos) {
    const char* env = std::getenv("PATH");
    std::string dirs = env ? env : "";
    for (size_t at = 0; at <= dirs.size();) {
      const size_t end = std::min(dirs.find(':', at), dirs.size());
      const std::filesystem::path p = std::filesystem::path(dirs.substr(at, end - at)) / launcher;
      if (::access(p.c_str(), X_OK) == 0) {
        path = p.string();
        break;
      }
      at = end + 1;
    }
  }
  std::error_code ec;
  const std::string real = std::filesystem::canonical(path, ec).filename().string();
  const std::string name = ec ? base : real;
  return name.find("hydra") != std::string::npos || name.find("mpich") != std::string::npos;
}

namespace {

double g_job_ended_unix = 0;  // when the supervisor ended the current attempt itself (0: not)

// Sends `sig` to hydra's mpiexec in the job's process group `job` (the job's command may be a
// wrapper that runs it: a signal of its own would kill the wrapper); to `job` itself when none.
void signal_hydra(pid_t job, int sig) {
  bool sent = false;
  std::error_code ec;
  for (std::filesystem::directory_iterator it("/proc", ec), end; !ec && it != end;
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.empty() ||
        !std::all_of(name.begin(), name.end(), [](char c) { return c >= '0' && c <= '9'; }))
      continue;
    std::ifstream stat(it->path() / "stat");
    std::string line;
    if (!std::getline(stat, line)) continue;
    // pid (comm) state ppid pgrp ...: comm may hold spaces, so read after the last ')'.
    const size_t open = line.find('('), close = line.rfind(')');
    if (open == std::string::npos || close == std::string::npos) continue;
    const std::string comm = line.substr(open + 1, close - open - 1);
    std::istringstream rest(line.substr(close + 1));
    std::string state;
    long ppid = 0, pgrp = 0;
    if (!(rest >> state >> ppid >> pgrp) || pgrp != job) continue;
    if (comm.rfind("mpiexec", 0) != 0) continue;
    ::kill(static_cast<pid_t>(std::stol(name)), sig);
    sent = true;
  }
  if (!sent) ::kill(job, sig);
}

// Survivors of a real failure write their states into `folder` and wait (emergency.hpp). Once
// saves show and none is in flight, none began for kSettle and kNoticeWindow passed since the
// first, the job is ended — unless every save so far was for a partner timeout: then first the
// launcher gets SIGUSR1: hydra passes it to every rank, so the other ranks, which no launcher
// told of a death, save theirs too; once that round settled as well, the job is ended. Saves still
// in flight after kSaveBound are given up (their ranks count as lost); savers outlive their ranks,
// so after the job's end the saves in flight finish too.
class EmergencyWatch {
 public:
  EmergencyWatch(std::string folder, int ranks, int start_timeout)
      : folder_(std::move(folder)), ranks_(ranks), start_timeout_(start_timeout) {}
  // Whether the job should be ended now.
  bool poll(pid_t launcher) {
    if (folder_.empty()) return false;
    const EmergencyActivity a = emergency_activity(folder_);
    if (!a.any()) {
      // Every rank starts a saver once MPI is up: a job whose ranks do not all get there (a
      // launcher waiting for an unreachable node) is ended after --start-timeout.
      if (a.started >= ranks_ || start_timeout_ <= 0 ||
          Clock::now() - begun_ < std::chrono::seconds(start_timeout_))
        return false;
      std::fprintf(stderr,
                   "gossipgrad supervise: %d of %d ranks started within %d s (--start-timeout): "
                   "ending the job\n",
                   a.started, ranks_, start_timeout_);
      start_timeout_ = 0;
      return true;
    }
    const Clock::time_point now = Clock::now();
    if (!seen_) {
      seen_ = true;
      first_ = changed_ = round_ = now;
    }
    if (a.states != last_.states || a.saving != last_.saving) changed_ = now;
    last_ = a;
    if (now - first_ > kSaveBound) return true;
    const bool settled =
        a.saving == 0 && now - round_ >= kNoticeWindow && now - changed_ >= kSettle;
    if (!settled) return false;
    // A death reached the ranks as hydra's notice or took their savers' pipes: no round more.
    if (signalled_ || a.timeouts < a.states + a.saving) return true;
    signal_hydra(launcher, SIGUSR1);
    signalled_ = true;
    round_ = changed_ = now;
    return false;
  }
  bool seen() const { return seen_; }
  int states() const { return last_.states; }
  // After the job ended: the saves still in flight finish (the savers outlive their ranks).
  void drain() {
    if (folder_.empty()) return;
    const Clock::time_point end = Clock::now();
    Clock::time_point changed = end;
    EmergencyActivity last = emergency_activity(folder_);
    for (;;) {
      const Clock::time_point now = Clock::now();
      const EmergencyActivity a = emergency_activity(folder_);
      if (a.states != last.states || a.saving != last.saving) changed = now;
      last = a;
      if (now - end > kSaveBound) return;
      if (a.saving == 0 && now - end >= kDrainWindow && now - changed >= kSettle) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

 private:
  using Clock = std::chrono::steady_clock;
  static constexpr auto kNoticeWindow = std::chrono::milliseconds(400);
  static constexpr auto kSettle = std::chrono::milliseconds(200);
  static constexpr auto kSaveBound = std::chrono::seconds(60);
  static constexpr auto kDrainWindow = std::chrono::milliseconds(400);
  std::string folder_;
  int ranks_, start_timeout_;
  Clock::time_point begun_ = Clock::now();
  bool seen_ = false, signalled_ = false;
  Clock::time_point first_, changed_, round_;
  EmergencyActivity last_;
};

// Waits for the job; once a stop is requested, for at most `stop_timeout` seconds, after which
// its process group is killed; once the survivors of a real failure saved their states in
// `folder`, it is killed at once. Returns its wait status.
int wait_for_job(pid_t pid, int stop_timeout, const std::string& folder, int ranks,
                 int start_timeout) {
  using Clock = std::chrono::steady_clock;
  Clock::time_point deadline = Clock::time_point::max();
  EmergencyWatch emergency(folder, ranks, start_timeout);
  bool ended = false;
  for (;;) {
    int status = 0;
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) {
      if (status != 0) emergency.drain();
      return status;
    }
    if (r < 0 && errno != EINTR)
      throw std::runtime_error(std::string("supervise: waitpid: ") + std::strerror(errno));
    if (g_stop.load() != 0 && deadline == Clock::time_point::max())
      deadline = Clock::now() + std::chrono::seconds(stop_timeout);
    if (Clock::now() > deadline) {
      std::fprintf(stderr,
                   "gossipgrad supervise: the job did not stop within %d s of %s: killing it\n",
                   stop_timeout, signal_name(g_stop.load()));
      ::kill(-pid, SIGKILL);
      deadline = Clock::time_point::max() - std::chrono::hours(1);
    }
    if (!ended && g_stop.load() == 0 && emergency.poll(pid)) {
      if (emergency.seen())
        std::fprintf(stderr,
                     "gossipgrad supervise: a rank failed; %d survivor state(s) written: ending "
                     "the job\n",
                     emergency.states());
      std::fflush(stderr);
      g_job_ended_unix =
          std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
              .count();
      ::kill(-pid, SIGKILL);
      ended = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(emergency.seen() ? 20 : 50));
  }
}

}  // namespace

int run_attempt(const std::vector<std::string>& cmd, int attempt, int stop_timeout,
                const std::vector<std::pair<std::string, std::string>>& env,
                const std::string& folder, int ranks, int start_timeout) {
  g_job_ended_unix = 0;
  std::string line;
  for (const std::string& a : cmd) line += (line.empty() ? "" : " ") + a;
  std::fprintf(stderr, "gossipgrad supervise: attempt %d: %s\n", attempt, line.c_str());
  std::fflush(stderr);
  std::fflush(stdout);
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error(std::string("supervise: fork: ") + std::strerror(errno));
  if (pid == 0) {
    ::setpgid(0, 0);
    // Outside the terminal's foreground group, reading it would stop the job (SIGTTIN).
    const int null = ::open("/dev/null", O_RDONLY);
    if (null >= 0) ::dup2(null, STDIN_FILENO);
    const std::string value = std::to_string(attempt);
    ::setenv("GG_SUPERVISE_ATTEMPT", value.c_str(), 1);
    ::unsetenv(kEmergencyDirEnv);
    ::unsetenv(kEmergencyFromEnv);
    ::unsetenv(kPlanRanksEnv);
    for (const auto& [name, v] : env) ::setenv(name.c_str(), v.c_str(), 1);
    std::vector<char*> argv;
    for (const std::string& a : cmd) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execvp(argv[0], argv.data());
    std::fprintf(stderr, "gossipgrad supervise: cannot run %s: %s\n", argv[0],
                 std::strerror(errno));
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // also here: no signal may find the child still in our group
  g_child = pid;
  if (g_stop.load() != 0) ::kill(pid, SIGTERM);  // a stop that came during the fork
  const int status = wait_for_job(pid, stop_timeout, folder, ranks, start_timeout);
  g_child = 0;
  return status;
}

SessionCheckpoints::SessionCheckpoints(std::string dir, std::string launched_with)
    : dir_(std::move(dir)), launched_(std::move(launched_with)) {
  for (const auto& [step, folder] : list_checkpoints(dir_)) before_[folder] = written(folder);
}

std::optional<std::string> SessionCheckpoints::restart_resume() const {
  if (dir_.empty()) return std::nullopt;
  for (const auto& [step, folder] : list_checkpoints(dir_)) {
    const auto seen = before_.find(folder);
    const std::optional<std::string> now = written(folder);
    if (!now || (seen != before_.end() && seen->second == now)) continue;
    const std::string why = verify_checkpoint(folder);
    if (why.empty()) return folder;
    std::fprintf(stderr, "gossipgrad supervise: skipping checkpoint %s: %s\n", folder.c_str(),
                 why.c_str());
  }
  // A job launched afresh (log.overwrite over an earlier run's checkpoints) that wrote none
  // yet starts afresh again: auto would take the earlier run's.
  const bool earlier = std::any_of(before_.begin(), before_.end(),
                                   [](const auto& b) { return b.second.has_value(); });
  if (launched_.empty()) return earlier ? "" : "auto";
  return launched_;
}

std::optional<std::string> SessionCheckpoints::written(const std::string& folder) {
  struct stat st = {};
  const std::string manifest = (std::filesystem::path(folder) / kManifest).string();
  if (::stat(manifest.c_str(), &st) != 0) return std::nullopt;
  return std::to_string(st.st_mtim.tv_sec) + "." + std::to_string(st.st_mtim.tv_nsec) + "/" +
         std::to_string(st.st_ino);
}

std::optional<RecoveryPlan> plan_forward(const std::string& folder, int ranks, int min_ranks,
                                         bool notice, bool replace) {
  std::error_code ec;
  if (folder.empty() || !notice) return std::nullopt;
  const EmergencyScan scan = scan_emergency_states(folder, ranks, g_job_ended_unix);
  if (!scan.unreachable.empty()) {
    std::string who;
    for (int r : scan.unreachable) {
      if (!who.empty()) who += ',';
      who += std::to_string(r);
    }
    std::fprintf(stderr,
                 "gossipgrad supervise: rank(s) %s timed out like the others, but the launcher's "
                 "notice no longer reaches them (a cut link?): counted as lost\n",
                 who.c_str());
  }
  const char* fallback = "restarting from the newest full checkpoint instead";
  if (!scan.corrupt.empty()) {
    std::fprintf(stderr, "gossipgrad supervise: emergency state %s: %s\n", scan.corrupt.c_str(),
                 fallback);
    return std::nullopt;
  }
  if (scan.survivors.empty()) {
    std::fprintf(stderr, "gossipgrad supervise: no emergency state in %s: %s\n", folder.c_str(),
                 fallback);
    return std::nullopt;
  }
  if (static_cast<int>(scan.survivors.size()) < min_ranks) {
    std::fprintf(stderr,
                 "gossipgrad supervise: %zu survivor state(s) in %s, fewer than --min-ranks %d: "
                 "%s\n",
                 scan.survivors.size(), folder.c_str(), min_ranks, fallback);
    return std::nullopt;
  }
  if (scan.max_step - scan.min_step > 1) {
    std::fprintf(stderr,
                 "gossipgrad supervise: the emergency states in %s span steps %lld to %lld (more "
                 "than the step in flight): %s\n",
                 folder.c_str(), static_cast<long long>(scan.min_step),
                 static_cast<long long>(scan.max_step), fallback);
    return std::nullopt;
  }
  RecoveryPlan plan;
  plan.survivors = scan.survivors;
  plan.lost = scan.lost;
  plan.ranks_before = ranks;
  plan.step = scan.min_step;
  plan.steps_redone = scan.max_step - scan.min_step;
  plan.failed_unix = scan.first_written_unix;
  plan.first_gone = scan.first_gone;
  plan.replace = replace && !plan.lost.empty();
  try {
    write_recovery_plan(folder, plan);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gossipgrad supervise: %s: %s\n", e.what(), fallback);
    return std::nullopt;
  }
  return plan;
}

}  // namespace gg::gossip
