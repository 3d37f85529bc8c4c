#!/usr/bin/env bash
# NaN end to end (issue 15, defect 9, "NaN hidden by ReLU"). A NaN input pixel makes its
# sample's logits NaN and no other's, as PyTorch does, on both CPU backends (ReLU used to map NaN
# to 0). Weights that hold a NaN (one weight, a running variance, all) are refused by `infer` in
# one line naming --weights and the tensor, exit 2, as train.init_from refuses them (issue 52 row
# 6: it answered all-NaN logits with exit 0). `export` refuses weights that hold NaN. A run whose weights
# go non-finite stops with one line naming the step (guard.nan_retries 0) and writes no checkpoint
# of them; so does a NaN loss (fault.nan). train.init_from weights holding NaN are refused before
# training.
set -euo pipefail
BIN="$1"; ROOT="$2"; MPIEXEC="$3"
if ! /usr/bin/python3 -c 'import numpy' 2>/dev/null; then
  echo "skipped: /usr/bin/python3 with numpy is not available"; exit 77
fi
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
cd "$TMP"
export OMP_NUM_THREADS=1
fail() { echo "FAIL: $*"; exit 1; }
# one_line FILE TEXT: FILE holds exactly one line, and it contains TEXT.
one_line() {
  [ "$(wc -l < "$1")" = 1 ] && grep -qF -- "$2" "$1" || fail "want one line with '$2': $(cat "$1")"
}
COMMON=(--config "$ROOT/configs/laptop.ini" --model.width 8 --train.batch 32 --train.threads 1
        --log.progress false --gossip.consensus_every 0 --train.eval_batch 1000)
SYNTH=(--data.source synthetic:1x28x28:10:2000 --data.prefetch 2)

# Weights to start from: a few steps on Fashion-MNIST, whose end writes the average model.
"$BIN" train "${COMMON[@]}" --train.max_steps 5 --log.metrics a.jsonl --checkpoint.dir A > a.log
"$BIN" export --checkpoint A --output w.npz > /dev/null

/usr/bin/python3 - <<'PY'
import numpy as np
w = dict(np.load("w.npz"))
def save(name, key, at):
    d = {k: v.copy() for k, v in w.items()}
    d[key].flat[at] = np.nan
    np.savez(name, **d)
save("w_one.npz", "conv1.weight", 4)  # a centre tap: every output of channel 0
save("w_var.npz", "layer1.0.bn1.running_var", 0)
np.savez("w_all.npz", **{k: np.full_like(v, np.nan) if v.dtype == np.float32 else v
                         for k, v in w.items()})
x = np.random.default_rng(0).standard_normal((6, 1, 28, 28)).astype(np.float32)
np.save("x.npy", x)
x[2, 0, 13, 17] = np.nan
np.save("x_nan.npy", x)
PY

# nan_rows Y.npy: the samples whose logits are all NaN, e.g. "0 1 2"; fails on a row that is
# partly NaN or holds an inf.
nan_rows() {
  /usr/bin/python3 - "$1" <<'PY'
import sys
import numpy as np
y = np.load(sys.argv[1])
nan = np.isnan(y)
assert y.shape == (6, 10), y.shape
assert ((nan.all(1)) | (~nan.any(1))).all(), f"rows partly NaN: {y}"
assert np.isfinite(y[~nan]).all(), y
print(" ".join(str(i) for i in np.flatnonzero(nan.all(1))))
PY
}
for backend in onednn reference; do
  for case in "w.npz x.npy:" "w.npz x_nan.npy:2"; do
    read -r weights input <<< "${case%%:*}"
    want="${case#*:}"
    "$BIN" infer --model resnet8 --weights "$weights" --input "$input" --output y.npy \
      --backend "$backend" --batch 4 --overwrite > /dev/null
    got=$(nan_rows y.npy)
    [ "$got" = "$want" ] || fail "$backend infer $weights on $input: NaN rows '$got', want '$want'"
  done
  for case in "w_one conv1.weight" "w_var layer1.0.bn1.running_var" "w_all conv1.weight"; do
    read -r weights tensor <<< "$case"
    rc=0
    "$BIN" infer --model resnet8 --weights "$weights.npz" --input x.npy --output y.npy \
      --backend "$backend" --batch 4 --overwrite > /dev/null 2> err.txt || rc=$?
    [ "$rc" = 2 ] || fail "$backend infer $weights.npz: exit $rc, want 2"
    one_line err.txt "error: --weights $weights.npz: '$tensor' holds NaN or inf"
  done
done
echo "infer answers NaN where PyTorch does, refuses NaN weights (onednn, reference): ok"

# export refuses weights that hold NaN, in one line, and writes nothing.
cp -r A B && cp w_one.npz B/model.npz
set +e
"$BIN" export --checkpoint B --output nan.npz > e.log 2> e.err
rc=$?
set -e
[ $rc = 1 ] || fail "export of NaN weights exited $rc"
one_line e.err "nan.npz: not written: conv1.weight holds NaN or inf"
[ ! -e nan.npz ] || fail "export wrote nan.npz"
echo "export refuses NaN weights: ok"

# train_fails NAME WANT ARGS...: a one-rank run that must exit 1 with the one line WANT on stderr
# and leave no checkpoint in NAME/.
train_fails() {
  local name=$1 want=$2; shift 2
  set +e
  "$BIN" train "${COMMON[@]}" --log.metrics "$name.jsonl" --checkpoint.dir "$name" "$@" \
    > "$name.log" 2> "$name.err"
  local rc=$?
  set -e
  [ $rc = 1 ] || fail "$name: exited $rc: $(cat "$name.err")"
  one_line "$name.err" "$want"
  [ -z "$(ls "$name" 2> /dev/null | grep -v run.lock)" ] || fail "$name: a checkpoint was written: $(ls "$name")"
}
# Weights that hold NaN from the start are refused before training, one line naming the tensor,
# exit 2 (issue 31: it used to train and stop at step 0 with "lower train.lr").
set +e
"$BIN" train "${COMMON[@]}" "${SYNTH[@]}" --train.init_from w_var.npz --train.max_steps 30 \
  --log.metrics v.jsonl --checkpoint.dir V > v.log 2> v.err
rc=$?
set -e
[ $rc = 2 ] || fail "init_from holding NaN: exited $rc: $(cat v.err)"
one_line v.err "train.init_from = w_var.npz: 'layer1.0.bn1.running_var' holds NaN or inf"
[ ! -e V ] && [ ! -e v.jsonl ] || fail "init_from holding NaN: files left behind"
# Weights that go bad while the loss stays finite (fault.nan_stats: rank 0's running statistics
# NaN before step 3): the guard looks at the weights before its first snapshot (step 10) and
# stops; between guard checks the full checkpoint at the end refuses them.
train_fails V0 "error: the weights became non-finite at step 9; lower train.lr" "${SYNTH[@]}" \
  --fault.nan_stats 3 --guard.nan_retries 0 --guard.snapshot_every 10 --train.max_steps 30 \
  --checkpoint.every 20
train_fails VC "checkpoint: not written after step 7: rank 0's weights hold NaN or inf" \
  "${SYNTH[@]}" --fault.nan_stats 3 --guard.nan_retries 0 --train.max_steps 7
# A NaN loss (fault.nan: rank 0's weights all NaN before step 12), one rank and two.
train_fails L1 "error: the loss became non-finite at step 12; lower train.lr" "${SYNTH[@]}" \
  --guard.nan_retries 0 --fault.nan 12 --train.max_steps 30 --checkpoint.every 20
set +e
"$MPIEXEC" -n 2 "$BIN" train "${COMMON[@]}" "${SYNTH[@]}" --log.metrics l2.jsonl \
  --checkpoint.dir L2 --guard.nan_retries 0 --fault.nan 12 --train.max_steps 30 \
  --checkpoint.every 20 > l2.log 2> l2.err
rc=$?
set -e
[ $rc = 1 ] || fail "two ranks, NaN loss: exited $rc"
# Every rank stops with the same line (MPI may add its own abort lines).
[ "$(grep -c 'error: the loss became non-finite at step 12; lower train.lr' l2.err)" = 2 ] ||
  fail "two ranks, NaN loss: $(cat l2.err)"
[ -z "$(ls L2 2> /dev/null | grep -v run.lock)" ] || fail "L2: a checkpoint was written: $(ls L2)"
echo "the guard stops a run whose weights or loss go non-finite, with one line: ok"
