#!/usr/bin/env bash
# Issue 15 end to end: data an adversarial pass found to crash, hang or train to a silent wrong
# answer. JPEGs cut short, declaring 0x0 or 20000x20000 are skipped and counted
# while training goes on (exit 0); test images of another size than the training images, labels
# outside the classes and val_labels lines naming missing files stop `gossipgrad train` before
# training with one line and exit 2.
set -uo pipefail
BIN="$1"; MAKE_IMAGES="$2"; MPIEXEC="$3"; ROOT="$4"
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
cd "$TMP"
fail=0
CFG="$ROOT/configs/laptop.ini"
export OMP_NUM_THREADS=1
# A mistaken class count must fail with a message, not allocate a model of 50M classes.
ulimit -v 8000000

# JPEG patches: the file cut to N bytes (or a third), or its frame header declaring W x H.
patch() {  # patch FILE cut N | patch FILE third | patch FILE size W H
  python3 - "$@" <<'PY'
import struct, sys
path, what = sys.argv[1], sys.argv[2]
d = bytearray(open(path, "rb").read())
if what == "cut":
    d = d[: int(sys.argv[3])]
elif what == "third":
    d = d[: len(d) // 3]
else:
    i = next(i for i in range(2, len(d) - 9) if d[i] == 0xFF and d[i + 1] in (0xC0, 0xC2))
    d[i + 5 : i + 9] = struct.pack(">HH", int(sys.argv[4]), int(sys.argv[3]))
open(path, "wb").write(bytes(d))
PY
}

COMMON=(--config "$CFG" --data.crop 16 --data.resize 20 --model.width 4 --train.batch 8
        --train.epochs 2 --train.threads 1 --train.eval_batch 16 --train.warmup_epochs 0
        --log.progress false)
# train_skips NAME WANT ARGS...: training exits 0 and the summary counts WANT skipped samples.
train_skips() {
  local name="$1" want="$2"; shift 2
  "$@" "${COMMON[@]}" --log.metrics "$name.jsonl" >"$name.out" 2>"$name.err"
  local rc=$?
  local got; got=$(python3 -c 'import json,sys
print([json.loads(l) for l in open(sys.argv[1])][-1].get("skipped", "none"))' "$name.jsonl" 2>/dev/null)
  if [ $rc -ne 0 ] || [ "$got" != "$want" ]; then
    echo "FAIL: $name: exit $rc, skipped $got, want exit 0 and $want skipped"; tail -n 4 "$name.err"
    fail=1
  else
    echo "ok: $name: exit 0, $got skipped"
  fi
}

# 1. JPEGs cut inside their header (tables, frame) or their image data among good ones: folder
# and shards, 1 or 2 loader threads, augmentation on or off.
"$MAKE_IMAGES" cut 2 8 1 || { echo "FAIL: make_images"; exit 1; }
patch cut/train/n00000001/img_00_003.JPEG cut 100
patch cut/train/n00000008/img_01_005.JPEG cut 300
patch cut/train/n00000008/img_01_007.JPEG third
"$BIN" pack --input cut --output cut-shards >/dev/null 2>&1 || { echo "FAIL: pack"; fail=1; }
train_skips cut-folder 6 "$BIN" train --data.source imagenet:cut --data.workers 1 --data.augment false
train_skips cut-folder-augment 6 "$BIN" train --data.source imagenet:cut --data.workers 2 --data.augment true
train_skips cut-shards 6 "$MPIEXEC" -n 2 "$BIN" train --data.source shards:cut-shards --data.workers 2
grep -q "skipping sample .*img_00_003" cut-folder.err ||
  { echo "FAIL: the cut file is not logged"; cat cut-folder.err; fail=1; }

# 2. A JPEG declaring 0x0 among 80: one skip per epoch, no valid file reported corrupt.
"$MAKE_IMAGES" zero 4 20 0 || { echo "FAIL: make_images"; exit 1; }
patch zero/train/n00000015/img_02_007.JPEG size 0 0
train_skips zero-size 2 "$BIN" train --data.source imagenet:zero --data.workers 1
if grep "skipping" zero-size.err | grep -qv img_02_007; then
  echo "FAIL: valid files reported corrupt after the 0x0 one"; grep skipping zero-size.err | head -3
  fail=1
fi

# 3. A JPEG declaring 20000x20000 (400 megapixels in 2 KB) is refused from its header.
"$MAKE_IMAGES" huge 2 8 0 || { echo "FAIL: make_images"; exit 1; }
patch huge/train/n00000008/img_01_001.JPEG size 20000 20000
train_skips huge-size 2 "$BIN" train --data.source imagenet:huge --data.workers 1
grep -q "img_01_001.JPEG: declares 20000x20000 pixels.*megapixels" huge-size.err ||
  { echo "FAIL: no reason for the refused 400-megapixel file"; cat huge-size.err; fail=1; }

# expect NAME PATTERN ARGS...: exit 2 with one stderr line matching PATTERN, before training.
expect() {
  local name="$1" pattern="$2"; shift 2
  "$BIN" train "${COMMON[@]}" --log.metrics "$name.jsonl" "$@" >"$name.out" 2>"$name.err"
  local rc=$? lines; lines=$(wc -l <"$name.err")
  if [ $rc -ne 2 ] || [ "$lines" -ne 1 ] || ! grep -q -- "$pattern" "$name.err" ||
     grep -q "epoch" "$name.out"; then
    echo "FAIL: $name: exit $rc, $lines stderr lines (want exit 2, one line with '$pattern'):"
    cat "$name.err"; tail -n 2 "$name.out"; fail=1
  else
    echo "ok: $name -> $(cat "$name.err")"
  fi
}

# 4 and 5 (idx): test images of another size; a stray training label; a declared class count; a
# test label outside the training classes.
python3 - <<'PY' || { echo "FAIL: writing idx files"; exit 1; }
import os, struct
def split(d, name, n, side, labels):
    os.makedirs(d, exist_ok=True)
    with open(f"{d}/{name}-images-idx3-ubyte", "wb") as f:
        f.write(struct.pack(">IIII", 0x803, n, side, side) + bytes((i * 7) % 256 for i in range(n * side * side)))
    with open(f"{d}/{name}-labels-idx1-ubyte", "wb") as f:
        f.write(struct.pack(">II", 0x801, n) + bytes(labels))
train = [i % 10 for i in range(64)]
test = [i % 10 for i in range(20)]
for d, side, tr, te in [("s32", 32, train, test), ("s14", 14, train, test),
                        ("lab200", 28, train[:5] + [200] + train[6:], test),
                        ("lab12", 28, train[:5] + [12] + train[6:], test),
                        ("tlab255", 28, train, test[:7] + [255] + test[8:])]:
    split(d, "train", 64, 28, tr)
    split(d, "t10k", 20, side, te)
PY
expect "idx test images 32x32 beside 28x28" "t10k-images-idx3-ubyte are 1x32x32.*train-images-idx3-ubyte are 1x28x28" --data.source idx:s32
expect "idx test images 14x14 beside 28x28" "1x14x14.*1x28x28" --data.source idx:s14
expect "idx training label 200 among 0..9" "train-labels-idx1-ubyte.*label 200 of sample 5.*classes.txt" --data.source idx:lab200
expect "fashion-mnist label 12" "label 12 of sample 5.*10 classes" --data.source fashion-mnist --data.dir lab12
expect "idx test label 255" "t10k-labels-idx1-ubyte: label 255 of sample 7 is not one of the 10 training classes" --data.source idx:tlab255

# 5 (shards, val_labels): a .cls of 50,000,000; a val_labels line naming a missing file.
"$MAKE_IMAGES" cls 2 4 0 || { echo "FAIL: make_images"; exit 1; }
"$BIN" pack --input cls --output cls-shards >/dev/null 2>&1 || { echo "FAIL: pack"; fail=1; }
rm cls-shards/classes.txt
python3 - cls-shards/train/shard-000000.tar <<'PY' || { echo "FAIL: rewriting the shard"; exit 1; }
import io, sys, tarfile
src = tarfile.open(sys.argv[1]); members = [(m, src.extractfile(m).read()) for m in src.getmembers()]
with tarfile.open(sys.argv[1] + ".new", "w", format=tarfile.USTAR_FORMAT) as out:
    for m, data in members:
        if m.name == "n00000008/img_01_002.cls":
            data = b"50000000"; m.size = len(data)
        out.addfile(m, io.BytesIO(data))
PY
mv cls-shards/train/shard-000000.tar.new cls-shards/train/shard-000000.tar
expect "shard .cls of 50000000" "shard-000000.tar: sample 'n00000008/img_01_002' .cls holds class 50000000" --data.source shards:cls-shards

"$MAKE_IMAGES" val 2 4 0 || { echo "FAIL: make_images"; exit 1; }
mkdir -p val/val
cp val/train/n00000001/img_00_000.JPEG val/val/a.JPEG
printf 'a.JPEG n00000001\nmissing.JPEG n00000008\n' >val/val_labels.txt
expect "val_labels line naming a missing file" "val_labels.txt:2: names missing.JPEG, which is not a file in" --data.source imagenet:val
exit $fail
