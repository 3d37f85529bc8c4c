#!/usr/bin/env bash
# What a command writes and what it reports (issue 31, rows 2, 7, 9, 10, 12, 14): an output that
# is an input (the same file through a symlink or hard link, or a path inside an input folder) is
# refused with one line, exit 2, the input untouched; counts never wrap; an empty class folder is
# refused; a run that never evaluated says so; init_from and output paths are checked before
# training, printed once under mpirun; the default metrics path gives every run a fresh folder.
set -uo pipefail
BIN="$1"; ROOT="$2"; MPIEXEC="$3"; MAKE_IMAGES="$4"
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
cd "$TMP"
export OMP_NUM_THREADS=1
fail=0
FAIL() { echo "FAIL: $*"; fail=1; }
expect() {  # expect NAME PATTERN -- ARGS...: exit 2 and one stderr line matching PATTERN
  local name="$1" pattern="$2"; shift 3
  timeout 120 "$@" >out.txt 2>err.txt; local rc=$?
  local lines; lines=$(wc -l <err.txt)
  if [ "$rc" -ne 2 ] || [ "$lines" -ne 1 ] || ! grep -q -- "$pattern" err.txt; then
    FAIL "$name: exit $rc, $lines stderr lines:"; cat err.txt
  else
    echo "ok: $name -> $(cat err.txt)"
  fi
}
CFG="$ROOT/configs/laptop.ini"
T=(train --config "$CFG" --model.name cnn --model.width 4 --log.progress false --train.threads 1)
G=("$BIN")
M2=("$MPIEXEC" -n 2 "$BIN")

# Fixtures: a checkpoint of 2 steps, its export, images.
"$BIN" "${T[@]}" --train.max_steps 2 --gossip.mode allreduce --log.metrics m0.jsonl \
  --checkpoint.dir ck >t0.log 2>&1 || { cat t0.log; exit 1; }
"$BIN" export --checkpoint ck --output w.npz >/dev/null || { echo "FAIL: export"; exit 1; }
/usr/bin/python3 - <<'PY' || { echo "FAIL: numpy"; exit 1; }
import numpy as np
np.save("x.npy", np.zeros((3, 1, 28, 28), np.float32))
w = dict(np.load("w.npz"))
np.savez("int32.npz", **{k: v.astype(np.int32) for k, v in w.items()})
np.savez("fortran.npz", **{k: np.asfortranarray(v) if v.ndim > 1 else v for k, v in w.items()})
w["fc1.weight"][0, 0] = np.nan
np.savez("nan.npz", **w)
open("garbage.npz", "wb").write(b"PK\x03\x04 not an archive" * 8)
PY
cp x.npy x.keep; cp w.npz w.keep; cp ck/meta.json meta.keep; cp ck/model.npz model.keep
ln -s x.npy x-link.npy; ln x.npy x-hard.npy; ln -s ck ck-link

# Row 2: an output that is an input.
INFER=(infer --model cnn --weights w.npz --input x.npy)
expect "infer: --output is --input" "is the same file as --input x.npy" -- \
  "${G[@]}" "${INFER[@]}" --output x.npy --overwrite
expect "infer: --output is a symlink to --input" "is the same file as --input" -- \
  "${G[@]}" "${INFER[@]}" --output x-link.npy --overwrite
expect "infer: --output is a hard link to --input" "is the same file as --input" -- \
  "${G[@]}" "${INFER[@]}" --output x-hard.npy --overwrite
expect "infer: --output is --weights" "is the same file as --weights" -- \
  "${G[@]}" "${INFER[@]}" --output w.npz --overwrite
expect "export: --output inside the checkpoint" "lies inside --checkpoint ck" -- \
  "${G[@]}" export --checkpoint ck --output ck/meta.json --overwrite
expect "export: --output inside it through a symlink" "lies inside --checkpoint" -- \
  "${G[@]}" export --checkpoint ck-link --output ck/model.npz --overwrite
expect "export: --output in a full checkpoint of it" "lies inside --checkpoint" -- \
  "${G[@]}" export --checkpoint ck --output ck/ckpt-000000000002/w.npz
for f in x.npy:x.keep w.npz:w.keep ck/meta.json:meta.keep ck/model.npz:model.keep; do
  cmp -s "${f%%:*}" "${f##*:}" || FAIL "${f%%:*} was changed"
done
"$BIN" "${INFER[@]}" --output y.npy >/dev/null && "$BIN" export --checkpoint ck --output w2.npz \
  >/dev/null || FAIL "infer or export to a path apart from the inputs"

# Row 9: pack into its input; empty class folders at training.
"$MAKE_IMAGES" img 3 8 1 || { echo "FAIL: make_images"; exit 1; }
expect "pack: --output inside --input" "lies inside --input img/train" -- \
  "${G[@]}" pack --input img/train --output img/train/shards
expect "pack: --output is --input" "is the same folder as --input" -- \
  "${G[@]}" pack --input img --output img
expect "pack: --output under a file" "is a file, not a folder" -- \
  "${G[@]}" pack --input img --output x.npy/shards
mkdir pk && ln -s ../img/train pk/train
expect "pack: --output/train is a link into --input" "pk/train lies inside --input img" -- \
  "${G[@]}" pack --input img --output pk
[ ! -e img/train/shards ] && [ -z "$(ls img/train | grep -v '^n0')" ] || FAIL "pack wrote into its input"
# Row 9, training: an empty class folder.
mkdir img/train/n_empty
IMG=(--data.source imagenet:img --data.crop 16 --data.resize 18 --train.batch 8 --train.max_steps 1)
expect "an empty class folder, printed once" "class folder img/train/n_empty holds no" -- \
  "${M2[@]}" "${T[@]}" "${IMG[@]}" --log.metrics m9.jsonl --checkpoint.dir ck9
rmdir img/train/n_empty
[ ! -e m9.jsonl ] && [ ! -e ck9 ] || FAIL "a refused run left m9.jsonl or ck9/ (run.lock) behind"

# Row 7: counts that do not fit 64 bits are refused; where they fit they are exact.
expect "info: resnet50 at 10^7 x 10^7" "exceeds 2^63" -- \
  "${G[@]}" info --model resnet50 --input 3,10000000,10000000
expect "info --json: resnet50 at 10^7 x 10^7" "exceeds 2^63" -- \
  "${G[@]}" info --model resnet50 --input 3,10000000,10000000 --json
expect "info: an input of more than 2^63 elements" "choose a smaller --input" -- \
  "${G[@]}" info --model cnn --input 3,8,400000000000000000
expect "info: 9e18 classes" "more than 2^63 elements" -- \
  "${G[@]}" info --model resnet8 --classes 9000000000000000000
expect "infer: --classes against the weights" "hold 10 classes" -- \
  "${G[@]}" "${INFER[@]}" --output y2.npy --classes 1000000000
expect "pack: a negative --shuffle seed" "non-negative" -- \
  "${G[@]}" pack --input img --output s2 --shuffle -1
"$BIN" info --model resnet50 --input 3,1000000,1000000 --json >big.json &&
  /usr/bin/python3 -c "
import json; d = json.load(open('big.json'))
assert d['forward_flops'] > 0 and all(l['flops'] >= 0 for l in d['layers']), d['forward_flops']
assert d['forward_flops'] == sum(l['flops'] for l in d['layers'])" || FAIL "info at 10^6 x 10^6"

# Row 10: a run that never evaluated says so, and its summary holds null.
"$BIN" "${T[@]}" --train.stop_at 3 --checkpoint.dir ck10 --log.metrics m10.jsonl >t10.log 2>&1 ||
  { cat t10.log; FAIL "stop_at run"; }
"$BIN" "${T[@]}" --data.source synthetic:1x28x28:10:256 --train.max_steps 3 \
  --log.metrics m10b.jsonl >t10b.log 2>&1 || { cat t10b.log; FAIL "synthetic run"; }
for f in m10 m10b; do
  /usr/bin/python3 -c "
import json
s = [json.loads(l) for l in open('$f.jsonl') if '\"summary\"' in l][-1]
assert s['top1'] is None and s['top5'] is None and s['eval_step'] is None, s" ||
    FAIL "$f: the summary of a run that never evaluated holds an accuracy"
done
grep -q "not evaluated" t10.log && grep -q "not evaluated" t10b.log &&
  ! grep -q "top-1 0.00%" t10.log t10b.log || FAIL "no not-evaluated line"

# Row 12: init_from and output paths checked before training, one line under mpirun.
for f in garbage int32 fortran; do
  expect "init_from: $f" "train.init_from: $f.npz" -- "${M2[@]}" "${T[@]}" --train.max_steps 1 \
    --train.init_from $f.npz --log.metrics m12.jsonl
done
expect "init_from holding NaN" "'fc1.weight' holds NaN" -- "${M2[@]}" "${T[@]}" \
  --train.max_steps 1 --train.init_from nan.npz --log.metrics m12.jsonl
expect "metrics under /proc" "log.metrics = /proc/m.jsonl" -- "${M2[@]}" "${T[@]}" \
  --train.max_steps 1 --log.metrics /proc/m.jsonl
expect "metrics under a file" "is not a folder" -- "${M2[@]}" "${T[@]}" --train.max_steps 1 \
  --log.metrics x.npy/m.jsonl
expect "samples under a file" "log.samples = x.npy/s" -- "${M2[@]}" "${T[@]}" --train.max_steps 1 \
  --log.samples x.npy/s --log.metrics m12.jsonl --checkpoint.dir ck12
[ ! -e ck12 ] && [ ! -e m12.jsonl ] || FAIL "a refused run left ck12/ or m12.jsonl behind"
cp "$CFG" x.ini
expect "metrics is the config file" "is the same file as --config" -- "${G[@]}" train --config \
  x.ini --log.metrics x.ini --log.overwrite true
cmp -s x.ini "$CFG" || FAIL "the config file was changed"
expect "metrics is the timeline" "is the same file as log.timeline" -- "${G[@]}" "${T[@]}" \
  --log.metrics tl.json --log.timeline tl.json
expect "timeline is init_from" "is the same file as train.init_from" -- "${G[@]}" "${T[@]}" \
  --train.init_from w.npz --log.timeline w.npz --log.overwrite true
expect "checkpoint.dir in the data folder" "lies inside data.source" -- "${G[@]}" "${T[@]}" \
  "${IMG[@]}" --checkpoint.dir img/ck --log.metrics m12.jsonl
expect "init_from inside checkpoint.dir" "lies inside checkpoint.dir" -- "${G[@]}" "${T[@]}" \
  --train.init_from ck/model.npz --checkpoint.dir ck --log.overwrite true
mkdir afolder
expect "metrics is a folder" "log.metrics = afolder is a folder" -- "${G[@]}" "${T[@]}" \
  --log.metrics afolder --log.overwrite true
expect "timeline is a folder" "log.timeline = afolder is a folder" -- "${G[@]}" "${T[@]}" \
  --log.metrics m12.jsonl --log.timeline afolder --log.overwrite true
cmp -s w.npz w.keep && cmp -s ck/model.npz model.keep || FAIL "an input was changed"
"${M2[@]}" "${T[@]}" --train.max_steps 2 --log.samples new/s --log.timeline new2/t.json \
  --log.metrics m12b.jsonl >t12.log 2>&1 || { cat t12.log; FAIL "samples/timeline in new folders"; }
[ -s new/s.0 ] && [ -s new/s.1 ] && [ -s new2/t.json ] || FAIL "no samples or timeline files"

# Row 14: the default metrics path: a fresh run folder per run, runs/latest links to the newest.
mkdir r14 && cd r14
for i in 1 2; do
  "$BIN" "${T[@]}" --data.source synthetic:1x28x28:10:128 --train.max_steps 2 >run$i.log 2>&1 ||
    { cat run$i.log; FAIL "default metrics path: run $i"; }
done
n=$(ls -d runs/2*/ 2>/dev/null | wc -l)
[ "$n" = 2 ] && [ -L runs/latest ] && [ "$(grep -c '"event":"start"' runs/latest/metrics.jsonl)" = 1 ] ||
  { FAIL "two runs: $n run folders, runs/latest:"; ls -la runs; }
grep -q "metrics: runs/$(readlink runs/latest)/metrics.jsonl" run2.log || FAIL "run 2 names its file"
expect "a named path is still not overwritten" "already exists" -- "${G[@]}" "${T[@]}" \
  --log.metrics "runs/$(readlink runs/latest)/metrics.jsonl"
cd ..
exit $fail
