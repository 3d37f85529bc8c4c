#!/usr/bin/env bash
# A job one of whose ranks is killed with SIGKILL mid-run still completes under
# `gossipgrad supervise`: the restart resumes from the latest valid checkpoint and the model
# reaches a sane accuracy on Fashion-MNIST. With --shrink-on-failure the restart runs one rank
# fewer (3 -> 2). A usage error is not restarted.
set -euo pipefail
BIN="$1"; ROOT="$2"; MPIEXEC="$3"
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
cd "$TMP"
export OMP_NUM_THREADS=1
fail() { echo "FAIL: $*"; exit 1; }
RUN=(train --config "$ROOT/configs/laptop.ini" --data.dir /usr/share/datasets/fashion-mnist
     --model.width 4 --train.threads 1 --train.warmup_epochs 0
     --train.eval_batch 1000 --log.progress false --gossip.consensus_every 0)

# Rank 1 dies at step 150 of 300; checkpoints every 40 steps; no emergency states (the restart
# from the newest checkpoint; cli_real_failure.sh tests the states).
"$BIN" supervise --max-restarts 2 --emergency-dir none -- "$MPIEXEC" -n 2 "$BIN" "${RUN[@]}" --train.epochs 1 \
  --train.max_steps 300 \
  --checkpoint.dir ck --checkpoint.every 40 --fault.kill 1:150 --log.metrics m.jsonl \
  > out.log 2> err.log || fail "supervise exited $?: $(tail -5 err.log)"
grep -q "rank 1: fault hook: SIGKILL at step 150" err.log || fail "the rank was not killed"
grep -q "attempt 0 failed" err.log || fail "no failure seen"
grep -q "resumed from ck/ckpt-000000000120 at step 120" out.log || fail "not resumed at 120"
grep -q "the job completed after 1 restart(s)" err.log || fail "did not complete"
top1=$(grep '"event":"summary"' m.jsonl | tail -1 | sed 's/.*"top1":\([0-9.]*\).*/\1/')
echo "top-1 after the restart: $top1"
/usr/bin/python3 -c "import sys; sys.exit(0 if float('$top1') > 0.70 else 1)" ||
  fail "top-1 $top1 is not sane"
grep -q '"ranks": 2' ck/ckpt-000000000300/MANIFEST.json || fail "no final checkpoint"

# 3 ranks, rank 2 killed; the restart runs 2 ranks from the 3-rank checkpoint.
SYN=(--data.source synthetic:1x28x28:10:2000 --data.prefetch 2 --train.batch 32 --train.epochs 3)
"$BIN" supervise --shrink-on-failure --emergency-dir none -- "$MPIEXEC" -n 3 "$BIN" "${RUN[@]}" "${SYN[@]}" \
  --train.max_steps 50 --checkpoint.dir ck3 --checkpoint.every 20 --fault.kill 2:30 \
  --log.metrics m3.jsonl > out3.log 2> err3.log || fail "shrink: $(tail -5 err3.log)"
grep -q "attempt 1: .* -n 2 " err3.log || fail "no 2-rank restart"
grep -q "(3 ranks, step 20) at 2 ranks" out3.log || fail "not resumed at 2 ranks"
grep -q '"ranks": 2' ck3/ckpt-000000000*/MANIFEST.json || fail "no 2-rank checkpoint"

# A usage error is not retried.
set +e
"$BIN" supervise -- "$MPIEXEC" -n 2 "$BIN" "${RUN[@]}" --train.lr -1 > u.log 2> u.err
rc=$?
set -e
[ $rc = 2 ] && grep -q "not restarting" u.err && [ "$(grep -c 'attempt .*: ' u.err)" = 2 ] ||
  fail "usage error: $rc $(cat u.err)"
echo "supervise: ok"
