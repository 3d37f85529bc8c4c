#!/usr/bin/env bash
# gg_bench_pool: one row per max pool of the model with its input shape (GoogLeNet: 13, ResNet-50:
# 1), for 8- and 16-channel blocks, then a total row; bad options are one clear first line and
# exit 2. Timings are not checked (bench/ measures them).
set -uo pipefail
BIN="$1"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fail=0
for block in 8 16; do
  if ! OMP_NUM_THREADS=2 "$BIN" --model googlenet --res 64 --block "$block" --repeats 2 \
    >"$TMP/gn.csv" 2>"$TMP/err"; then
    echo "FAIL: gg_bench_pool --block $block exited non-zero: $(cat "$TMP/err")"
    exit 1
  fi
  python3 - "$TMP/gn.csv" "$block" <<'PY' || fail=1
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
block = sys.argv[2]
pools, total = rows[:-1], rows[-1]
assert total["pool"] == "total", total
# torchvision's GoogLeNet: maxpool1-4 and the pool branch of each of the nine inception blocks.
assert len(pools) == 13, [r["pool"] for r in pools]
assert [r["pool"] for r in pools][:2] == ["maxpool1", "maxpool2"], pools[:2]
assert sum(r["pool"].endswith("branch4.0") for r in pools) == 9, pools
# 64 px: maxpool1 reads conv1's output, 64 channels at 32 x 32 (stride 2).
assert pools[0]["shape"] == "16x64x32x32" and pools[0]["k"] == "3" and pools[0]["stride"] == "2"
assert all(r["block"] == block and r["repeats"] == "2" for r in rows), rows
assert all(r["vectors"] in ("avx512", "avx2", "baseline") for r in rows), rows
for r in rows:
    for c in ("ours_fwd_min_ms", "ours_bwd_min_ms", "onednn_fwd_min_ms", "onednn_bwd_min_ms"):
        assert float(r[c]) > 0, (c, r)
PY
done
OMP_NUM_THREADS=2 "$BIN" --model resnet50 --res 64 --repeats 1 >"$TMP/rn.csv" 2>"$TMP/err" || {
  echo "FAIL: gg_bench_pool --model resnet50 exited non-zero: $(cat "$TMP/err")"
  fail=1
}
if [ "$(cut -d, -f1,2 "$TMP/rn.csv" | tail -n +2 | head -1)" != "maxpool,16x64x32x32" ]; then
  echo "FAIL: ResNet-50's one max pool at 64 px: $(cat "$TMP/rn.csv")"
  fail=1
fi
for bad in "--block 4" "--model vgg" "--res x" "--repeats 0" "--frobnicate 1" "--res"; do
  # shellcheck disable=SC2086
  out=$("$BIN" $bad 2>&1 >/dev/null)
  rc=$?
  if [ "$rc" -ne 2 ] || [ "$(printf '%s\n' "$out" | head -1 | grep -c '^gg_bench_pool: ')" -ne 1 ]; then
    echo "FAIL: gg_bench_pool $bad: exit $rc: $out"
    fail=1
  fi
done
[ "$fail" = 0 ] && echo "gg_bench_pool: rows and errors as expected"
exit "$fail"
