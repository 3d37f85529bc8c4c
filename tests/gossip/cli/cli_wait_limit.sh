#!/usr/bin/env bash
# Every wait on another rank is bounded by gossip.timeout_s, not only the gossip exchange: a rank
# stalled (SIGSTOP) in allreduce mode, or with the distributed shuffle moving samples, ends the
# job within the limit with one line naming the waiting rank, the call and the step.
set -euo pipefail
BIN="$1"; ROOT="$2"; MPIEXEC="$3"
TMP=$(mktemp -d)
cleanup() { pkill -KILL -f "$TMP" 2>/dev/null || true; rm -rf "$TMP"; }
trap cleanup EXIT
cd "$TMP"
export OMP_NUM_THREADS=1
fail() { echo "FAIL: $*"; tail -5 "$TMP"/*.log; exit 1; }
RUN=(train --config "$ROOT/configs/laptop.ini" --data.source synthetic:1x28x28:10:2048
     --model.width 4 --train.threads 1 --train.epochs 3 --gossip.timeout_s 5 --fault.stall 1:5
     --log.progress false)

# name, extra options, the call the waiting rank must name.
check() {
  local name=$1 call=$2; shift 2
  local t0; t0=$(date +%s)
  local rc=0
  timeout 120 "$MPIEXEC" -n 2 "$BIN" "${RUN[@]}" --log.metrics "$TMP/$name.jsonl" "$@" \
    > "$name.log" 2>&1 || rc=$?
  local took=$(( $(date +%s) - t0 ))
  [ "$rc" != 0 ] || fail "$name: a stalled rank went unnoticed (exit 0)"
  [ "$rc" != 124 ] || fail "$name: the job hung until timeout(1) killed it"
  grep -q "rank 0 waited more than 5 s for the other ranks in $call" "$name.log" ||
    fail "$name: no line naming the wait in $call"
  grep -q "step 5" "$name.log" || fail "$name: the line does not name the step"
  [ "$took" -lt 60 ] || fail "$name: took $took s for a 5 s limit"
  echo "$name: stopped after $took s: $(grep 'waited more than' "$name.log")"
}
check allreduce "MPI_Allreduce" --gossip.mode allreduce
check shuffle "MPI_" --gossip.mode allreduce --data.shuffle bytes --data.shuffle_per_step 4
echo "PASS: waits on a stalled rank end within gossip.timeout_s"
