#!/usr/bin/env bash
# bench/compute/profile.sh on a small setting, oneDNN only (TORCH=0): its table of the step's
# convolution passes against the same shapes timed alone is there. A setting that a tool refuses
# ends profile.sh and layout_ab.sh with one line naming the tool, the setting and the tool's own
# reason, and a non-zero exit (both used to exit without a word). Timings are not checked (bench/
# measures them).
set -uo pipefail
ROOT="$1"
BUILD="$2"
cd "$ROOT"
NAME=profile-test-$$
trap 'rm -f "bench/results/$NAME.md"' EXIT
fail=0
out=$(BUILD="$BUILD" TORCH=0 STEPS=1 NAME=$NAME timeout 240 bench/compute/profile.sh \
  resnet8:2:32:1:fp32 2>/dev/null)
rc=$?
if [ "$rc" -ne 0 ] || ! grep -q "^Convolutions in the step against the same shapes alone" <<<"$out" ||
  ! grep -Eq '^\| c[0-9]+ k[0-9]+ [0-9]+px r[0-9]+ s[0-9]+ \| (forward|backward_data|backward_weights) \| [0-9.]+ \| [0-9.]+ \| [-+][0-9.]+ \|$' <<<"$out"; then
  echo "FAIL: resnet8: exit $rc, no per-layer table:"
  tail -12 <<<"$out"
  fail=1
else
  echo "ok: resnet8: the per-layer table"
fi
refused() {  # refused NAME WANT -- COMMAND...: a non-zero exit whose last line starts with WANT
  local name="$1" want="$2" err rc last
  shift 3
  err=$(timeout 60 "$@" 2>&1 >/dev/null)
  rc=$?
  last=$(tail -n 1 <<<"$err")
  if [ "$rc" -eq 0 ] || [[ "$last" != "$want"* ]]; then
    echo "FAIL: $name: exit $rc, last line: $last"
    fail=1
  else
    echo "ok: $name -> $last"
  fi
}
refused "profile.sh, an unknown model" \
  "profile.sh: gg_bench_compute failed for nosuch:2:32:1:fp32 (exit 1): gg_bench_compute: error: unknown model 'nosuch'" \
  -- env BUILD="$BUILD" TORCH=0 STEPS=1 NAME="$NAME" bench/compute/profile.sh nosuch:2:32:1:fp32
refused "layout_ab.sh, an unknown model" \
  "layout_ab.sh: gg_bench_compute failed for nosuch:2:32:1:fp32 (plain, exit 1): gg_bench_compute: error: unknown model 'nosuch'" \
  -- env BUILD="$BUILD" REPEATS=1 STEPS=1 bench/compute/layout_ab.sh nosuch:2:32:1:fp32
# gg_bench_compute --fuse, --layout nhwc and --graph: CUDA's switches, refused elsewhere and for an unknown
# value.
for args in "--fuse off:--fuse needs --backend cuda" \
  "--backend cuda --fuse maybe:--fuse 'maybe' is unknown (on or off)" \
  "--layout nhwc:--layout nhwc needs --backend cuda" \
  "--graph on:--graph needs --backend cuda" \
  "--backend cuda --graph on --warmup 1:--graph on runs one warm-up step eagerly and captures the next: give --warmup 2 or more"; do
  # shellcheck disable=SC2086 # the options are words
  first=$(timeout 60 "$BUILD/bench/gg_bench_compute" ${args%%:*} 2>&1 >/dev/null | head -n 1)
  if [ "$first" != "gg_bench_compute: ${args#*:}" ]; then
    echo "FAIL: gg_bench_compute ${args%%:*}: $first"
    fail=1
  else
    echo "ok: gg_bench_compute ${args%%:*} -> $first"
  fi
done
exit $fail
