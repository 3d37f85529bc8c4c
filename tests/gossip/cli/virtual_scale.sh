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
python3 - "$TMP/p1024.jsonl" <<'PY'
import json, sys
summary = [json.loads(l) for l in open(sys.argv[1])][-1]
peak, plan = summary["peak_memory_bytes"], summary["memory_estimate_bytes"]
assert 0.8 <= peak / plan <= 1.2, f"P = 1024: peak {peak / 1e9:.3f} GB against {plan / 1e9:.3f} GB planned"
print(f"P = 1024: peak {peak / 1e9:.3f} GB, planned {plan / 1e9:.3f} GB ({peak / plan:.2f}x)")
PY

refused() { # WANT COMMAND...: one line naming WANT, exit 2, within 60 s
  local want="$1"; shift
  set +e; out=$(timeout 60 "$@" 2>&1); rc=$?; set -e
  [ "$rc" = 2 ] || fail "expected exit 2, got $rc: $out"
  [ "$(echo "$out" | grep -c "error:")" = 1 ] && echo "$out" | grep -q -- "$want" ||
    fail "expected one line naming '$want': $out"
}
refused "use at most" "$BIN" "${B0[@]}" --model.name resnet50 --data.source synthetic:3x64x64:10:100000 \
  --train.batch 2 --train.virtual_ranks 4096 --log.metrics "$TMP/r50.jsonl"
refused "ulimit -v" bash -c "ulimit -v 1500000; exec \"\$@\"" _ "$BIN" "${B[@]}" --train.batch 1 \
  --train.max_steps 3 --train.virtual_ranks 4096 --log.metrics "$TMP/ulimit.jsonl"

# SIGTERM between two ranks' turns: the stopped event, the line, exit 143, losses of whole steps.
"$BIN" "${B[@]}" --train.batch 32 --train.max_steps 3000 --train.virtual_ranks 8 \
  --log.metrics "$TMP/stop.jsonl" --log.losses "$TMP/stop/loss" >"$TMP/stop.out" 2>&1 &
pid=$!
for _ in $(seq 300); do
  grep -q '"event":"step"' "$TMP/stop.jsonl" 2>/dev/null && break
  sleep 0.1
done
kill -TERM "$pid"
set +e; wait "$pid"; rc=$?; set -e
[ "$rc" = 143 ] || fail "SIGTERM: exit $rc, not 143: $(cat "$TMP/stop.out")"
grep -q "stopped by SIGTERM after step" "$TMP/stop.out" || fail "SIGTERM: no line: $(tail -2 "$TMP/stop.out")"
python3 - "$TMP/stop.jsonl" "$TMP/stop/loss" <<'PY'
import json, sys
last = [json.loads(l) for l in open(sys.argv[1])][-1]
assert last["event"] == "stopped" and last["signal"] == "SIGTERM", last
for r in range(8):
    lines = open(f"{sys.argv[2]}.{r}").read().splitlines()
    assert len(lines) == last["step"], (r, len(lines), last["step"])
print(f"SIGTERM: stopped after step {last['step']}, every rank's losses written")
PY

# 5 test samples over 4 ranks: the last rank evaluates nothing (it threw), real and virtual alike.
python3 - "$TMP/five" <<'PY'
import gzip, os, sys
src, out = "/usr/share/datasets/fashion-mnist", sys.argv[1]
os.makedirs(out)
for split, n in (("train", 320), ("t10k", 5)):
    for kind, head, size in (("images-idx3", 16, 784), ("labels-idx1", 8, 1)):
        raw = gzip.open(f"{src}/{split}-{kind}-ubyte.gz").read()
        data = bytearray(raw[:head + n * size])
        data[4:8] = n.to_bytes(4, "big")
        open(f"{out}/{split}-{kind}-ubyte", "wb").write(data)
PY
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
