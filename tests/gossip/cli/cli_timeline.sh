#!/usr/bin/env bash
# --log.timeline: 2 ranks train a few steps; the file is valid Chrome trace JSON with both ranks,
# named threads, per-layer forward/backward events inside each step's forward/backward span,
# bucket exchanges on a communication thread, and events on one thread properly nested.
set -euo pipefail
BIN="$1"; ROOT="$2"; MPIEXEC="$3"
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
OMP_NUM_THREADS=1 "$MPIEXEC" -n 2 "$BIN" train --config "$ROOT/configs/laptop.ini" \
  --train.max_steps 12 --model.width 4 --train.threads 1 --log.metrics "$TMP/m.jsonl" \
  --log.timeline "$TMP/trace.json" --log.timeline_steps 8 --log.progress false >/dev/null
python3 - "$TMP/trace.json" <<'PY'
import collections, json, sys
d = json.load(open(sys.argv[1]))
ev = d["traceEvents"]
x = [e for e in ev if e["ph"] == "X"]
for e in x:
    assert {"name", "cat", "ts", "dur", "pid", "tid"} <= e.keys(), e
    assert e["dur"] >= 0 and e["ts"] >= 0, e
assert {e["pid"] for e in x} == {0, 1}, "both ranks"
names = {(e["pid"], e["tid"]): e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
for pid in (0, 1):
    steps = [e for e in x if e["pid"] == pid and e["cat"] == "step"]
    assert len(steps) == 8, (pid, len(steps))  # timeline_steps
    fwd = [e for e in x if e["pid"] == pid and e["name"] == "forward"]
    layers = [e for e in x if e["pid"] == pid and e["name"].startswith("fwd ")]
    assert len(layers) >= 8 * 10, len(layers)
    for l in layers:  # every layer event sits inside one forward span of its thread
        assert any(f["tid"] == l["tid"] and f["ts"] <= l["ts"] and
                   l["ts"] + l["dur"] <= f["ts"] + f["dur"] for f in fwd), l
    buckets = [e for e in x if e["pid"] == pid and e["name"].startswith("bucket ")]
    assert buckets and all(names[(pid, b["tid"])].startswith("gossip comm") for b in buckets)
    assert names[(pid, steps[0]["tid"])] == "compute"
# Spans on one thread nest: sorted by start, each one ends before the enclosing one does.
by_thread = collections.defaultdict(list)
for e in x:
    by_thread[(e["pid"], e["tid"])].append(e)
for key, es in by_thread.items():
    es.sort(key=lambda e: (e["ts"], -e["dur"]))
    stack = []
    for e in es:
        while stack and stack[-1]["ts"] + stack[-1]["dur"] <= e["ts"]:
            stack.pop()
        if stack:
            outer = stack[-1]
            assert e["ts"] + e["dur"] <= outer["ts"] + outer["dur"], (key, outer, e)
        stack.append(e)
print(f"timeline: {len(x)} events, {len(by_thread)} threads, nesting ok")
PY
