#!/usr/bin/env bash
# `gossipgrad info`: torchvision's parameter counts and multiply-adds, per-layer figures that add
# up to the totals, the defaults per model, and usage errors that exit 2 with one line.
set -uo pipefail
BIN="$1"
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
fail=0

check_json() {  # check_json PARAMS MACS INPUT CLASSES -- ARGS...
  local params="$1" macs="$2" input="$3" classes="$4"; shift 5
  if ! "$BIN" info "$@" --json >"$TMP/out.json" 2>"$TMP/err"; then
    echo "FAIL: info $* --json exited non-zero: $(cat "$TMP/err")"; fail=1; return
  fi
  if python3 - "$TMP/out.json" "$params" "$macs" "$input" "$classes" <<'PY'
import json, math, sys
doc = json.load(open(sys.argv[1]))
params, macs, classes = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[5])
assert list(doc)[:9] == ["model", "input", "classes", "params", "buffers", "forward_flops",
                         "forward_macs", "flops_note", "layers"], list(doc)
assert doc["input"] == [int(v) for v in sys.argv[4].split(",")], doc["input"]
assert doc["classes"] == classes, doc["classes"]
assert doc["params"] == params, (doc["params"], params)
if macs >= 0:
    assert doc["forward_macs"] == macs, (doc["forward_macs"], macs)
assert "multiply-add counts as 2" in doc["flops_note"]
layers = doc["layers"]
assert sum(l["params"] for l in layers) == params
assert sum(l["flops"] for l in layers) == doc["forward_flops"]
assert doc["forward_flops"] > 2 * doc["forward_macs"]  # conv/fc plus bn, relu, pools
# Padding taps left out: fewer useful multiply-adds, and a training step does at most 3 passes.
assert 0 < doc["forward_useful_macs"] <= doc["forward_macs"]
assert 2 * doc["forward_useful_macs"] <= doc["training_useful_macs"] <= 3 * doc["forward_useful_macs"]
assert sum(math.prod(t["shape"]) for t in doc["param_tensors"]) == params
names = [l["name"] for l in layers]
for l in layers:
    assert all(i in names[:names.index(l["name"]) + 1] for i in l["inputs"]), l
assert layers[-1]["output"] == [classes] and doc["param_tensors"][-1]["name"] == "fc.bias"
PY
  then echo "ok: info $* --json"; else echo "FAIL: info $* --json"; fail=1; fi
}

check_json 25557032 4089184256 3,224,224 1000 -- --model resnet50
check_json 6624904 1498376192 3,224,224 1000 -- --model googlenet
check_json 11689512 1814073344 3,224,224 1000 -- --model resnet18
check_json 60192808 -1 3,224,224 1000 -- --model resnet152
check_json 11173831 -1 1,97,61 7 -- --model resnet18 --input 1,97,61 --classes 7
check_json 77754 -1 1,28,28 10 -- --model resnet8

# The table: one row per layer, then the totals.
"$BIN" info --model googlenet >"$TMP/table.txt" 2>"$TMP/err" || { echo "FAIL: table"; fail=1; }
grep -q "^inception3a\.branch2\.1\.conv  *conv  *\[128,28,28\]" "$TMP/table.txt" &&
  grep -q "6624904 parameters, 3.019 GFLOPs" "$TMP/table.txt" &&
  grep -q "a multiply-add counts as 2 FLOPs" "$TMP/table.txt" ||
  { echo "FAIL: table content"; cat "$TMP/table.txt" | tail -3; fail=1; }

expect() {  # expect NAME PATTERN -- ARGS...
  local name="$1" pattern="$2"; shift 3
  "$BIN" "$@" >"$TMP/out" 2>"$TMP/err"; local rc=$?
  local lines; lines=$(wc -l <"$TMP/err")
  if [ "$rc" -ne 2 ] || [ "$lines" -ne 1 ] || ! grep -q -- "$pattern" "$TMP/err" || [ -s "$TMP/out" ]; then
    echo "FAIL: $name: exit $rc, $lines stderr lines:"; cat "$TMP/err"; fail=1
  else
    echo "ok: $name -> $(cat "$TMP/err")"
  fi
}
expect "unknown model" "unknown model 'vgg16'" -- info --model vgg16
expect "unknown model, json" "unknown model 'vgg16'" -- info --model vgg16 --json
expect "input too small" "at least 15x15" -- info --model googlenet --input 3,14,14
expect "bad input" "--input" -- info --model resnet50 --input 3,224
expect "width on a torchvision model" "--width applies to resnet8 and cnn" -- info --model resnet50 --width 8
exit $fail
