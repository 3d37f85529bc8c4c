#include "gossip/resilience/supervise.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
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

#include "gossip/config/config.hpp"
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

bool is_count(const std::string& s) {
  return !s.empty() && s.size() < 8 &&
         std::all_of(s.begin(), s.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
}

constexpr const char* kHelp =
    "usage: gossipgrad supervise [--max-restarts N] [--shrink-on-failure] [--min-ranks M]\n"
    "                            [--replace-lost] [--stop-timeout S] [--start-timeout S]\n"
    "                            [--emergency-dir DIR|none] --\n"
    "                            mpirun -n P gossipgrad train ... --checkpoint.dir DIR ...\n\n"
    "Runs the job; when it fails (not a usage error, exit 2), runs it again: from the ranks'\n"
    "emergency states (below) where there are some, else from the newest valid checkpoint\n"
    "the job wrote in DIR since it was launched (never an earlier run's), else from what it\n"
    "was launched with (its --checkpoint.resume, or auto). A job without checkpoint.dir is\n"
    "refused. train.max_steps and train.stop_at count steps of the job's -n P: a relaunch\n"
    "at fewer ranks trains the same samples (more of its smaller steps).\n"
    "  --max-restarts N      give up after N restarts (default 3; 0 to 1000)\n"
    "  --shrink-on-failure   each restart runs one rank fewer (mpirun's -n/-np), down to\n"
    "                        --min-ranks (default 1); the checkpoint's ranks are averaged\n"
    "  --replace-lost        after a real failure, relaunch at the job's size: a lost\n"
    "                        rank's slot starts from its schedule partner's state\n"
    "                        (replace; the launcher must be able to place it: a lost\n"
    "                        node's ranks need a spare host), instead of going on with\n"
    "                        the survivors (forward)\n"
    "  --stop-timeout S      after SIGTERM or SIGINT, seconds the job has to write its\n"
    "                        checkpoint and exit before it is killed (default 120; 0 to 604800)\n"
    "  --start-timeout S     with emergency states: end a job whose ranks have not all started\n"
    "                        (MPI up) S seconds after launch, e.g. a node the launcher cannot\n"
    "                        reach (default 120; 0: wait; at most 604800)\n"
    "  --emergency-dir DIR   where the ranks' savers write their states (default: the job's\n"
    "                        --checkpoint.dir/emergency; none: restarts from checkpoints only;\n"
    "                        when the job completes, this session's states are removed)\n"
    "Real failures: under MPICH's hydra (mpirun/mpiexec) the job runs with\n"
    "-disable-auto-cleanup. Every rank keeps its state of its last completed step in memory it\n"
    "shares with a saver process of its own; when a rank dies, each saver writes its rank's\n"
    "state (the dead rank's too, unless its machine is gone), the supervisor ends the job and\n"
    "runs it again from those states: at its size when all were saved (restore), else with the\n"
    "ranks that have one, the samples reassigned (forward), or with --replace-lost at its\n"
    "size, a lost rank taking its partner's state (replace). A rank whose partner times out\n"
    "saves too; when only timeouts happened, the ranks that hydra can no longer pass a notice\n"
    "to (a cut link) count as lost. At most one step is redone. A corrupt state, or none,\n"
    "falls back to the newest full checkpoint, saying so in one line.\n"
    "Restarts get GG_SUPERVISE_ATTEMPT=k in their environment; fault.* hooks fire only in\n"
    "attempt 0. SIGTERM or SIGINT (Ctrl-C) stops the job: it is sent SIGTERM once, writes a\n"
    "checkpoint where checkpoint.dir is set, and is not restarted; the exit code is then\n"
    "128 + the signal's number. Otherwise the exit code is the job's last one. A rank whose\n"
    "saver dies says so in one line and starts a new one.\n";

}  // namespace

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

struct SuperviseOptions {
  int max_restarts = 3, min_ranks = 1, stop_timeout = 120, start_timeout = 120;
  bool shrink = false;
  bool replace = false;       // --replace-lost
  std::string emergency_dir;  // empty: the job's checkpoint.dir/emergency, or none
  bool help = false;
  std::vector<std::string> job;  // the command after "--"
  // The job's `gossipgrad train` settings, when the command runs it directly (not a wrapper).
  std::optional<Config> train;
};

// The value of supervise's integer option `name`: a whole number in [low, high], else one line
// naming the option, the value and the range (not "unknown option": the option is known).
int parse_supervise_int(const std::string& name, const std::string& text, int low, int high,
                        const char* unit) {
  int64_t v = 0;
  const char* end = text.data() + text.size();
  const auto [at, ec] = std::from_chars(text.data(), end, v);
  const std::string range = std::to_string(low) + " to " + std::to_string(high) + " (" + unit + ")";
  if (text.empty() || (ec != std::errc() && ec != std::errc::result_out_of_range) || at != end)
    throw UsageError("supervise: " + name + " = " + text + " is not a whole number: give one " +
                     "from " + range);
  if (ec == std::errc::result_out_of_range || v < low || v > high)
    throw UsageError("supervise: " + name + " = " + text + " is out of range: must be from " +
                     range);
  return static_cast<int>(v);
}

// The arguments of the `gossipgrad train` the job runs (after a program named gossipgrad and
// "train", up to an MPMD ':'), or nullopt when the command runs something else (a wrapper).
std::optional<std::vector<std::string>> train_args(const std::vector<std::string>& job) {
  for (size_t k = 1; k < job.size(); ++k) {
    if (job[k] != "train") continue;
    const std::string program = std::filesystem::path(job[k - 1]).filename().string();
    if (program.rfind("gossipgrad", 0) != 0) continue;
    std::vector<std::string> args;
    for (size_t i = k + 1; i < job.size() && job[i] != ":"; ++i) args.push_back(job[i]);
    return args;
  }
  return std::nullopt;
}

// Whether the job names its rank count (mpirun's -n/-np).
bool names_ranks(const std::vector<std::string>& job) {
  for (size_t i = 0; i + 1 < job.size(); ++i)
    if ((job[i] == "-n" || job[i] == "-np") && is_count(job[i + 1])) return true;
  return false;
}

SuperviseOptions parse_supervise(const std::vector<std::string>& args) {
  SuperviseOptions o;
  size_t i = 0;
  bool min_ranks_given = false;
  for (; i < args.size(); ++i) {
    std::string a = args[i];
    if (a == "--") {
      ++i;
      break;
    }
    if (a == "--help" || a == "-h") {
      o.help = true;
      return o;
    }
    std::optional<std::string> value;  // --option=value
    if (const size_t eq = a.find('='); a.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = a.substr(eq + 1);
      a.resize(eq);
    }
    const bool takes_value = a == "--emergency-dir" || a == "--max-restarts" ||
                             a == "--min-ranks" || a == "--stop-timeout" || a == "--start-timeout";
    if (takes_value && !value) {
      if (i + 1 >= args.size() || args[i + 1] == "--")
        throw UsageError("supervise: " + a + " needs a value (gossipgrad supervise --help)");
      value = args[++i];
    }
    if ((a == "--shrink-on-failure" || a == "--replace-lost") && value)
      throw UsageError("supervise: " + a + " takes no value");
    if (a == "--shrink-on-failure") {
      o.shrink = true;
    } else if (a == "--replace-lost") {
      o.replace = true;
    } else if (a == "--emergency-dir") {
      if (value->empty())
        throw UsageError(
            "supervise: --emergency-dir needs a folder (or none: no emergency states)");
      o.emergency_dir = *value;
    } else if (a == "--max-restarts") {
      o.max_restarts = parse_supervise_int(a, *value, 0, 1000, "restarts");
    } else if (a == "--min-ranks") {
      o.min_ranks = parse_supervise_int(a, *value, 1, 1000000, "ranks");
      min_ranks_given = true;
    } else if (a == "--stop-timeout") {
      o.stop_timeout = parse_supervise_int(a, *value, 0, 7 * 86400, "seconds");
    } else if (a == "--start-timeout") {
      o.start_timeout = parse_supervise_int(a, *value, 0, 7 * 86400, "seconds; 0: wait");
    } else if (a.rfind("-", 0) != 0) {
      throw UsageError("supervise: '" + a +
                       "' is no option: put '--' before the job's command (gossipgrad supervise "
                       "[options] -- mpirun -n P gossipgrad train ...)");
    } else {
      throw UsageError("supervise: unknown option '" + a +
                       "' (usage: gossipgrad supervise [options] -- COMMAND ...)");
    }
  }
  o.job.assign(args.begin() + static_cast<std::ptrdiff_t>(i), args.end());
  if (o.job.empty()) throw UsageError("supervise: no command after '--'");
  // hydra runs no rank and exits 0 for -n 0, -n -1 or -n abc: the job would "complete" untrained.
  const std::string launcher = std::filesystem::path(o.job[0]).filename().string();
  if (launcher.rfind("mpirun", 0) == 0 || launcher.rfind("mpiexec", 0) == 0)
    for (size_t k = 1; k + 1 < o.job.size(); ++k) {
      if (o.job[k] != "-n" && o.job[k] != "-np") continue;
      if (train_args(std::vector<std::string>(o.job.begin(), o.job.begin() + k)))
        break;  // past the program: the train options' own
      const std::string& count = o.job[k + 1];
      if (!is_count(count) || std::stoi(count) < 1)
        throw UsageError("supervise: " + launcher + " " + o.job[k] + " " + count +
                         " is no rank count: give a whole number from 1 to 9999999");
    }
  if (min_ranks_given && names_ranks(o.job) && o.min_ranks > job_ranks(o.job))
    throw UsageError("supervise: --min-ranks " + std::to_string(o.min_ranks) +
                     " is more than the job's " + std::to_string(job_ranks(o.job)) +
                     " ranks: lower it");
  // The job's own settings: a job without checkpoint.dir could only start again from step 0
  // after a failure (and a restart's --checkpoint.resume auto needs one): refused before it runs.
  // A usage error of the train options is the job's to report (it exits 2, not restarted).
  const auto targs = train_args(o.job);
  if (targs) {
    try {
      o.train = parse_train_args(*targs);
    } catch (const std::exception&) {
    }
    if (o.train && o.train->checkpoint.dir.empty())
      throw UsageError(
          "supervise: the job has no checkpoint.dir, so a restart could only begin again at "
          "step 0: add --checkpoint.dir DIR to its train options");
  }
  std::string dir = o.train ? o.train->checkpoint.dir : "";
  for (size_t k = 0; !o.train && k < o.job.size(); ++k) {  // a wrapper's visible arguments
    const std::string& a = o.job[k];
    if (a == "--checkpoint.dir" && k + 1 < o.job.size())
      dir = o.job[k + 1];
    else if (a.rfind("--checkpoint.dir=", 0) == 0)
      dir = a.substr(17);
  }
  if (dir.empty() && !targs)
    std::fprintf(stderr,
                 "gossipgrad supervise: warning: no `gossipgrad train` and no --checkpoint.dir in "
                 "the command (a wrapper?): unless it sets one, a restart cannot resume\n");
  if (o.emergency_dir == "none")
    o.emergency_dir.clear();
  else if (o.emergency_dir.empty() && !dir.empty())
    o.emergency_dir = (std::filesystem::path(dir) / "emergency").string();
  return o;
}

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

// Runs `cmd` as attempt `attempt` (GG_SUPERVISE_ATTEMPT in its environment) in a process group of
// its own (a Ctrl-C reaches the job through the supervisor only, once) and waits for it; returns
// its wait status.
int run_attempt(const std::vector<std::string>& cmd, int attempt, int stop_timeout,
                const std::vector<std::pair<std::string, std::string>>& env,
                const std::string& folder, int ranks, int start_timeout) {
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

}  // namespace

namespace {

// The full checkpoints in the job's checkpoint.dir when the session began. A restart resumes from
// the newest valid one the job wrote since: never from one an earlier run left there, and not
// from the folder the job was launched with once it wrote newer ones (that folder may be pruned
// by now).
class SessionCheckpoints {
 public:
  SessionCheckpoints() = default;
  SessionCheckpoints(std::string dir, std::string launched_with)
      : dir_(std::move(dir)), launched_(std::move(launched_with)) {
    for (const auto& [step, folder] : list_checkpoints(dir_)) before_[folder] = written(folder);
  }
  // What a restart passes as --checkpoint.resume (restart_command): that newest checkpoint, else
  // what the job was launched with (auto when it named none); nullopt when the job's settings are
  // unknown (a wrapper: its own --checkpoint.resume is kept, else auto).
  std::optional<std::string> restart_resume() const {
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

 private:
  // When the folder's manifest was written (none: not a complete checkpoint).
  static std::optional<std::string> written(const std::string& folder) {
    struct stat st = {};
    const std::string manifest = (std::filesystem::path(folder) / kManifest).string();
    if (::stat(manifest.c_str(), &st) != 0) return std::nullopt;
    return std::to_string(st.st_mtim.tv_sec) + "." + std::to_string(st.st_mtim.tv_nsec) + "/" +
           std::to_string(st.st_ino);
  }
  std::string dir_, launched_;
  std::map<std::string, std::optional<std::string>> before_;
};

// After attempt `attempt` of `ranks` ranks failed: the survivors' states in `folder`, checked.
// Returns the recovery plan to relaunch with, or nullopt (with the one line saying why) to fall
// back to the newest full checkpoint.
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

}  // namespace

int cmd_supervise(const std::vector<std::string>& args) {
  const SuperviseOptions o = parse_supervise(args);
  if (o.help) {
    std::fputs(kHelp, stdout);
    return 0;
  }
  std::signal(SIGINT, stop_job);
  std::signal(SIGTERM, stop_job);
  namespace fs = std::filesystem;
  const bool notice = !o.job.empty() && is_hydra_launcher(o.job[0]);
  if (!o.emergency_dir.empty() && !notice)
    std::fprintf(stderr,
                 "gossipgrad supervise: %s is not MPICH's hydra: no failure notice, so a dead "
                 "rank ends the job and it restarts from its newest full checkpoint\n",
                 o.job[0].c_str());
  if (o.train && (o.emergency_dir.empty() || !notice) && o.train->checkpoint.every == 0 &&
      o.train->checkpoint.every_minutes <= 0)
    std::fprintf(stderr,
                 "gossipgrad supervise: warning: no emergency states and no full checkpoint "
                 "before the end (checkpoint.every and every_minutes are 0): a restart begins "
                 "again at step 0; set --checkpoint.every N\n");
  std::string from;  // the previous attempt's folder whose survivors this attempt continues
  int ranks = job_ranks(o.job);
  int restarts_from_checkpoint = 0;
  const SessionCheckpoints checkpoints =
      o.train ? SessionCheckpoints(o.train->checkpoint.dir, o.train->checkpoint.resume)
              : SessionCheckpoints();
  for (int attempt = 0;; ++attempt) {
    std::vector<std::string> cmd;
    if (attempt == 0)
      cmd = o.job;
    else if (!from.empty())
      cmd = with_ranks(
          restart_command(o.job, attempt, false, o.min_ranks, checkpoints.restart_resume()), ranks);
    else
      cmd = restart_command(o.job, restarts_from_checkpoint, o.shrink, o.min_ranks,
                            checkpoints.restart_resume());
    if (from.empty()) ranks = job_ranks(cmd);
    if (!o.emergency_dir.empty()) cmd = with_failure_notice(cmd);
    std::vector<std::pair<std::string, std::string>> env;
    // train.max_steps and train.stop_at count steps of the job as launched: a relaunch at another
    // rank count trains the same samples (gossip/train/loop.cpp).
    if (o.train && names_ranks(o.job) &&
        std::find(o.job.begin(), o.job.end(), ":") == o.job.end())  // not MPMD: one -n
      env.emplace_back(kPlanRanksEnv, std::to_string(job_ranks(o.job)));
    std::string folder;
    if (!o.emergency_dir.empty() && notice) {
      folder = (fs::path(o.emergency_dir) / ("attempt-" + std::to_string(attempt))).string();
      std::error_code ec;
      fs::remove_all(folder, ec);  // a state left by an earlier supervise session is not ours
      fs::create_directories(folder, ec);
      if (ec) {
        std::fprintf(stderr, "gossipgrad supervise: cannot create %s: %s\n", folder.c_str(),
                     ec.message().c_str());
        return 1;
      }
      env.emplace_back(kEmergencyDirEnv, folder);
      if (!from.empty()) env.emplace_back(kEmergencyFromEnv, from);
    }
    const auto t0 = std::chrono::steady_clock::now();
    g_job_ended_unix = 0;
    const int status =
        run_attempt(cmd, attempt, o.stop_timeout, env, folder, ranks, o.start_timeout);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (!folder.empty())  // what the survivors of a real failure could not print themselves
      for (const std::string& line : emergency_logs(folder, ranks))
        std::fprintf(stderr, "%s\n", line.c_str());
    if (const int sig = g_stop.load()) {
      std::fprintf(stderr,
                   "gossipgrad supervise: stopped by %s: the job was told to stop and exited "
                   "with %s %d; not restarting (resume with --checkpoint.resume auto)\n",
                   signal_name(sig), WIFEXITED(status) ? "code" : "signal",
                   WIFEXITED(status) ? code : WTERMSIG(status));
      return 128 + sig;
    }
    if (code == 0) {
      if (o.train && o.train->train.stop_at > 0)
        std::fprintf(stderr,
                     "gossipgrad supervise: the job exited 0 after %d restart(s): it trained to "
                     "train.stop_at (a checkpoint to resume from) or to its end\n",
                     attempt);
      else
        std::fprintf(stderr, "gossipgrad supervise: the job completed after %d restart(s)\n",
                     attempt);
      if (!o.emergency_dir.empty() && notice) {
        // The final checkpoint supersedes every emergency state: this session's folders go, and
        // the emergency folder once empty (it may be a folder of the user's, holding more).
        std::error_code ec;
        for (int k = 0; k <= attempt; ++k)
          fs::remove_all(fs::path(o.emergency_dir) / ("attempt-" + std::to_string(k)), ec);
        fs::remove(o.emergency_dir, ec);
      }
      return 0;
    }
    std::string how = WIFEXITED(status) ? "exit code " + std::to_string(code)
                                        : "signal " + std::to_string(WTERMSIG(status));
    if (code == 2 || code == 127) {
      std::fprintf(stderr,
                   "gossipgrad supervise: attempt %d failed with %s (a usage error or a "
                   "command that cannot run): not restarting\n",
                   attempt, how.c_str());
      return code;
    }
    if (attempt >= o.max_restarts) {
      std::fprintf(stderr,
                   "gossipgrad supervise: attempt %d failed with %s; giving up after %d "
                   "restart(s)\n",
                   attempt, how.c_str(), attempt);
      return code;
    }
    if (!from.empty() && !folder.empty() && emergency_activity(folder).states == 0) {
      // A relaunch that failed before any state of its own (a second death during the
      // recovery): the states it started from are still the newest.
      std::fprintf(stderr,
                   "gossipgrad supervise: attempt %d failed with %s after %.1f s, before any "
                   "state of its own: relaunching from the states in %s again\n",
                   attempt, how.c_str(), seconds, from.c_str());
      continue;
    }
    const std::optional<RecoveryPlan> plan =
        plan_forward(folder, ranks, o.min_ranks, notice, o.replace);
    if (plan) {
      std::string lost;
      for (int r : plan->lost) {
        if (!lost.empty()) lost += ',';
        lost += std::to_string(r);
      }
      const std::string first =
          plan->first_gone < 0
              ? ""
              : "; rank " + std::to_string(plan->first_gone) + "'s process ended first";
      std::fprintf(stderr,
                   "gossipgrad supervise: attempt %d failed with %s after %.1f s%s: %zu of %d "
                   "rank states saved (lost: %s); %d ranks continue at step %lld from them "
                   "(%s, %lld step(s) redone)\n",
                   attempt, how.c_str(), seconds, first.c_str(), plan->survivors.size(), ranks,
                   lost.empty() ? "none" : lost.c_str(), plan->ranks_after(),
                   static_cast<long long>(plan->step), plan->strategy(),
                   static_cast<long long>(plan->steps_redone));
      from = folder;
      ranks = plan->ranks_after();
      continue;
    }
    from.clear();
    ++restarts_from_checkpoint;
    std::fprintf(stderr,
                 "gossipgrad supervise: attempt %d failed with %s after %.1f s; restarting from "
                 "the latest valid checkpoint\n",
                 attempt, how.c_str(), seconds);
  }
}

}  // namespace gg::gossip
