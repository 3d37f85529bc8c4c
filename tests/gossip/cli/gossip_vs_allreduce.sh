#!/usr/bin/env bash
# Gossip training (the default: both, dissemination + rotation) must reach the top-1 of allreduce
# training within 0.5% (absolute) with the same hyper-parameters, epochs and rank count.
set -euo pipefail
BIN="$1"; ROOT="$2"; MPIEXEC="$3"; P="${4:-4}"
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
common=(train --config "$ROOT/configs/laptop.ini" --train.epochs 2 --train.warmup_epochs 0.2
        --model.width 8 --train.threads 1 --log.progress false)
for mode in both allreduce; do
  OMP_NUM_THREADS=1 "$MPIEXEC" -n "$P" "$BIN" "${common[@]}" --gossip.mode "$mode" \
    --log.metrics "$TMP/$mode.jsonl" | grep -E "^(epoch|done)"
done
python3 - "$TMP/both.jsonl" "$TMP/allreduce.jsonl" <<'PY'
import json, sys
def top1(path):
    return [e for e in map(json.loads, open(path)) if e["event"] == "eval"][-1]["top1"]
g, a = top1(sys.argv[1]), top1(sys.argv[2])
print(f"gossip top-1 {100*g:.2f}%  allreduce top-1 {100*a:.2f}%  difference {100*(g-a):+.2f}%")
assert g >= a - 0.005, "gossip is more than 0.5% below allreduce"
PY
