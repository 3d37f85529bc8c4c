#!/usr/bin/env bash
# gg_bench_peak --model: one row per distinct layer shape with its count, no backward-data for
# the layer that reads the input, the SGD update, and a floor equal to the rows' sum; a model it
# does not know is one clear line and exit 2. With --algorithms: one row per 3x3 stride-1 shape,
# direct and Winograd summed pass by pass, and the executor's choice by winograd_pays (resnet8's
# 16- and 32-channel layers direct, its 64-channel 7x7 layer oneDNN's auto); without --model or
# in bf16 it is refused, the reason on the first line (the usage after it). Timings are not
# checked (bench/ measures them).
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
if OMP_NUM_THREADS=2 "$BIN" --model resnet8 --res 28 --batch 4 --seconds 0.01 --algorithms \
  >"$TMP/alg.csv" 2>"$TMP/err"; then
  python3 - "$TMP/alg.csv" <<'PY' || fail=1
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
takes = {r["layer"]: r["executor_takes"] for r in rows}
assert takes == {"conv c3 k16 28x28 r3 s1 p1": "direct", "conv c16 k16 28x28 r3 s1 p1": "direct",
                 "conv c32 k32 14x14 r3 s1 p1": "direct", "conv c64 k64 7x7 r3 s1 p1": "auto"}, takes
for r in rows:
    for alg in ("direct", "winograd"):
        per = sum(float(r[f"{alg}_{p}_ms"]) for p in ("forward", "backward_data", "backward_weights"))
        assert abs(per - float(r[f"{alg}_ms"])) < 0.01, r
stem = rows[[r["layer"] for r in rows].index("conv c3 k16 28x28 r3 s1 p1")]
assert float(stem["direct_backward_data_ms"]) == 0, stem
PY
else
  echo "FAIL: gg_bench_peak --model resnet8 --algorithms exited non-zero: $(cat "$TMP/err")"
  fail=1
fi
for bad in "--algorithms" "--model resnet8 --precision bf16 --algorithms"; do
  # shellcheck disable=SC2086
  "$BIN" $bad >"$TMP/out" 2>"$TMP/err"
  rc=$?
  if [ $rc -ne 2 ] ||
    ! head -1 "$TMP/err" | grep -q "^gg_bench_peak: --algorithms needs --model and fp32"; then
    echo "FAIL: $bad: rc $rc, stderr: $(cat "$TMP/err")"
    fail=1
  fi
done
[ $fail -eq 0 ] && echo "ok"
exit $fail
