# Sourced by the tests that kill ranks of a running job (cli_real_failure.sh,
# cli_supervise_hardening.sh): following its metrics file and finding a rank's process, also once
# it has stalled itself. The sourcing script defines fail().

# The last step the metrics file $1 shows done (empty: none yet).
last_step() {
  { grep '"event":"step"' "$1" 2>/dev/null || true; } | tail -1 | grep -o '"step":[0-9]*' |
    sed 's/.*://' || true
}

# Waits (at most 60 s) until the metrics file $1 shows step $2 done.
wait_step() {
  for _ in $(seq 600); do
    s=$(last_step "$1"); [ -n "$s" ] && [ "$s" -ge "$2" ] && return 0; sleep 0.1
  done
  fail "step $2 not reached in 60 s: $(tail -3 "$1" 2>/dev/null)"
}

# Waits (at most 60 s) until rank $2 of the job whose command line names $1 has stopped itself
# (fault.stall: SIGSTOP before a step), then prints its pid; returns 1 if it does not. A kill
# from outside of a stalled rank lands at a known step: one of a running rank races the job's end
# on a fast or loaded machine.
stalled_rank() {
  local p=""
  for _ in $(seq 600); do
    p=$(rank_pid "$1" "$2") &&
      [[ $(ps -o stat= -p "$p" 2>/dev/null) == T* ]] && { echo "$p"; return 0; }
    sleep 0.1
  done
  echo "rank $2 of the job in $1 did not stall in 60 s${p:+ (pid $p: $(ps -o stat= -p "$p"))}" >&2
  return 1
}

# The pid of rank $2 of the job whose command line names $1 (hydra gives each rank PMI_RANK).
rank_pid() {
  local p
  for p in $(pgrep -f "gossipgrad train .*$1" || true); do
    if tr '\0' '\n' < /proc/$p/environ 2>/dev/null | grep -qx "PMI_RANK=$2"; then
      echo "$p"; return 0
    fi
  done
  return 1
}
