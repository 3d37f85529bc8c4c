#!/usr/bin/env bash
# The CLI contract: every usage error exits 2 with exactly one line naming the problem, and
# writes nothing.
set -uo pipefail
BIN="$1"; ROOT="$2"
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
cd "$TMP"
fail=0
expect() {  # expect NAME PATTERN -- ARGS...
  local name="$1" pattern="$2"; shift 3
  timeout 60 "$BIN" "$@" >"$TMP/out" 2>"$TMP/err"; local rc=$?  # a hang is a failure too
  local lines; lines=$(wc -l <"$TMP/err")
  if [ "$rc" -ne 2 ] || [ "$lines" -ne 1 ] || ! grep -q -- "$pattern" "$TMP/err"; then
    echo "FAIL: $name: exit $rc, $lines stderr lines:"; cat "$TMP/err"; fail=1
  else
    echo "ok: $name -> $(cat "$TMP/err")"
  fi
}
CFG="$ROOT/configs/laptop.ini"
expect "negative batch" "train.batch = -3" -- train --config "$CFG" --train.batch -3
expect "negative seed" "train.seed = -1" -- train --config "$CFG" --train.seed -1
expect "zero epochs" "train.epochs = 0" -- train --config "$CFG" --train.epochs 0
expect "momentum out of range" "train.momentum" -- train --config "$CFG" --train.momentum 1.5
expect "wrong type" "train.batch" -- train --config "$CFG" --train.batch lots
expect "unknown option" "train.bogus" -- train --config "$CFG" --train.bogus 1
expect "missing config file" "no-such.ini" -- train --config no-such.ini
expect "unknown model" "model.name" -- train --config "$CFG" --model.name vgg99
expect "unknown precision" "train.precision = fp8" -- train --config "$CFG" --train.precision fp8
expect "bf16 on the reference backend" "train.precision = bf16" -- train --config "$CFG" --train.precision bf16 --train.backend reference
expect "unknown mode" "gossip.mode" -- train --config "$CFG" --gossip.mode telepathy
expect "unknown hierarchy" "gossip.hierarchy" -- train --config "$CFG" --gossip.hierarchy rack
expect "hierarchy with weights" "set gossip.mode = grad (not both)" -- train --config "$CFG" \
  --gossip.hierarchy node --data.source synthetic:1x28x28:10:200 --train.max_steps 1
expect "hierarchy with bf16" "set gossip.wire = fp32" -- train --config "$CFG" \
  --gossip.hierarchy node --gossip.mode grad --gossip.wire bf16 \
  --data.source synthetic:1x28x28:10:200 --train.max_steps 1
expect "late skip without staleness" "set gossip.staleness = 1" -- train --config "$CFG" \
  --gossip.late skip --data.source synthetic:1x28x28:10:200 --train.max_steps 1
expect "unknown late" "gossip.late" -- train --config "$CFG" --gossip.late never
expect "model_every with grad" "mode grad exchanges no weights" -- train --config "$CFG" \
  --gossip.mode grad --gossip.model_every 4 --data.source synthetic:1x28x28:10:200 \
  --train.max_steps 1
expect "model_every with allreduce" "mode allreduce exchanges no weights" -- train \
  --config "$CFG" --gossip.mode allreduce --gossip.model_every 2 \
  --data.source synthetic:1x28x28:10:200 --train.max_steps 1
expect "late skip with hierarchy" "set gossip.staleness = 1" -- train --config "$CFG" \
  --gossip.mode grad --gossip.hierarchy node --gossip.late skip \
  --data.source synthetic:1x28x28:10:200 --train.max_steps 1
expect "model_every 0" "gossip.model_every" -- train --config "$CFG" --gossip.model_every 0
expect "missing data folder" "data.dir" -- train --config "$CFG" --data.dir /nonexistent
expect "unknown command" "unknown command" -- frobnicate
expect "info without model" "model" -- info
printf '[train]\nbatch = 8\nbogus_key = 1\n' >bad.ini
expect "unknown key in the INI file" "bogus_key" -- train --config bad.ini
printf '[train]\nbatch = eight\n' >badtype.ini
expect "wrong type in the INI file" "batch" -- train --config badtype.ini
# Config files that are no files: a FIFO and /dev/zero hung the reader, a huge file is refused.
mkdir -p inputs && mkfifo inputs/fifo.ini && head -c 2000000 /dev/zero | tr '\0' '#' >inputs/big.ini
expect "config file is a FIFO" "not a regular file" -- train --config inputs/fifo.ini
expect "config file is a device" "not a regular file" -- train --config /dev/zero
expect "config file of 2 MB" "larger than 1 MiB" -- train --config inputs/big.ini
mkdir -p runs && echo keep >runs/m.jsonl
expect "existing metrics file is not overwritten" "already exists" -- train --config "$CFG" --log.metrics runs/m.jsonl
grep -q keep runs/m.jsonl || { echo "FAIL: metrics file was touched"; fail=1; }
if [ -n "$(ls "$TMP" | grep -v -e out -e err -e bad.ini -e badtype.ini -e runs -e help.txt -e inputs)" ]; then
  echo "FAIL: usage errors left files behind: $(ls "$TMP")"; fail=1
fi
# --help answers and exits 0.
# (Output goes to a file first: grep -q closing the pipe early would fail the writer under
# pipefail.)
"$BIN" --help >help.txt && grep -q "gossipgrad train" help.txt || { echo "FAIL: --help"; fail=1; }
"$BIN" train --help >help.txt && grep -q "train.batch" help.txt || { echo "FAIL: train --help"; fail=1; }
"$BIN" info --model resnet8 >help.txt && grep -q "parameters" help.txt || { echo "FAIL: info"; fail=1; }
# An empty value is a value ("--key ''" used to end in "should follow immediately after =").
"$BIN" train --config "$CFG" --log.timeline "" --dry-run >help.txt 2>&1 &&
  grep -q "^timeline = $" help.txt || { echo "FAIL: an empty value"; cat help.txt; fail=1; }
exit $fail
