#!/usr/bin/env bash
# Emulated compute ([emulate]) end to end: a 2-rank run of resnet50 waits instead of computing,
# exchanges the real 25.6M-parameter gradient, says so at the start and in every metrics event,
# and reports no loss and no accuracy; its steps last at least the emulated compute; a 3x
# straggler slows its partner's steps too (gossip waits for the partner); options that need a
# model that learns are refused with one line and exit 2.
set -euo pipefail
BIN="$1"; ROOT="$2"; MPIEXEC="$3"
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
cd "$TMP"
export OMP_NUM_THREADS=1
fail() { echo "FAIL: $*"; for f in *.log; do echo "== $f"; tail -5 "$f"; done; exit 1; }
RUN=(train --config "$ROOT/configs/laptop.ini" --model.name resnet50 --train.threads 1
     --train.batch 16 --train.max_steps 8 --gossip.mode grad --gossip.consensus_every 0
     --emulate.forward_ms 40 --emulate.backward_ms 80 --emulate.update_ms 10
     --log.progress false --log.overwrite true)

"$MPIEXEC" -n 2 "$BIN" "${RUN[@]}" --log.metrics quiet.jsonl > quiet.log 2>&1 ||
  fail "emulated run: exit $?"
grep -q "EMULATED compute: forward 40 ms, backward 80 ms, update 10 ms" quiet.log ||
  fail "no EMULATED line"
grep -q "emulated compute: no accuracy" quiet.log || fail "the summary line does not say emulated"
"$MPIEXEC" -n 2 "$BIN" "${RUN[@]}" --emulate.slow 1:3 --log.metrics slow.jsonl > slow.log 2>&1 ||
  fail "straggler run: exit $?"

/usr/bin/python3 - <<'PY' || fail "metrics"
import json, statistics
def events(path):
    return [json.loads(line) for line in open(path)]
quiet, slow = events("quiet.jsonl"), events("slow.jsonl")
for e in quiet + slow:
    assert e.get("emulated") is True, e
steps = [e for e in quiet if e["event"] == "step"]
assert len(steps) == 8, len(steps)
assert all(e["loss"] is None for e in steps), steps[0]
# The real gradient of resnet50 (25,557,032 floats) went to the partner every step.
assert all(e["sent_bytes"] == 25557032 * 4 for e in steps), [e["sent_bytes"] for e in steps]
summary = [e for e in quiet if e["event"] == "summary"][0]
assert summary["top1"] is None and summary["params"] == 25557032, summary
assert not [e for e in quiet if e["event"] == "eval"], "an emulated run evaluated"
q = statistics.median(e["step_s"] for e in steps[2:])
s = statistics.median(e["step_s"] for e in slow if e["event"] == "step")
# Never faster than the emulated compute (130 ms); rank 0 waits for its 3x partner (390 ms).
assert q >= 0.130, q
assert s >= 0.9 * 3 * 0.130 and s > 2 * q, (q, s)
print(f"median step: {q:.3f} s quiet, {s:.3f} s with a 3x straggler")
PY

"$BIN" "${RUN[@]}" --checkpoint.dir "$TMP/ck" --log.metrics x.jsonl > refused.log 2>&1 &&
  fail "checkpoint.dir with emulated compute was accepted"
[ "$(wc -l < refused.log)" = 1 ] &&
  grep -q "checkpoint.dir cannot be used with emulated compute" refused.log ||
  fail "refusal: $(cat refused.log)"
echo "PASS: emulated compute"
