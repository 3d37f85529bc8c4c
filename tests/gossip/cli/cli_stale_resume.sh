#!/usr/bin/env bash
# Staleness 1 on exchanges made after step 0 (issue 31, row 1): a resumed run on every transport,
# a run after a simulated failure (forward, restart) and after apoptosis train on instead of
# hanging in the exchange engine; each run is bounded by
# `timeout` so that a regression fails the test instead of hanging it.
set -euo pipefail
BIN="$1"; ROOT="$2"; MPIEXEC="$3"
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
cd "$TMP"
export OMP_NUM_THREADS=1
fail() { echo "FAIL: $*"; for f in *.log; do echo "== $f"; tail -4 "$f"; done; exit 1; }
# 4000 synthetic samples (31 steps per epoch at 2 ranks, 20 at 3): what the runs check is the
# exchange engine, and loading and evaluating Fashion-MNIST took two thirds of each run.
RUN=(train --config "$ROOT/configs/laptop.ini" --model.name cnn --model.width 4
     --data.source synthetic:1x28x28:10:4000 --train.epochs 1 --train.eval_batch 1000 --train.threads 1 --log.progress false
     --gossip.consensus_every 0 --gossip.mode grad --gossip.staleness 1
     --gossip.timeout_s 20)
for transport in shm p2p rma; do
  rc=0
  timeout 120 "$MPIEXEC" -n 2 "$BIN" "${RUN[@]}" --gossip.transport "$transport" \
    --checkpoint.dir "ck-$transport" --train.stop_at 10 --train.max_steps 20 \
    --log.metrics "first-$transport.jsonl" > "first-$transport.log" 2>&1 || rc=$?
  [ "$rc" = 143 ] || [ "$rc" = 0 ] || fail "$transport: first run (stop at 10) exit $rc"
  ls -d "ck-$transport"/ckpt-* > /dev/null 2>&1 || fail "$transport: no checkpoint at step 10"
  rc=0
  timeout 120 "$MPIEXEC" -n 2 "$BIN" "${RUN[@]}" --gossip.transport "$transport" \
    --checkpoint.dir "ck-$transport" --checkpoint.resume auto --train.max_steps 20 \
    --log.metrics "resumed-$transport.jsonl" > "resumed-$transport.log" 2>&1 || rc=$?
  [ "$rc" = 0 ] || fail "$transport: the resumed run ended with $rc (124: it hung)"
  grep -q '"event":"summary"' "resumed-$transport.jsonl" || fail "$transport: no summary"
done
# Exchanges rebuilt mid-run: after a simulated failure (forward and restart) and after apoptosis
# shrinks the buffers.
for strategy in forward restart; do
  rc=0
  timeout 120 "$MPIEXEC" -n 3 "$BIN" "${RUN[@]}" --train.max_steps 16 --fault.inject 1:6 \
    --fault.strategy "$strategy" --checkpoint.dir "ck-$strategy" --checkpoint.every 4 \
    --log.metrics "fault-$strategy.jsonl" > "fault-$strategy.log" 2>&1 || rc=$?
  [ "$rc" = 0 ] || fail "simulated failure, $strategy: exit $rc (124: it hung)"
done
rc=0
timeout 120 "$MPIEXEC" -n 2 "$BIN" "${RUN[@]}" --train.max_steps 16 --apoptosis.enable true \
  --apoptosis.interval 5 --apoptosis.threshold 2 --apoptosis.layers fc \
  --log.metrics apoptosis.jsonl > apoptosis.log 2>&1 || rc=$?
[ "$rc" = 0 ] || fail "apoptosis with staleness 1: exit $rc (124: it hung)"
grep -q '"event":"apoptosis"' apoptosis.jsonl || fail "apoptosis removed nothing: the rebuild was not tested"
echo "PASS: staleness 1 resumes and trains on shm, p2p and rma, after simulated failures and apoptosis"
