#!/usr/bin/env bash
# Issue 31, rows 6, 8, 11, 12 (and issue 52 row 8): the ranks agree on the resolved settings before anything else
# (MPMD launches with other options: one line, exit 2, no hang); --dry-run gives the real run's
# verdict at the launcher's rank count, printed once; options that would do nothing where they
# are given are refused (or warned about, where harmless); lines that name the real problem.
set -uo pipefail
BIN="$1"; ROOT="$2"; MPIEXEC="$3"
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
cd "$TMP"
export OMP_NUM_THREADS=1
fail=0
CFG="$ROOT/configs/laptop.ini"
TB=(train --config "$CFG" --model.width 4 --log.progress false --train.threads 1
    --gossip.consensus_every 0 --gossip.timeout_s 5)
T=("${TB[@]}" --model.name cnn)
# expect NAME RC PATTERN -- COMMAND...: exit RC within 60 s, exactly one "error:" line on stderr
# and stdout together, matching PATTERN; no metrics file written.
expect() {
  local name="$1" want="$2" pattern="$3"; shift 4
  rm -rf runs
  timeout 60 "$@" >"$TMP/out" 2>&1; local rc=$?
  local lines; lines=$(grep -c "error:" "$TMP/out")
  local errors=1; [ "$want" = 0 ] && errors=0 && pattern="."  # a run that passes: no error
  if [ "$rc" -ne "$want" ] || [ "$lines" -ne $errors ] || ! grep -q -- "$pattern" "$TMP/out"; then
    echo "FAIL: $name: exit $rc (want $want), $lines error lines:"; cat "$TMP/out"; fail=1
  elif [ -e runs/latest/metrics.jsonl ]; then
    echo "FAIL: $name: refused but wrote runs/latest/metrics.jsonl"; fail=1
  else
    echo "ok: $name -> $(grep "error:" "$TMP/out")"
  fi
}
M=("$MPIEXEC")

# Row 6: MPMD launches whose parts resolve different settings.
expect "MPMD, another train.batch" 2 "train.batch = 32, rank 1 has train.batch = 64" -- \
  "${M[@]}" -n 1 "$BIN" "${T[@]}" --train.batch 32 : -n 1 "$BIN" "${T[@]}"
expect "MPMD, another model.name" 2 "rank 1 has model.name = resnet8" -- \
  "${M[@]}" -n 1 "$BIN" "${T[@]}" : -n 1 "$BIN" "${TB[@]}" --model.name resnet8
expect "MPMD, allreduce against both" 2 "gossip.mode = allreduce, rank 1 has gossip.mode = both" -- \
  "${M[@]}" -n 1 "$BIN" "${T[@]}" --gossip.mode allreduce : -n 1 "$BIN" "${T[@]}"
expect "MPMD, a bad option on one rank only" 2 "train.batch = -3" -- \
  "${M[@]}" -n 1 "$BIN" "${T[@]}" : -n 1 "$BIN" "${T[@]}" --train.batch -3

# A sibling of row 6: ranks that read their own copy of the data (node-local storage, here each
# rank's working folder) must read the same data set.
python3 - <<'PY' || { echo "FAIL: writing idx files"; exit 1; }
import os, struct
def split(d, name, n):
    os.makedirs(d, exist_ok=True)
    with open(f"{d}/{name}-images-idx3-ubyte", "wb") as f:
        f.write(struct.pack(">IIII", 0x803, n, 28, 28) + bytes((i * 7) % 256 for i in range(n * 784)))
    with open(f"{d}/{name}-labels-idx1-ubyte", "wb") as f:
        f.write(struct.pack(">II", 0x801, n) + bytes(i % 10 for i in range(n)))
for node, n in [("node0", 640), ("node1", 600)]:
    split(f"{node}/data", "train", n)
    split(f"{node}/data", "t10k", 100)
PY
D=("${T[@]}" --data.source idx:data --train.batch 16 --log.metrics "$TMP/m-data.jsonl")
expect "MPMD, another copy of the data on each node" 2 "the ranks read different data: rank 0 has 640 training samples.*rank 1 has 600" -- \
  "${M[@]}" -n 1 -wdir node0 "$BIN" "${D[@]}" : -n 1 -wdir node1 "$BIN" "${D[@]}"

# Row 8: --dry-run gives the real run's verdict, at the launcher's rank count, once.
for run in dry real; do
  extra=(); [ $run = dry ] && extra=(--dry-run)
  expect "$run: hypercube at 3 ranks" 2 "gossip.schedule" -- \
    "${M[@]}" -n 3 "$BIN" "${T[@]}" --gossip.schedule hypercube "${extra[@]}"
  expect "$run: fault.inject of rank 5 at 2 ranks" 2 "rank 5 is out of range" -- \
    "${M[@]}" -n 2 "$BIN" "${T[@]}" --fault.inject 5:3 "${extra[@]}"
  expect "$run: fault.mtbf_steps at 1 rank" 2 "fault.mtbf_steps needs at least 2 ranks" -- \
    "$BIN" "${T[@]}" --fault.mtbf_steps 50 "${extra[@]}"
  expect "$run: staleness 1 with overlapped weights" 2 "set gossip.overlap_model = false" -- \
    "${M[@]}" -n 2 "$BIN" "${T[@]}" --gossip.staleness 1 "${extra[@]}"
  # Row 11: options that would be ignored are refused.
  expect "$run: mode model with the gradient wire" 2 "set gossip.model_wire = bf16" -- \
    "${M[@]}" -n 2 "$BIN" "${T[@]}" --gossip.mode model --gossip.wire bf16 "${extra[@]}"
  expect "$run: mode grad with the weight wire" 2 "set gossip.wire = bf16" -- \
    "${M[@]}" -n 2 "$BIN" "${T[@]}" --gossip.mode grad --gossip.model_wire bf16 "${extra[@]}"
  expect "$run: allreduce with staleness 1" 2 "allreduce always waits" -- \
    "${M[@]}" -n 2 "$BIN" "${T[@]}" --gossip.mode allreduce --gossip.staleness 1 "${extra[@]}"
  expect "$run: emulate.slow of rank 5 at 2 ranks" 2 "emulate.slow = 5:2: rank 5 is out of range" -- \
    "${M[@]}" -n 2 "$BIN" "${T[@]}" --emulate.forward_ms 1 --emulate.slow 5:2 "${extra[@]}"
  expect "$run: fault.kill of rank 5 at 2 ranks" 2 "fault.kill = 5:3: rank 5 is out of range" -- \
    "${M[@]}" -n 2 "$BIN" "${T[@]}" --fault.kill 5:3 "${extra[@]}"
done
expect "val_labels for idx data" 2 "data.val_labels = x.txt labels a flat val/ folder" -- \
  "$BIN" "${T[@]}" --data.val_labels x.txt --dry-run
expect "model.width of a torchvision model" 2 "resnet50 is torchvision's" -- \
  "$BIN" "${TB[@]}" --model.name resnet50 --dry-run
expect "batch 4 without the shuffle runs (data.shuffle_per_step is inert)" 0 "" -- \
  "$BIN" "${T[@]}" --train.batch 4 --dry-run

# simulate: settings its cost model leaves out are refused, not predicted as if absent.
expect "simulate with staleness 1" 2 "simulate does not model gossip.staleness = 1" -- \
  "$BIN" simulate --config "$CFG" --ranks 2,4 --simulate.forward_ms 5 --simulate.backward_ms 10 \
  --gossip.mode grad --gossip.staleness 1
expect "simulate with hierarchy node" 2 "simulate does not model gossip.hierarchy = node" -- \
  "$BIN" simulate --config "$CFG" --ranks 2,4 --simulate.forward_ms 5 --simulate.backward_ms 10 \
  --gossip.mode grad --gossip.hierarchy node
expect "simulate with low-rank gossip" 2 "simulate does not model gossip.low_rank = 2" -- \
  "$BIN" simulate --config "$CFG" --ranks 2,4 --simulate.forward_ms 5 --simulate.backward_ms 10 \
  --gossip.mode model --gossip.low_rank 2 --gossip.schedule hypercube --gossip.rotate false

# Issue 52 siblings: what simulate's cost model leaves out is refused, not predicted as absent.
for opt in "gossip.transport rma" "gossip.threading concurrent" "train.virtual_ranks 4"; do
  read -r key value <<<"$opt"
  expect "simulate with $key" 2 "simulate does not model $key" -- \
    "$BIN" simulate --config "$CFG" --ranks 2,4 --simulate.forward_ms 5 --simulate.backward_ms 10 \
    --"$key" "$value"
done

# A dry run that passes prints the settings once, for the launcher's rank count.
"${M[@]}" -n 2 "$BIN" "${T[@]}" --dry-run >dry.out 2>&1 || { echo "FAIL: dry-run at 2 ranks"; fail=1; }
[ "$(grep -c '^# gossipgrad train, resolved settings' dry.out)" = 1 ] &&
  grep -q "for 2 ranks" dry.out || { echo "FAIL: dry-run printed not once:"; cat dry.out; fail=1; }

# Harmless inert settings: one warning, and the run goes on.
"${M[@]}" -n 2 "$BIN" "${T[@]}" --gossip.mode allreduce --gossip.transport shm --dry-run \
  >warn.out 2>&1 || { echo "FAIL: inert transport refused"; fail=1; }
[ "$(grep -c 'warning: gossip.transport does nothing with gossip.mode = allreduce' warn.out)" = 1 ] ||
  { echo "FAIL: no single warning for an inert transport:"; cat warn.out; fail=1; }

# Row 12: a resumed model of another shape names the setting that differs.
"${M[@]}" -n 2 "$BIN" "${T[@]}" --checkpoint.dir ck --train.max_steps 4 --log.metrics m.jsonl \
  >first.out 2>&1 || { echo "FAIL: first run"; cat first.out; fail=1; }
expect "resume with batch_norm false" 2 "model.batch_norm true there, false here" -- \
  "${M[@]}" -n 2 "$BIN" "${T[@]}" --checkpoint.dir ck --checkpoint.resume auto \
  --train.max_steps 8 --model.batch_norm false --log.metrics m2.jsonl
# Row 8: weights of another model in train.init_from: the dry run's verdict is the real run's.
[ -f ck/model.npz ] || { echo "FAIL: the first run wrote no ck/model.npz"; fail=1; }
for run in dry real; do
  extra=(--log.metrics "$TMP/m-$run.jsonl"); [ $run = dry ] && extra=(--dry-run)
  expect "$run: init_from of another model" 2 "train.init_from: " -- \
    "${M[@]}" -n 2 "$BIN" "${TB[@]}" --model.name resnet8 --train.init_from ck/model.npz \
    "${extra[@]}"
done

# Issue 52 row 8: what the run finds once its data is open and its model built (the batch
# against the samples, low_rank against the model's matrices, stop_at against the last step,
# apoptosis.layers and dropout against the layers): the dry run's verdict is the real run's, at
# 1 rank, 2 ranks and 4 virtual ranks.
S=(--data.source synthetic:1x28x28:10:1000)
LR=(--gossip.mode model --gossip.low_rank 64 --gossip.schedule hypercube --gossip.rotate false)
V=(--train.virtual_ranks 4 --data.shuffle off --train.rank_eval_samples 0)
cases=(
  "1|use at most 29|${T[*]} ${LR[*]} ${S[*]} --train.max_steps 3"
  "2|use at most 29|${T[*]} ${LR[*]} ${S[*]} --train.max_steps 3"
  "2|train.batch = 600 is too large: 1000 samples over 2 ranks give no full batch|${T[*]} ${S[*]} --train.batch 600"
  "1|train.batch = 300 is too large: 1000 samples over 4 virtual ranks give no full batch|${T[*]} ${S[*]} ${V[*]} --train.batch 300"
  "1|use at most 29|${T[*]} ${LR[*]} ${S[*]} ${V[*]} --train.max_steps 3"
  "2|train.stop_at = 5000 is not before the run's last step|${T[*]} ${S[*]} --train.batch 100 --checkpoint.dir ck-stop --train.stop_at 5000"
  "1|apoptosis.layers = fc: resnet8 has no such layer|${TB[*]} --model.name resnet8 ${S[*]} --apoptosis.enable true --apoptosis.layers fc"
  "1|googlenet has dropout|train --config $CFG --log.progress false --train.threads 1 --model.name googlenet --data.source synthetic:3x32x32:10:100 --train.batch 2 ${V[*]}"
)
n=0
for case in "${cases[@]}"; do
  n=$((n + 1))
  IFS='|' read -r ranks pattern opts <<<"$case"
  read -r -a opts <<<"$opts"
  launch=(); [ "$ranks" = 2 ] && launch=("${M[@]}" -n 2)
  for run in dry real; do
    extra=(--log.metrics "$TMP/m-$run-$n.jsonl"); [ $run = dry ] && extra=(--dry-run)
    expect "$run at $ranks: ${opts[*]: -4}" 2 "$pattern" -- "${launch[@]}" "$BIN" "${opts[@]}" \
      "${extra[@]}"
  done
done
# A virtual run's dry run says how many ranks it stands for.
"$BIN" "${T[@]}" "${V[@]}" --dry-run >dry.out 2>&1 && grep -q "for 4 virtual ranks in 1 process" dry.out ||
  { echo "FAIL: a virtual dry run's header:"; head -3 dry.out; fail=1; }

[ $fail = 0 ] && echo "PASS: ranks agree on settings, dry-run verdicts, ignored options refused"
exit $fail
