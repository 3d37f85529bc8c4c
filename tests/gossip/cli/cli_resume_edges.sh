#!/usr/bin/env bash
# Resume corner cases (issue 15): a run with nothing left to do evaluates the restored model
# instead of reporting 0%; another train.batch than the checkpoint's is refused in one line;
# log.samples goes on in the same file after a resume; more threads than cores get a warning.
set -euo pipefail
BIN="$1"; ROOT="$2"; MPIEXEC="$3"
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
cd "$TMP"
export OMP_NUM_THREADS=1
fail() { echo "FAIL: $*"; for f in *.log; do echo "== $f"; tail -4 "$f"; done; exit 1; }
BASE=(train --config "$ROOT/configs/laptop.ini" --model.width 4
     --train.epochs 1 --train.eval_batch 1000 --log.progress false
     --gossip.consensus_every 0)
RUN=("${BASE[@]}" --train.threads 1 --checkpoint.dir ck --log.samples samples)
"$MPIEXEC" -n 2 "$BIN" "${RUN[@]}" --train.max_steps 40 --log.metrics m.jsonl > first.log 2>&1 ||
  fail "first run"
top1() { grep '"event":"summary"' "$1" | tail -1 | sed 's/.*"top1":\([0-9.e-]*\).*/\1/'; }
first=$(top1 m.jsonl)
lines_before=$(wc -l < samples.0)

# Nothing left to do: the restored model is evaluated.
"$MPIEXEC" -n 2 "$BIN" "${RUN[@]}" --train.max_steps 40 --checkpoint.resume auto \
  --log.metrics m.jsonl > again.log 2>&1 || fail "resume of a finished run failed"
grep -q "nothing left to train; evaluating the restored model" again.log ||
  fail "no 'nothing left to train' line"
again=$(top1 m.jsonl)
/usr/bin/python3 -c "import sys; a, b = float('$first'), float('$again'); sys.exit(0 if a > 0.12 and abs(a - b) < 0.02 else 1)" ||
  fail "finished run resumed: top-1 $again, the run ended at $first"
[ "$(wc -l < samples.0)" = "$lines_before" ] || fail "log.samples changed by a run of no steps"

# Another batch: refused in one line, exit 2.
rc=0
"$MPIEXEC" -n 2 "$BIN" "${RUN[@]}" --train.max_steps 60 --train.batch 32 \
  --checkpoint.resume auto --log.metrics m.jsonl > batch.log 2>&1 || rc=$?
[ "$rc" = 2 ] || fail "another batch: exit $rc, not 2"
grep -q "steps per epoch, this run has" batch.log || fail "another batch: no clear line"

# A resumed run appends its samples to the same file.
"$MPIEXEC" -n 2 "$BIN" "${RUN[@]}" --train.max_steps 50 --checkpoint.resume auto \
  --log.metrics m.jsonl > more.log 2>&1 || fail "resume to 50 steps"
[ "$(wc -l < samples.0)" = $((lines_before + 10)) ] ||
  fail "log.samples: $(wc -l < samples.0) lines after 40 + 10 steps"

# Oversubscribed: a warning, and training still runs.
cores=$(getconf _NPROCESSORS_ONLN)  # what the trainer counts (nproc honours OMP_NUM_THREADS)
"$MPIEXEC" -n 2 "$BIN" "${BASE[@]}" --train.threads $((cores + 1)) --train.max_steps 2 \
  --log.metrics m2.jsonl > over.log 2>&1 ||
  fail "oversubscribed run"
grep -q "warning: 2 ranks x $((cores + 1)) threads on a node of $cores cores" over.log ||
  fail "no oversubscription warning"
echo "PASS: finished-run resume evaluates ($first -> $again), batch change refused, samples appended"
