# Sourced by the tests that kill ranks of a running job (cli_real_failure.sh,
# cli_supervise_hardening.sh): following its metrics file and finding a rank's process. The
# sourcing script defines fail().

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
