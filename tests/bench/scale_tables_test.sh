#!/usr/bin/env bash
# bench/scale's tables from hand-made runs: table.py turns run metrics into the CSV (top-1,
# consensus, bytes per step priced as run.sh documents them) and its table pairs each gossip
# seed with allreduce's; length.py pairs the CSVs of two run lengths by seed, gives the factor
# the difference shrank by and projects where it reaches -0.5; bad input is one line and a
# non-zero exit. No gossipgrad run: the metrics files are written here.
set -uo pipefail
ROOT="$1"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fail=0
check() {  # check WHAT FILE PATTERN: the fixed string PATTERN is a line of FILE
  grep -qxF -- "$3" "$2" || {
    echo "FAIL: $1: no line '$3' in:"
    cat "$2"
    fail=1
  }
}
# run DIR NAME STEPS TOP1 CONSENSUS SENT: one finished run's metrics (p = 4, 1000 parameters).
run() {
  mkdir -p "$1"
  cat >"$1/$2.jsonl" <<EOF
{"event":"start","params":1000,"global_batch":32}
{"event":"eval","top1":0.5,"consensus":1.0}
{"event":"eval","top1":$4,"consensus":$5,"rank_top1":{"min":0.7,"median":0.75,"max":0.8,"samples":100}}
{"event":"summary","steps":$3,"wall_s":10,"sent_bytes_per_step":$6}
EOF
}
for n in 100 200; do
  d="$TMP/runs$n"
  run "$d" p4-allreduce-s1 "$n" 0.90 0 6000
  run "$d" p4-allreduce-s2 "$n" 0.80 0 6000
done
run "$TMP/runs100" p4-model-s1 100 0.86 0.01 1200  # -4 and -2 points: -3 on the mean
run "$TMP/runs100" p4-model-s2 100 0.78 0.01 1200
run "$TMP/runs100" p4-model-s3 100 0.70 0.01 1200  # no allreduce with seed 3: not paired
run "$TMP/runs200" p4-model-s1 200 0.885 0.001 1200  # -1.5 and -0.5: -1 on the mean
run "$TMP/runs200" p4-model-s2 200 0.795 0.001 1200
run "$TMP/runs200" p4-model-global10-s1 200 0.88 0.001 1200
echo '{"event":"start","params":1000,"global_batch":32}' >"$TMP/runs200/p4-model-s9.jsonl"
for n in 100 200; do
  python3 "$ROOT/bench/scale/table.py" "$TMP/runs$n" "$TMP/t$n" "test CPU" >"$TMP/out$n" \
    2>"$TMP/err$n" || {
    echo "FAIL: table.py exited non-zero: $(cat "$TMP/err$n")"
    exit 1
  }
done
check "table.py leaves out an unfinished run" "$TMP/err200" \
  "table.py: p4-model-s9.jsonl did not finish: left out"
# Ring allreduce of 1000 fp32 parameters at p = 4: 2 x 3/4 x 4000 = 6000 bytes; global10 adds a
# tenth of it to the 1200 the exchanges sent.
check "table.py's CSV row" "$TMP/t200.csv" \
  "4,model-global10,1,0.88,0.7,0.75,0.8,100,0.001,200,10,1800.0,6000.0,32,0"
check "allreduce is priced as the ring" "$TMP/t100.csv" \
  "4,allreduce,1,0.9,0.7,0.75,0.8,100,0,100,10,6000.0,6000.0,32,0"
check "table.py pairs the seeds" "$TMP/t100.md" \
  "| 4 | 32 | 100 | model (3 seeds) | 78.00 | -3.00 (-4.00, -2.00) | 70.00 / 75.00 / 80.00 | 0.01 | 0.001 | 0.20 | 10 |"

L="$ROOT/bench/scale/length.py"
python3 "$L" model "$TMP/t100.csv" "$TMP/t200.csv" >"$TMP/len" 2>&1 || {
  echo "FAIL: length.py exited non-zero: $(cat "$TMP/len")"
  exit 1
}
check "length.py at 100 steps (seed 3 has no allreduce)" "$TMP/len" \
  "| 4 | 100 | 85.00 | 82.00 | -3.00 (-4.00, -2.00) | 2 |  |"
check "length.py at 200 steps" "$TMP/len" "| 4 | 200 | 85.00 | 84.00 | -1.00 (-1.50, -0.50) | 2 | 3.00x |"
# -3 -> -1 over 2x the steps: |gap| ~ steps^-log2(3); -0.5 at 200 x 2^(1 / log2 3) = 310 steps.
check "length.py's projection" "$TMP/len" \
  "p = 4: from 100 to 200 steps the difference shrank 3.00x per 2x the steps; at that rate it would reach -0.5 at about 310 steps (a projection from two lengths)."

refused() {  # refused WHAT EXPECTED-START ARGS...: non-zero, one line starting so
  local out
  if out=$(python3 "$L" "${@:3}" 2>&1); then
    echo "FAIL: length.py $1: exit 0"
    fail=1
  elif [ "$(printf '%s\n' "$out" | wc -l)" != 1 ] || [[ "$out" != "$2"* ]]; then
    echo "FAIL: length.py $1: '$out'"
    fail=1
  fi
}
refused "a CSV twice" "length.py: p = 4, 100 steps, allreduce, seed 1 is in two of the CSVs" \
  model "$TMP/t100.csv" "$TMP/t100.csv"
refused "an unknown mode" "length.py: no run of mode grad in the CSVs (they hold: allreduce, model)" \
  grad "$TMP/t100.csv"
refused "allreduce as the mode" "length.py: MODE is the gossip mode" allreduce "$TMP/t100.csv"
refused "a missing file" "length.py: cannot read $TMP/none" model "$TMP/none"
refused "a file of another kind" "length.py: $TMP/t100.md is not a CSV" model "$TMP/t100.md"
refused "no CSV" "usage: length.py MODE CSV..." model
exit $fail
