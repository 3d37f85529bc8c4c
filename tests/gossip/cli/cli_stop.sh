#!/usr/bin/env bash
# SIGTERM (a scheduler's preemption) and SIGINT (Ctrl-C to the process group) stop a supervised
# job instead of restarting it: the ranks stop at a step boundary, write a full checkpoint, the
# supervisor says which signal stopped it and exits 128 + its number; the checkpoint resumes.
# A job that ignores the stop is killed after --stop-timeout. Also without supervise: mpirun
# passes SIGTERM on, and the ranks leave a checkpoint.
set -euo pipefail
BIN="$1"; ROOT="$2"; MPIEXEC="$3"
TMP=$(mktemp -d)
cleanup() { pkill -KILL -f "$TMP" 2>/dev/null || true; rm -rf "$TMP"; }
trap cleanup EXIT
cd "$TMP"
export OMP_NUM_THREADS=1
fail() { echo "FAIL: $*"; for f in *.log; do echo "== $f"; tail -5 "$f"; done; exit 1; }
RUN=(train --config "$ROOT/configs/laptop.ini" --data.source synthetic:1x28x28:10:2048
     --model.width 4 --train.threads 1 --train.batch 32 --train.epochs 200 --log.interval 0.5
     --gossip.consensus_every 0)
# Waits (at most 120 s) until the job in log $1 has run some steps.
wait_steps() {
  for _ in $(seq 1200); do grep -q "^step " "$1" 2>/dev/null && return 0; sleep 0.1; done
  fail "no training step in $1 after 120 s"
}

# 1. SIGTERM to the supervisor.
setsid "$BIN" supervise -- "$MPIEXEC" -n 2 "$BIN" "${RUN[@]}" --checkpoint.dir "$TMP/ck1" \
  --log.metrics m1.jsonl > out1.log 2> err1.log &
pid=$!
wait_steps out1.log
kill -TERM "$pid"
rc=0; wait "$pid" || rc=$?
[ "$rc" = 143 ] || fail "SIGTERM: supervise exited $rc, not 143"
grep -q "stopped by SIGTERM" err1.log || fail "SIGTERM: the cause is not named"
grep -q "attempt 1" err1.log && fail "SIGTERM: the job was restarted"
ls ck1/ckpt-*/MANIFEST.json > /dev/null 2>&1 || fail "SIGTERM: no full checkpoint"
grep -q '"event":"stopped"' m1.jsonl || fail "SIGTERM: no stopped event in the metrics"
step=$(ls -d ck1/ckpt-* | tail -1 | sed 's/.*ckpt-0*//')
"$MPIEXEC" -n 2 "$BIN" "${RUN[@]}" --train.max_steps $((step + 5)) --checkpoint.dir ck1 \
  --checkpoint.resume auto --log.metrics m1.jsonl > resume1.log 2>&1 || fail "resume failed"
grep -q "resumed from ck1/ckpt-0*$step at step $step" resume1.log || fail "not resumed at $step"

# 2. Ctrl-C: SIGINT to the supervisor's whole process group; the ranks agree on it behind the
# next step (guard.lag 1).
setsid "$BIN" supervise -- "$MPIEXEC" -n 2 "$BIN" "${RUN[@]}" --checkpoint.dir "$TMP/ck2" \
  --guard.lag 1 --log.metrics m2.jsonl > out2.log 2> err2.log &
pid=$!
wait_steps out2.log
kill -INT -- -"$pid"
rc=0; wait "$pid" || rc=$?
[ "$rc" = 130 ] || fail "SIGINT: supervise exited $rc, not 130"
grep -q "stopped by SIGINT" err2.log || fail "SIGINT: the cause is not named"
grep -q "attempt 1" err2.log && fail "SIGINT: the job was restarted"
ls ck2/ckpt-*/MANIFEST.json > /dev/null 2>&1 || fail "SIGINT: no full checkpoint"

# 3. A job that ignores SIGTERM is killed after --stop-timeout.
setsid "$BIN" supervise --stop-timeout 2 -- bash -c 'trap "" TERM; echo ignoring; sleep 60' \
  > out3.log 2> err3.log &
pid=$!
# Signal only once the job ignores SIGTERM (on a loaded machine bash may take a while to start).
for _ in $(seq 1200); do grep -q "ignoring" out3.log 2>/dev/null && break; sleep 0.1; done
grep -q "ignoring" out3.log || fail "stop-timeout: the job did not start"
t0=$(date +%s)
kill -TERM "$pid"
rc=0; wait "$pid" || rc=$?
[ "$rc" = 143 ] || fail "stop-timeout: supervise exited $rc, not 143"
grep -q "did not stop within 2 s of SIGTERM: killing it" err3.log || fail "stop-timeout: no kill"
[ $(( $(date +%s) - t0 )) -lt 30 ] || fail "stop-timeout: the wait was not bounded"

# 4. No supervisor: SIGTERM to mpirun reaches the ranks, which stop with a checkpoint.
"$MPIEXEC" -n 2 "$BIN" "${RUN[@]}" --checkpoint.dir ck4 --log.metrics m4.jsonl \
  > out4.log 2> err4.log &
pid=$!
wait_steps out4.log
kill -TERM "$pid"
wait "$pid" || true  # the ranks exit 143; what mpirun reports after a forwarded signal is hydra's
grep -q "stopped by SIGTERM after step" err4.log || fail "mpirun: the cause is not named"
ls ck4/ckpt-*/MANIFEST.json > /dev/null 2>&1 || fail "mpirun: no full checkpoint"
echo "PASS: SIGTERM and SIGINT stop the job with a checkpoint, supervised or not"
