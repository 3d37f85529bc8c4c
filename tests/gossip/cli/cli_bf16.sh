#!/usr/bin/env bash
# bf16 training on real data: resnet8 on Fashion-MNIST, 2 ranks under mpirun, 600 steps in fp32
# and in bf16 from the same seed; bf16 must reach fp32's top-1 within one point. On a CPU without
# AVX512_BF16, bf16 must be refused as a usage error (exit 2), and the test reports itself skipped.
set -euo pipefail
BIN="$1"; ROOT="$2"; MPIEXEC="$3"
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
run() {
  OMP_NUM_THREADS=1 "$MPIEXEC" -n 2 "$BIN" train --config "$ROOT/configs/laptop.ini" \
    --train.max_steps 600 --train.warmup_epochs 0.1 --model.width 8 --train.threads 1 \
    --log.metrics "$TMP/$1.jsonl" --log.interval 100 --train.precision "$1" >"$TMP/$1.log" 2>&1
}
# bf16 first: where the CPU refuses it (before any training), the fp32 run is not needed.
rc=0; run bf16 || rc=$?
if [ "$rc" -ne 0 ]; then
  if [ "$rc" -eq 2 ] && grep -q "AVX512_BF16" "$TMP/bf16.log"; then
    echo "bf16 refused on this CPU, as it must be: skipped"; exit 77
  fi
  cat "$TMP/bf16.log"; exit 1
fi
run fp32 || { cat "$TMP/fp32.log"; exit 1; }
python3 - "$TMP/fp32.jsonl" "$TMP/bf16.jsonl" <<'PY'
import json, sys
def top1(path):
    return [json.loads(l) for l in open(path) if '"eval"' in l][-1]["top1"]
f, b = top1(sys.argv[1]), top1(sys.argv[2])
print(f"top-1 after 600 steps: fp32 {f:.4f}, bf16 {b:.4f}")
assert f > 0.75, f
assert b >= f - 0.01, (b, f)
PY
