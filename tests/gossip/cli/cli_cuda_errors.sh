#!/usr/bin/env bash
# --train.backend cuda where it cannot run: a build without CUDA refuses it as a usage error (exit
# 2, one line); a build with CUDA on a machine without a GPU fails at startup (exit 1, one line
# naming the missing device). Skipped (77) on a machine with a GPU, where training just runs.
set -uo pipefail
BIN="$1"; ROOT="$2"; HAVE_CUDA="$3"
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
cd "$TMP"
CFG="$ROOT/configs/laptop.ini"
check() {  # check NAME RC PATTERN -- ARGS...
  local name="$1" want="$2" pattern="$3"; shift 4
  OMP_NUM_THREADS=1 "$BIN" "$@" >"$TMP/out" 2>"$TMP/err"; local rc=$?
  local lines; lines=$(wc -l <"$TMP/err")
  if [ "$rc" -ne "$want" ] || [ "$lines" -ne 1 ] || ! grep -q -- "$pattern" "$TMP/err"; then
    echo "FAIL: $name: exit $rc (want $want), $lines stderr lines:"; cat "$TMP/err"; exit 1
  fi
  echo "ok: $name -> $(cat "$TMP/err")"
}
if [ "$HAVE_CUDA" != "ON" ]; then
  check "train.backend cuda without CUDA" 2 "built without CUDA" -- \
    train --config "$CFG" --train.backend cuda --train.max_steps 1 --log.metrics "$TMP/m.jsonl"
  exit 0
fi
if ls /dev/nvidia[0-9]* >/dev/null 2>&1; then
  echo "SKIPPED: a GPU is present here; the no-device path does not apply"
  exit 77
fi
check "train.backend cuda without a GPU" 1 "no CUDA device" -- \
  train --config "$CFG" --train.backend cuda --train.max_steps 1 --model.width 4 \
  --train.threads 1 --log.metrics "$TMP/m.jsonl"
check "bf16 on the reference backend names both GPU and CPU choices" 2 "onednn or cuda" -- \
  train --config "$CFG" --train.precision bf16 --train.backend reference
