#!/usr/bin/env bash
# export / infer / init_from / checkpoint errors: usage errors (missing files, shapes that do
# not fit, existing outputs, and infer's or init_from's inputs that are malformed: a corrupt
# zip, a truncated or Fortran-ordered npy, weights holding NaN) exit 2, a malformed checkpoint
# exits 1, each with exactly one line naming the culprit (the option, the file, the problem); an
# existing output is never touched.
set -uo pipefail
BIN="$1"; ROOT="$2"
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
cd "$TMP"
fail=0
expect() {  # expect NAME CODE PATTERN -- ARGS...
  local name="$1" code="$2" pattern="$3"; shift 4
  OMP_NUM_THREADS=1 "$BIN" "$@" >"$TMP/out" 2>"$TMP/err"; local rc=$?
  local lines; lines=$(wc -l <"$TMP/err")
  if [ "$rc" -ne "$code" ] || [ "$lines" -ne 1 ] || ! grep -q -- "$pattern" "$TMP/err"; then
    echo "FAIL: $name: exit $rc (want $code), $lines stderr lines:"; cat "$TMP/err"; fail=1
  else
    echo "ok: $name -> $(cat "$TMP/err")"
  fi
}
CFG="$ROOT/configs/laptop.ini"
# A real checkpoint to work with: one process, two steps of a narrow resnet8.
OMP_NUM_THREADS=1 "$BIN" train --config "$CFG" --train.max_steps 2 --model.width 2 \
  --train.threads 1 --gossip.mode allreduce --log.progress false --log.metrics m.jsonl \
  --train.eval_batch 2000 --checkpoint.dir ck >train.log 2>&1 || { cat train.log; exit 1; }
"$BIN" export --checkpoint ck --output w.npz >/dev/null || { echo "FAIL: export"; exit 1; }
/usr/bin/python3 - <<'PY' || { echo "FAIL: cannot write the inputs with numpy"; exit 1; }
import numpy as np
np.save("x.npy", np.zeros((3, 1, 28, 28), np.float32))
np.save("x3d.npy", np.zeros((3, 28, 28), np.float32))
np.save("xint.npy", np.zeros((3, 1, 28, 28), np.int64))
np.save("x3ch.npy", np.zeros((3, 3, 28, 28), np.float32))
np.save("xtiny.npy", np.zeros((3, 1, 4, 4), np.float32))
np.save("xfortran.npy", np.asfortranarray(np.zeros((3, 1, 28, 28), np.float32)))
np.save("x32.npy", np.zeros((3, 1, 32, 32), np.float32))
w = dict(np.load("w.npz"))
w["fc.bias"] = np.full_like(w["fc.bias"], np.nan)
np.savez("nan.npz", **w)
PY
head -c 300 x.npy >truncated.npy
echo "not a zip archive" >notzip.npz
head -c 2000 w.npz >truncated.npz
/usr/bin/python3 - <<'PY' || { echo "FAIL: cannot corrupt w.npz"; exit 1; }
import zipfile
data = bytearray(open("w.npz", "rb").read())
m = zipfile.ZipFile("w.npz").getinfo("fc.weight.npy")
data[m.header_offset + 30 + len(m.filename) + len(m.extra) + 128 + 5] ^= 0x10  # a weight's bits
open("flipped.npz", "wb").write(data)
PY
echo keep >taken.npy
echo keep >taken.npz

I=(infer --model resnet8 --weights w.npz)
expect "infer: missing weights file" 2 "no-such.npz does not exist" -- infer --model resnet8 --weights no-such.npz --input x.npy --output y.npy
expect "infer: missing input file" 2 "no-such.npy does not exist" -- "${I[@]}" --input no-such.npy --output y.npy
expect "infer: missing option" 2 "output" -- "${I[@]}" --input x.npy
expect "infer: unknown option" 2 "bogus" -- "${I[@]}" --input x.npy --output y.npy --bogus 1
expect "infer: unknown model" 2 "unknown model 'vgg99'" -- infer --model vgg99 --weights w.npz --input x.npy --output y.npy
expect "infer: unknown backend" 2 "backend" -- "${I[@]}" --input x.npy --output y.npy --backend gpu9
expect "infer: batch out of range" 2 "batch 0" -- "${I[@]}" --input x.npy --output y.npy --batch 0
expect "infer: input not NCHW" 2 "x3d.npy holds float32 \[3,28,28\]" -- "${I[@]}" --input x3d.npy --output y.npy
expect "infer: integer input" 2 "xint.npy holds int64" -- "${I[@]}" --input xint.npy --output y.npy
expect "infer: input channels do not fit the weights" 2 "error: --input x3ch.npy holds images of shape \[3,28,28\], which the weights w.npz do not take: 'conv1.weight' has shape \[2,1,3,3\], these images need \[2,3,3,3\]" -- "${I[@]}" --input x3ch.npy --output y.npy
expect "infer: input too small for the model" 2 "error: --input xtiny.npy: .*H,W >= 8" -- "${I[@]}" --input xtiny.npy --output y.npy
expect "infer: weights of another width" 2 "error: --width 8: the weights w.npz are of width 2 ('conv1.weight' has shape \[2,1,3,3\], width 8 has \[8,1,3,3\])" -- "${I[@]}" --input x.npy --output y.npy --width 8
expect "infer: weights of another model" 2 "w.npz: 'conv2.weight' is missing" -- infer --model cnn --weights w.npz --input x.npy --output y.npy
expect "infer: wrong class count" 2 "--classes 7: the weights w.npz hold 10 classes" -- "${I[@]}" --input x.npy --output y.npy --classes 7
expect "infer: corrupt zip" 2 "error: --weights notzip.npz: not a zip archive" -- infer --model resnet8 --weights notzip.npz --input x.npy --output y.npy
expect "infer: truncated zip" 2 "error: --weights truncated.npz: not a zip archive" -- infer --model resnet8 --weights truncated.npz --input x.npy --output y.npy
expect "infer: corrupt member" 2 "error: --weights flipped.npz: member 'fc.weight.npy': CRC-32 mismatch" -- infer --model resnet8 --weights flipped.npz --input x.npy --output y.npy
expect "infer: truncated npy" 2 "error: --input truncated.npy: shape \[3,1,28,28\] of float32 needs 9408 data bytes" -- "${I[@]}" --input truncated.npy --output y.npy
# Issue 52 row 6: the real culprit named, exit 2.
expect "infer: Fortran-order input" 2 "error: --input xfortran.npy: .npy header: fortran_order True is not supported" -- "${I[@]}" --input xfortran.npy --output y.npy
expect "infer: weights holding NaN" 2 "error: --weights nan.npz: 'fc.bias' holds NaN or inf" -- infer --model resnet8 --weights nan.npz --input x.npy --output y.npy
expect "infer: batch_norm the weights lack" 2 "error: --batch_norm false: the weights w.npz hold batch-norm running statistics" -- "${I[@]}" --input x.npy --output y.npy --batch_norm false
expect "infer: width of a torchvision model" 2 "error: --width applies to resnet8 and cnn only, not resnet18" -- infer --model resnet18 --weights w.npz --input x.npy --output y.npy --width 8
OMP_NUM_THREADS=1 "$BIN" train --config "$CFG" --train.max_steps 1 --model.name cnn --model.width 4 \
  --train.threads 1 --gossip.mode allreduce --log.progress false --log.metrics m3.jsonl \
  --train.eval_batch 2000 --checkpoint.dir ckcnn >train.log 2>&1 || { cat train.log; exit 1; }
"$BIN" export --checkpoint ckcnn --output wcnn.npz >/dev/null || { echo "FAIL: export cnn"; exit 1; }
C=(infer --model cnn --weights wcnn.npz --output y.npy)
expect "infer: cnn weights of width 4 given --width 8" 2 "error: --width 8: the weights wcnn.npz are of width 4 ('conv1.weight' has shape \[4,1,3,3\], width 8 has \[8,1,3,3\])" -- "${C[@]}" --input x.npy --width 8
expect "infer: cnn weights given 3-channel images" 2 "error: --input x3ch.npy holds images of shape \[3,28,28\], which the weights wcnn.npz do not take: 'conv1.weight'" -- "${C[@]}" --input x3ch.npy
expect "infer: cnn weights given 32x32 images" 2 "error: --input x32.npy holds images of shape \[1,32,32\], which the weights wcnn.npz do not take" -- "${C[@]}" --input x32.npy
expect "infer: existing output" 2 "taken.npy already exists" -- "${I[@]}" --input x.npy --output taken.npy
expect "infer: output folder missing" 2 "no/such does not exist" -- "${I[@]}" --input x.npy --output no/such/y.npy
grep -qx keep taken.npy || { echo "FAIL: taken.npy was touched"; fail=1; }
[ ! -e y.npy ] || { echo "FAIL: a failed infer left y.npy"; fail=1; }

expect "export: missing checkpoint option" 2 "checkpoint" -- export --output e.npz
expect "export: missing checkpoint folder" 2 "no-such-dir does not exist" -- export --checkpoint no-such-dir --output e.npz
mkdir empty
expect "export: folder without checkpoint" 2 "empty holds no checkpoint" -- export --checkpoint empty --output e.npz
expect "export: existing output" 2 "taken.npz already exists" -- export --checkpoint ck --output taken.npz
grep -qx keep taken.npz || { echo "FAIL: taken.npz was touched"; fail=1; }
mkdir broken && cp ck/meta.json broken/ && cp notzip.npz broken/model.npz
expect "export: corrupt model.npz" 1 "broken/model.npz: not a zip archive" -- export --checkpoint broken --output e.npz
mkdir badmeta && echo '{"format": "gossipgrad-checkpoint"' >badmeta/meta.json && cp w.npz badmeta/model.npz
expect "export: malformed meta.json" 1 "badmeta/meta.json" -- export --checkpoint badmeta --output e.npz
[ ! -e e.npz ] || { echo "FAIL: a failed export left e.npz"; fail=1; }

T=(train --config "$CFG" --train.threads 1 --gossip.mode allreduce --log.metrics m2.jsonl)
expect "train: init_from missing" 2 "train.init_from = no-such.npz is not a file" -- "${T[@]}" --train.init_from no-such.npz
expect "train: init_from of another width" 2 "train.init_from: w.npz: 'conv1.weight' has shape \[2,1,3,3\], the model expects \[4,1,3,3\]" -- "${T[@]}" --model.width 4 --train.init_from w.npz
expect "train: existing checkpoint" 2 "checkpoint.dir = ck already holds a checkpoint" -- "${T[@]}" --checkpoint.dir ck
expect "train: every_epochs without a folder" 2 "needs checkpoint.dir" -- "${T[@]}" --checkpoint.every_epochs 1
[ ! -e m2.jsonl ] || { echo "FAIL: a usage error left m2.jsonl"; fail=1; }

"$BIN" export --help >help.txt && grep -q -- "--checkpoint" help.txt || { echo "FAIL: export --help"; fail=1; }
"$BIN" infer --help >help.txt && grep -q -- "--weights" help.txt || { echo "FAIL: infer --help"; fail=1; }
"$BIN" --help >help.txt && grep -q "gossipgrad infer" help.txt || { echo "FAIL: --help lists infer"; fail=1; }
exit $fail
