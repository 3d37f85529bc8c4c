// `gossipgrad supervise [options] -- mpirun -n P gossipgrad train ...`: the command's options,
// its help, and the loop over attempts: run the job, and when it fails run it again from the
// survivors' emergency states or the newest checkpoint (the machinery: gossip/resilience/
// supervise.hpp).
#include "gossip/resilience/supervise.hpp"

#include <sys/wait.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "gossip/cli/commands.hpp"
#include "gossip/config/config.hpp"
#include "gossip/resilience/emergency.hpp"
#include "gossip/train/stop_signals.hpp"

namespace gg::gossip {
namespace {

namespace fs = std::filesystem;

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

// One option at args[i] (its value too, moving i past it). False at "--" (i past it).
bool parse_option(const std::vector<std::string>& args, size_t& i, SuperviseOptions& o,
                  bool& min_ranks_given) {
  std::string a = args[i];
  if (a == "--") {
    ++i;
    return false;
  }
  std::optional<std::string> value;  // --option=value
  if (const size_t eq = a.find('='); a.rfind("--", 0) == 0 && eq != std::string::npos) {
    value = a.substr(eq + 1);
    a.resize(eq);
  }
  const bool takes_value = a == "--emergency-dir" || a == "--max-restarts" || a == "--min-ranks" ||
                           a == "--stop-timeout" || a == "--start-timeout";
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
      throw UsageError("supervise: --emergency-dir needs a folder (or none: no emergency states)");
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
  ++i;
  return true;
}

// hydra runs no rank and exits 0 for -n 0, -n -1 or -n abc: the job would "complete" untrained.
void check_rank_counts(const SuperviseOptions& o, bool min_ranks_given) {
  const std::string launcher = fs::path(o.job[0]).filename().string();
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
}

// The job's own settings: a job without checkpoint.dir could only start again from step 0 after a
// failure (and a restart's --checkpoint.resume auto needs one): refused before it runs. A usage
// error of the train options is the job's to report (it exits 2, not restarted).
void read_job_settings(SuperviseOptions& o) {
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
    o.emergency_dir = (fs::path(dir) / "emergency").string();
}

SuperviseOptions parse_supervise(const std::vector<std::string>& args) {
  SuperviseOptions o;
  size_t i = 0;
  bool min_ranks_given = false;
  while (i < args.size()) {
    if (args[i] == "--help" || args[i] == "-h") {
      o.help = true;
      return o;
    }
    if (!parse_option(args, i, o, min_ranks_given)) break;
  }
  o.job.assign(args.begin() + static_cast<std::ptrdiff_t>(i), args.end());
  if (o.job.empty()) throw UsageError("supervise: no command after '--'");
  check_rank_counts(o, min_ranks_given);
  read_job_settings(o);
  return o;
}

// What the loop over attempts carries from one to the next.
struct Session {
  explicit Session(const SuperviseOptions& options) : o(options) {}
  const SuperviseOptions& o;
  bool notice = false;  // hydra: the survivors of a real failure hear of it and save their states
  SessionCheckpoints checkpoints;
  std::string from;  // the previous attempt's folder whose survivors this attempt continues
  int ranks = 1;
  int restarts_from_checkpoint = 0;
};

void warn_before_start(const SuperviseOptions& o, bool notice) {
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
}

// The command of attempt `attempt`; sets the session's rank count unless it continues from the
// survivors' states (whose count the plan gave).
std::vector<std::string> attempt_command(Session& s, int attempt) {
  const SuperviseOptions& o = s.o;
  std::vector<std::string> cmd;
  if (attempt == 0)
    cmd = o.job;
  else if (!s.from.empty())
    cmd = with_ranks(
        restart_command(o.job, attempt, false, o.min_ranks, s.checkpoints.restart_resume()),
        s.ranks);
  else
    cmd = restart_command(o.job, s.restarts_from_checkpoint, o.shrink, o.min_ranks,
                          s.checkpoints.restart_resume());
  if (s.from.empty()) s.ranks = job_ranks(cmd);
  if (!o.emergency_dir.empty()) cmd = with_failure_notice(cmd);
  return cmd;
}

using Environment = std::vector<std::pair<std::string, std::string>>;

// The attempt's environment and its emergency folder (made afresh; "" without emergency states).
// False, with the line saying why, when the folder cannot be made.
bool prepare_attempt(const Session& s, int attempt, Environment& env, std::string& folder) {
  const SuperviseOptions& o = s.o;
  // train.max_steps and train.stop_at count steps of the job as launched: a relaunch at another
  // rank count trains the same samples (gossip/train/loop.cpp).
  if (o.train && names_ranks(o.job) &&
      std::find(o.job.begin(), o.job.end(), ":") == o.job.end())  // not MPMD: one -n
    env.emplace_back(kPlanRanksEnv, std::to_string(job_ranks(o.job)));
  if (o.emergency_dir.empty() || !s.notice) return true;
  folder = (fs::path(o.emergency_dir) / ("attempt-" + std::to_string(attempt))).string();
  std::error_code ec;
  fs::remove_all(folder, ec);  // a state left by an earlier supervise session is not ours
  fs::create_directories(folder, ec);
  if (ec) {
    std::fprintf(stderr, "gossipgrad supervise: cannot create %s: %s\n", folder.c_str(),
                 ec.message().c_str());
    return false;
  }
  env.emplace_back(kEmergencyDirEnv, folder);
  if (!s.from.empty()) env.emplace_back(kEmergencyFromEnv, s.from);
  return true;
}

int exit_code(int status) {
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// The job exited 0: the session ends, its emergency states superseded by the final checkpoint.
int completed(const Session& s, int attempt) {
  const SuperviseOptions& o = s.o;
  if (o.train && o.train->train.stop_at > 0)
    std::fprintf(stderr,
                 "gossipgrad supervise: the job exited 0 after %d restart(s): it trained to "
                 "train.stop_at (a checkpoint to resume from) or to its end\n",
                 attempt);
  else
    std::fprintf(stderr, "gossipgrad supervise: the job completed after %d restart(s)\n", attempt);
  if (!o.emergency_dir.empty() && s.notice) {
    // The final checkpoint supersedes every emergency state: this session's folders go, and
    // the emergency folder once empty (it may be a folder of the user's, holding more).
    std::error_code ec;
    for (int k = 0; k <= attempt; ++k)
      fs::remove_all(fs::path(o.emergency_dir) / ("attempt-" + std::to_string(k)), ec);
    fs::remove(o.emergency_dir, ec);
  }
  return 0;
}

// After attempt `attempt` ended with wait status `status`: the session's exit code when it ends
// here (a stop, the job's completion, a usage error, no restart left), else nullopt.
std::optional<int> session_end(const Session& s, int attempt, int status,
                               const std::string& folder) {
  const int code = exit_code(status);
  if (!folder.empty())  // what the survivors of a real failure could not print themselves
    for (const std::string& line : emergency_logs(folder, s.ranks))
      std::fprintf(stderr, "%s\n", line.c_str());
  if (const int sig = stop_requested()) {
    std::fprintf(stderr,
                 "gossipgrad supervise: stopped by %s: the job was told to stop and exited "
                 "with %s %d; not restarting (resume with --checkpoint.resume auto)\n",
                 signal_name(sig), WIFEXITED(status) ? "code" : "signal",
                 WIFEXITED(status) ? code : WTERMSIG(status));
    return 128 + sig;
  }
  if (code == 0) return completed(s, attempt);
  const std::string how = WIFEXITED(status) ? "exit code " + std::to_string(code)
                                            : "signal " + std::to_string(WTERMSIG(status));
  if (code == 2 || code == 127) {
    std::fprintf(stderr,
                 "gossipgrad supervise: attempt %d failed with %s (a usage error or a "
                 "command that cannot run): not restarting\n",
                 attempt, how.c_str());
    return code;
  }
  if (attempt >= s.o.max_restarts) {
    std::fprintf(stderr,
                 "gossipgrad supervise: attempt %d failed with %s; giving up after %d "
                 "restart(s)\n",
                 attempt, how.c_str(), attempt);
    return code;
  }
  return std::nullopt;
}

// The survivors of a real failure continue from their states: the line saying how.
void say_relaunch(const RecoveryPlan& plan, int attempt, const std::string& how, double seconds,
                  int ranks) {
  std::string lost;
  for (int r : plan.lost) {
    if (!lost.empty()) lost += ',';
    lost += std::to_string(r);
  }
  const std::string first =
      plan.first_gone < 0 ? ""
                          : "; rank " + std::to_string(plan.first_gone) + "'s process ended first";
  std::fprintf(stderr,
               "gossipgrad supervise: attempt %d failed with %s after %.1f s%s: %zu of %d "
               "rank states saved (lost: %s); %d ranks continue at step %lld from them "
               "(%s, %lld step(s) redone)\n",
               attempt, how.c_str(), seconds, first.c_str(), plan.survivors.size(), ranks,
               lost.empty() ? "none" : lost.c_str(), plan.ranks_after(),
               static_cast<long long>(plan.step), plan.strategy(),
               static_cast<long long>(plan.steps_redone));
}

// After a failed attempt that is restarted: from which states or checkpoint the next one starts.
void choose_restart(Session& s, int attempt, int status, const std::string& folder,
                    double seconds) {
  const std::string how = WIFEXITED(status) ? "exit code " + std::to_string(exit_code(status))
                                            : "signal " + std::to_string(WTERMSIG(status));
  if (!s.from.empty() && !folder.empty() && emergency_activity(folder).states == 0) {
    // A relaunch that failed before any state of its own (a second death during the
    // recovery): the states it started from are still the newest.
    std::fprintf(stderr,
                 "gossipgrad supervise: attempt %d failed with %s after %.1f s, before any "
                 "state of its own: relaunching from the states in %s again\n",
                 attempt, how.c_str(), seconds, s.from.c_str());
    return;
  }
  const std::optional<RecoveryPlan> plan =
      plan_forward(folder, s.ranks, s.o.min_ranks, s.notice, s.o.replace);
  if (plan) {
    say_relaunch(*plan, attempt, how, seconds, s.ranks);
    s.from = folder;
    s.ranks = plan->ranks_after();
    return;
  }
  s.from.clear();
  ++s.restarts_from_checkpoint;
  std::fprintf(stderr,
               "gossipgrad supervise: attempt %d failed with %s after %.1f s; restarting from "
               "the latest valid checkpoint\n",
               attempt, how.c_str(), seconds);
}

}  // namespace

int cmd_supervise(const std::vector<std::string>& args) {
  const SuperviseOptions o = parse_supervise(args);
  if (o.help) {
    std::fputs(kHelp, stdout);
    return 0;
  }
  install_stop_handlers();
  Session s(o);
  s.notice = !o.job.empty() && is_hydra_launcher(o.job[0]);
  warn_before_start(o, s.notice);
  s.ranks = job_ranks(o.job);
  if (o.train)
    s.checkpoints = SessionCheckpoints(o.train->checkpoint.dir, o.train->checkpoint.resume);
  for (int attempt = 0;; ++attempt) {
    const std::vector<std::string> cmd = attempt_command(s, attempt);
    Environment env;
    std::string folder;
    if (!prepare_attempt(s, attempt, env, folder)) return 1;
    const auto t0 = std::chrono::steady_clock::now();
    const int status =
        run_attempt(cmd, attempt, o.stop_timeout, env, folder, s.ranks, o.start_timeout);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (const std::optional<int> code = session_end(s, attempt, status, folder)) return *code;
    choose_restart(s, attempt, status, folder, seconds);
  }
}

}  // namespace gg::gossip
