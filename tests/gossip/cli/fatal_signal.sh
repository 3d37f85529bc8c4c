#!/usr/bin/env bash
# A crash ends the process, it never hangs: a SIGSEGV (here sent from outside, as a stand-in for
# a real fault) prints gossipgrad's one line and a backtrace, and the process dies by the signal
# (exit 139), alone and under mpirun (whose ranks all end). Before, UCX's handler caught it and
# could deadlock inside malloc (gossip/cli/fatal_signals.cpp).
set -euo pipefail
BIN="$1"; ROOT="$2"; MPIEXEC="$3"
TMP=$(mktemp -d); trap 'pkill -KILL -f "$TMP/marker" 2>/dev/null || true; rm -rf "$TMP"' EXIT
export OMP_NUM_THREADS=1
args=(train --config "$ROOT/configs/laptop.ini" --model.width 8 --train.threads 1
      --train.max_steps 100000 --log.progress false --log.metrics "$TMP/marker.jsonl")
# Waits (bounded) until the run has written its first step, then sends SIGSEGV to one of its
# gossipgrad processes.
crash_one() {
  for _ in $(seq 600); do
    grep -q '"event":"step"' "$TMP/marker.jsonl" 2>/dev/null && break
    sleep 0.1
  done
  local pid=""
  for p in $(pgrep -f -- "$TMP/marker" || true); do
    [ "$(cat "/proc/$p/comm" 2>/dev/null)" = gossipgrad ] && pid=$p
  done
  [ -n "$pid" ] || { echo "FAIL: no training process found"; exit 1; }
  kill -SEGV "$pid"
}
timeout -s KILL 120 "$BIN" "${args[@]}" --train.virtual_ranks 2 >"$TMP/one.out" 2>&1 & run=$!
crash_one
set +e; wait "$run"; rc=$?; set -e
[ "$rc" = 139 ] || { echo "FAIL: one process: exit $rc, expected 139 (SIGSEGV)"; cat "$TMP/one.out"; exit 1; }
grep -q "gossipgrad: fatal SIGSEGV" "$TMP/one.out" || { echo "FAIL: no fatal line"; cat "$TMP/one.out"; exit 1; }
echo "one process: exit 139 with the fatal line"
rm -f "$TMP/marker.jsonl"
timeout 120 "$MPIEXEC" -n 2 "$BIN" "${args[@]}" >"$TMP/mpi.out" 2>&1 & run=$!
crash_one
set +e; wait "$run"; rc=$?; set -e
[ "$rc" != 0 ] && [ "$rc" != 124 ] || { echo "FAIL: mpirun: exit $rc"; cat "$TMP/mpi.out"; exit 1; }
grep -q "gossipgrad: fatal SIGSEGV" "$TMP/mpi.out" || { echo "FAIL: no fatal line under mpirun"; cat "$TMP/mpi.out"; exit 1; }
! pgrep -f -- "$TMP/marker" >/dev/null || { echo "FAIL: ranks left running"; exit 1; }
echo "mpirun: exit $rc, the fatal line, no rank left"
