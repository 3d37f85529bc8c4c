#include "gossip/resilience/supervise.hpp"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "gossip/config/config.hpp"

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
    "usage: gossipgrad supervise [--max-restarts N] [--shrink-on-failure] [--min-ranks M] --\n"
    "                            mpirun -n P gossipgrad train ... --checkpoint.dir DIR ...\n\n"
    "Runs the job; when it fails (not a usage error, exit 2), runs it again with\n"
    "--checkpoint.resume auto, so it continues from the newest valid checkpoint in DIR.\n"
    "  --max-restarts N      give up after N restarts (default 3)\n"
    "  --shrink-on-failure   each restart runs one rank fewer (mpirun's -n/-np), down to\n"
    "                        --min-ranks (default 1); the checkpoint's ranks are averaged\n"
    "  --stop-timeout S      after SIGTERM or SIGINT, seconds the job has to write its\n"
    "                        checkpoint and exit before it is killed (default 120)\n"
    "Restarts get GG_SUPERVISE_ATTEMPT=k in their environment; fault.* hooks fire only in\n"
    "attempt 0. SIGTERM or SIGINT (Ctrl-C) stops the job: it is sent SIGTERM once, writes a\n"
    "checkpoint where checkpoint.dir is set, and is not restarted; the exit code is then\n"
    "128 + the signal's number. Otherwise the exit code is the job's last one.\n";

}  // namespace

std::vector<std::string> restart_command(const std::vector<std::string>& job, int attempt,
                                         bool shrink, int min_ranks) {
  std::vector<std::string> out = job;
  bool has_resume = false;
  for (const std::string& a : out)
    if (a == "--checkpoint.resume" || a.rfind("--checkpoint.resume=", 0) == 0) has_resume = true;
  if (!has_resume) {
    out.push_back("--checkpoint.resume");
    out.push_back("auto");
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

namespace {

struct SuperviseOptions {
  int max_restarts = 3, min_ranks = 1, stop_timeout = 120;
  bool shrink = false;
  bool help = false;
  std::vector<std::string> job;  // the command after "--"
};

SuperviseOptions parse_supervise(const std::vector<std::string>& args) {
  SuperviseOptions o;
  size_t i = 0;
  for (; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--") {
      ++i;
      break;
    }
    if (a == "--help" || a == "-h") {
      o.help = true;
      return o;
    }
    if (a == "--shrink-on-failure") {
      o.shrink = true;
    } else if ((a == "--max-restarts" || a == "--min-ranks" || a == "--stop-timeout") &&
               i + 1 < args.size() && is_count(args[i + 1])) {
      const int v = std::stoi(args[++i]);
      (a == "--max-restarts" ? o.max_restarts
       : a == "--min-ranks"  ? o.min_ranks
                             : o.stop_timeout) = v;
    } else {
      throw UsageError("supervise: unknown or incomplete option '" + a +
                       "' (usage: gossipgrad supervise [options] -- COMMAND ...)");
    }
  }
  o.job.assign(args.begin() + static_cast<std::ptrdiff_t>(i), args.end());
  if (o.job.empty()) throw UsageError("supervise: no command after '--'");
  if (o.min_ranks < 1) throw UsageError("supervise: --min-ranks must be >= 1");
  return o;
}

// Waits for the job; once a stop is requested, for at most `stop_timeout` seconds, after which
// its process group is killed. Returns its wait status.
int wait_for_job(pid_t pid, int stop_timeout) {
  using Clock = std::chrono::steady_clock;
  Clock::time_point deadline = Clock::time_point::max();
  for (;;) {
    int status = 0;
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) return status;
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
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

// Runs `cmd` as attempt `attempt` (GG_SUPERVISE_ATTEMPT in its environment) in a process group of
// its own (a Ctrl-C reaches the job through the supervisor only, once) and waits for it; returns
// its wait status.
int run_attempt(const std::vector<std::string>& cmd, int attempt, int stop_timeout) {
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
  const int status = wait_for_job(pid, stop_timeout);
  g_child = 0;
  return status;
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
  for (int attempt = 0;; ++attempt) {
    const std::vector<std::string> cmd =
        attempt == 0 ? o.job : restart_command(o.job, attempt, o.shrink, o.min_ranks);
    const auto t0 = std::chrono::steady_clock::now();
    const int status = run_attempt(cmd, attempt, o.stop_timeout);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (const int sig = g_stop.load()) {
      std::fprintf(stderr,
                   "gossipgrad supervise: stopped by %s: the job was told to stop and exited "
                   "with %s %d; not restarting (resume with --checkpoint.resume auto)\n",
                   signal_name(sig), WIFEXITED(status) ? "code" : "signal",
                   WIFEXITED(status) ? code : WTERMSIG(status));
      return 128 + sig;
    }
    if (code == 0) {
      std::fprintf(stderr, "gossipgrad supervise: the job completed after %d restart(s)\n",
                   attempt);
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
    std::fprintf(stderr,
                 "gossipgrad supervise: attempt %d failed with %s after %.1f s; restarting from "
                 "the latest valid checkpoint\n",
                 attempt, how.c_str(), seconds);
  }
}

}  // namespace gg::gossip
