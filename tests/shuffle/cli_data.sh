#!/usr/bin/env bash
# The data CLI end to end on generated JPEGs: pack (shards listed by tar, progress on stderr,
# refusal to overwrite, usage errors exit 2 with one line), and short training runs under
# mpirun on an ImageNet folder (shuffle ids, a corrupt file skipped and counted), on its shards
# (shuffle bytes) and on synthetic data.
set -uo pipefail
BIN="$1"; MAKE_IMAGES="$2"; MPIEXEC="$3"; ROOT="$4"
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
cd "$TMP"
fail=0
"$MAKE_IMAGES" in 4 24 4 || { echo "FAIL: make_images"; exit 1; }

expect() {  # expect NAME PATTERN -- ARGS...: exit 2 with one stderr line matching PATTERN
  local name="$1" pattern="$2"; shift 3
  "$BIN" "$@" >out.txt 2>err.txt; local rc=$?
  local lines; lines=$(wc -l <err.txt)
  if [ "$rc" -ne 2 ] || [ "$lines" -ne 1 ] || ! grep -q -- "$pattern" err.txt; then
    echo "FAIL: $name: exit $rc, $lines stderr lines:"; cat err.txt; fail=1
  else
    echo "ok: $name -> $(cat err.txt)"
  fi
}

# pack
"$BIN" pack --input in --output shards --shard-size 0.02 --threads 2 >out.txt 2>err.txt
rc=$?
if [ $rc -ne 0 ]; then echo "FAIL: pack exit $rc"; cat err.txt; fail=1; fi
grep -q "pack: 112/112 images" err.txt || { echo "FAIL: no final progress line"; cat err.txt; fail=1; }
ls shards/train/shard-000000.tar shards/train/shard-000001.tar shards/val/shard-000000.tar \
  shards/classes.txt >/dev/null || { echo "FAIL: shards missing"; ls -R shards; fail=1; }
tar -tf shards/train/shard-000000.tar >list.txt || { echo "FAIL: tar -tf"; fail=1; }
grep -q '^n00000001/img_00_000.jpg$' list.txt && grep -q '^n00000001/img_00_000.cls$' list.txt ||
  { echo "FAIL: tar -tf does not list the members"; head list.txt; fail=1; }
total=$(cat shards/train/*.tar | tar -t --ignore-zeros 2>/dev/null | grep -c '\.jpg$')
[ "$total" -eq 96 ] || { echo "FAIL: shards hold $total images, want 96"; fail=1; }
echo "ok: pack wrote $(ls shards/train | wc -l) train shards, tar lists them"
expect "pack refuses to overwrite" "already holds shards" -- pack --input in --output shards
expect "pack without --input" "input" -- pack --output x
expect "pack of a missing folder" "no-such-dir" -- pack --input no-such-dir --output x
expect "pack with a bad shard size" "shard-size" -- pack --input in --output y --shard-size -1
[ ! -e x ] && [ ! -e y ] || { echo "FAIL: usage errors left output behind"; fail=1; }

# train: usage errors about data
CFG="$ROOT/configs/laptop.ini"
expect "missing ImageNet folder" "no-such-imagenet" -- train --config "$CFG" --data.source imagenet:no-such-imagenet
expect "malformed source" "data.source" -- train --config "$CFG" --data.source s3://bucket
expect "malformed synthetic" "synthetic" -- train --config "$CFG" --data.source synthetic:3x8
expect "unknown shuffle mode" "data.shuffle" -- train --config "$CFG" --data.shuffle everything
expect "shuffle_per_step above the batch" "data.shuffle_per_step" -- train --config "$CFG" --data.shuffle ids --data.shuffle_per_step 100000
mkdir -p empty/train
expect "ImageNet folder without images" "no class folder" -- train --config "$CFG" --data.source imagenet:empty

# train on the folder (shuffle ids) with one corrupt file, on the shards (bytes), on synthetic.
head -c 3000 /dev/urandom >in/train/n00000008/img_01_003.JPEG
COMMON=(--config "$CFG" --data.crop 16 --data.resize 20 --model.width 4 --train.batch 8
        --train.epochs 2 --train.threads 1 --train.eval_batch 16 --train.warmup_epochs 0
        --log.progress false --data.workers 2)
run_train() {  # run_train NAME ARGS...
  local name="$1"; shift
  OMP_NUM_THREADS=1 "$MPIEXEC" -n 2 "$BIN" train "${COMMON[@]}" --log.metrics "$name.jsonl" "$@" \
    >"$name.out" 2>"$name.err" || { echo "FAIL: $name"; cat "$name.out" "$name.err"; fail=1; return; }
  python3 - "$name.jsonl" "$name" <<'PY' || fail=1
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1])]
steps = [e for e in ev if e["event"] == "step"]
summary = [e for e in ev if e["event"] == "summary"][0]
assert steps and all("data_wait_s" in e and "skipped" in e for e in steps), "step fields"
name = sys.argv[2]
if name == "folder":
    assert summary["skipped"] > 0, summary
    assert summary["shuffled_samples"] > 0, summary
if name == "shards":
    assert summary["shuffled_samples"] > 0, summary
evals = [e for e in ev if e["event"] == "eval"]
assert (len(evals) == 0) == (name == "synthetic"), "eval events"
print(f"ok: train {name}: {len(steps)} steps, skipped {summary['skipped']}, "
      f"shuffled {summary['shuffled_samples']}, evals {len(evals)}")
PY
}
run_train folder --data.source imagenet:in --data.shuffle ids --data.shuffle_per_step 4
grep -q "skipping sample .*img_01_003.JPEG" folder.err || { echo "FAIL: corrupt file not logged"; cat folder.err; fail=1; }
[ "$(grep -c 'skipping sample' folder.err)" -le 2 ] || { echo "FAIL: corrupt file logged more than once per rank"; fail=1; }
run_train shards --data.source shards:shards --data.shuffle bytes --data.shuffle_per_step 2
run_train synthetic --data.source synthetic:3x12x12:5:64
exit $fail
