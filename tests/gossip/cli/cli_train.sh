#!/usr/bin/env bash
# A short real run: 2 ranks under mpirun train on Fashion-MNIST for 300 steps and must beat
# chance by far; the metrics file must hold step, eval and summary events.
set -euo pipefail
BIN="$1"; ROOT="$2"; MPIEXEC="$3"
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
OMP_NUM_THREADS=1 "$MPIEXEC" -n 2 "$BIN" train --config "$ROOT/configs/laptop.ini" \
  --train.max_steps 300 --train.warmup_epochs 0.1 --model.width 8 --train.threads 1 --log.metrics "$TMP/m.jsonl" \
  --log.interval 5
python3 - "$TMP/m.jsonl" <<'PY'
import json, sys
events = [json.loads(l) for l in open(sys.argv[1])]
kinds = {e["event"] for e in events}
assert {"start", "step", "eval", "summary"} <= kinds, kinds
steps = [e for e in events if e["event"] == "step"]
assert len(steps) == 300, len(steps)
top1 = [e for e in events if e["event"] == "eval"][-1]["top1"]
print(f"top-1 after 300 steps: {top1:.4f}")
assert top1 > 0.75, top1
PY

# One rank in the default gossip mode: its only partner is itself, the exchange is the identity.
OMP_NUM_THREADS=1 "$BIN" train --config "$ROOT/configs/laptop.ini" --train.max_steps 20 \
  --model.width 4 --train.threads 1 --train.eval_batch 1000 --log.metrics "$TMP/one.jsonl" \
  --log.interval 5 >/dev/null
grep -q '"event":"summary"' "$TMP/one.jsonl"
echo "one rank, gossip mode: ok"
