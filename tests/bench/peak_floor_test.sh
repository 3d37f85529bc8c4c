#!/usr/bin/env bash
# gg_bench_peak --model: one row per distinct layer shape with its count, no backward-data for
# the layer that reads the input, the SGD update, and a floor equal to the rows' sum; a model it
# does not know is one clear line and exit 2. Timings are not checked (bench/ measures them).
set -uo pipefail
BIN="$1"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fail=0
if ! OMP_NUM_THREADS=2 "$BIN" --model resnet8 --res 28 --batch 4 --seconds 0.01 >"$TMP/out.csv" \
  2>"$TMP/err"; then
  echo "FAIL: gg_bench_peak --model resnet8 exited non-zero: $(cat "$TMP/err")"
  exit 1
fi
python3 - "$TMP/out.csv" <<'PY' || fail=1
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
assert rows and rows[-1]["layer"] == "floor", rows[-1:]
layers, floor = rows[:-1], float(rows[-1]["ms_per_step"])
# resnet8 on 3x28x28, 1000 classes: the stem, 3x3 convs in three stages, two 1x1 projections, one FC.
convs = [r for r in layers if r["layer"].startswith("conv")]
assert sum(int(r["count"]) for r in convs) == 9, convs
stem = [r for r in convs if r["layer"].startswith("conv c3 ")]
assert len(stem) == 1 and float(stem[0]["backward_data_ms"]) == 0, stem
assert all(float(r["backward_data_ms"]) > 0 for r in convs if r not in stem)
assert [r["layer"] for r in layers if r["layer"].startswith("fc")] == ["fc 1000"]
assert layers[-1]["layer"].startswith("sgd update "), layers[-1]
for r in layers:
    per = float(r["forward_ms"]) + float(r["backward_data_ms"]) + float(r["backward_weights_ms"])
    assert abs(int(r["count"]) * per - float(r["ms_per_step"])) < 0.01, r
total = sum(float(r["ms_per_step"]) for r in layers)
assert floor > 0 and abs(total - floor) < 0.01 * len(layers), (total, floor)
PY
"$BIN" --model nosuch >"$TMP/out" 2>"$TMP/err"
rc=$?
if [ $rc -ne 2 ] || [ "$(wc -l <"$TMP/err")" -ne 1 ] || ! grep -q "unknown model 'nosuch'" "$TMP/err"; then
  echo "FAIL: --model nosuch: rc $rc, stderr: $(cat "$TMP/err")"
  fail=1
fi
[ $fail -eq 0 ] && echo "ok"
exit $fail
