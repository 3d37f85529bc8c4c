#!/usr/bin/env bash
# bench/mainjob/run.sh, both sides for 6 steps (one round, Debian's torch 1.13: TORCH=debian):
# points.csv holds one row per method with sane figures, summary.md the ratio; gossipgrad's
# checkpoint loads into the DDP side's resnet8 with load_state_dict(strict=True) and gives
# gossipgrad's own test top-1 there (the same model, the same normalisation); bad inputs, and a
# folder of another recipe, are refused with one line (exit 2) before anything runs. Timings are
# not checked (bench/ measures them). Skipped (77) without torch in /usr/bin/python3, Fashion-MNIST
# or mpirun.
# usage: mainjob_test.sh ROOT GOSSIPGRAD
set -uo pipefail
ROOT="$1"; BIN="$2"
cd "$ROOT"
/usr/bin/python3 -c 'import torch' 2>/dev/null || { echo "skipped: /usr/bin/python3 has no torch"; exit 77; }
[ -f /usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz ] || { echo "skipped: no Fashion-MNIST"; exit 77; }
command -v mpirun >/dev/null || { echo "skipped: no mpirun"; exit 77; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fail=0
RUN=(env TORCH=debian GG_BIN="$BIN" bench/mainjob/run.sh)

expect() {  # expect PATTERN -- COMMAND...: exit 2, one line on stderr holding PATTERN
  local pattern="$1" out rc
  shift 2
  out=$(timeout 60 "$@" 2>&1 >/dev/null); rc=$?
  if [ "$rc" -ne 2 ] || [ "$(printf '%s\n' "$out" | wc -l)" -ne 1 ] || ! grep -qF -- "$pattern" <<<"$out"; then
    echo "FAIL: $*: exit $rc (expected 2, one line with '$pattern'):"; printf '%s\n' "$out" | tail -5; fail=1
  else
    echo "ok: $out"
  fi
}
expect "--rounds = 'abc' must be a whole number" -- "${RUN[@]}" --rounds abc --out "$TMP/bad"
expect "--max-steps = '0' must be a whole number in [1," -- "${RUN[@]}" --max-steps 0 --out "$TMP/bad"
expect "--seed = 'one' must be a whole number" -- "${RUN[@]}" --seed one --out "$TMP/bad"
expect "unknown argument '--steps'" -- "${RUN[@]}" --steps 6 --out "$TMP/bad"
expect "--out needs a value" -- "${RUN[@]}" --out
expect "--variants: unknown variant 'ddp+fp16'" -- "${RUN[@]}" --variants "ddp ddp+fp16" --out "$TMP/bad"
expect "TORCH = 'nightly' must be 2.15" -- env TORCH=nightly GG_BIN="$BIN" bench/mainjob/run.sh --out "$TMP/bad"
expect "no gossipgrad at $TMP/none" -- env TORCH=debian GG_BIN="$TMP/none" bench/mainjob/run.sh --out "$TMP/bad"
touch "$TMP/file"
expect "--out $TMP/file is not a folder" -- "${RUN[@]}" --out "$TMP/file"
[ ! -e "$TMP/bad" ] || { echo "FAIL: run.sh made its folder before refusing"; fail=1; }

# Both sides, 6 steps each (about 10 s a run on a quiet machine; the bounds leave room for a
# loaded one: a DDP run took over 120 s to import torch and start beside a benchmark and -j2).
out=$(timeout 540 "${RUN[@]}" --max-steps 6 --rounds 1 --timeout 240 --out "$TMP/mj" 2>&1); rc=$?
if [ "$rc" -ne 0 ]; then
  echo "FAIL: run.sh --max-steps 6 --rounds 1: exit $rc:"; tail -15 <<<"$out"; fail=1
else
  echo "ok: run.sh --max-steps 6 --rounds 1:"; sed 's/^/  /' <<<"$out"
fi
/usr/bin/python3 - "$TMP/mj" <<'PY' || fail=1
import csv, json, os, sys
d = sys.argv[1]
bad = []
try:
    rows = list(csv.DictReader(open(os.path.join(d, "points.csv"))))
except OSError as e:
    sys.exit(f"FAIL: no points.csv ({e})")
methods = [r["method"] for r in rows]
if methods != ["gossipgrad", "ddp", "ddp+cl"]:
    bad.append(f"methods {methods}, not gossipgrad, ddp, ddp+cl")
for r in rows:
    try:
        ips, top1, wall = float(r["images_per_s"]), float(r["top1_pct"]), float(r["wall_s"])
        loss = float(r["loss_tail"])
    except ValueError as e:
        bad.append(f"{r['method']}: a figure is not a number: {r} ({e})")
        continue
    if r["round"] != "1" or r["steps"] != "6" or not ips > 0 or not 0 < top1 <= 100 or not wall > 0 \
            or not 0 < loss < 10 or not r["threads"].isdigit() or int(r["threads"]) < 1:
        bad.append(f"{r['method']}: insane row {r}")
md = open(os.path.join(d, "summary.md")).read() if os.path.exists(os.path.join(d, "summary.md")) else ""
for want in ("gossipgrad / DDP's best (", "x images/s; top-1 difference", "ISA flags:", "oneDNN ",
             "MPICH: ", "PyTorch: ", "mpirun -n 2 "):
    if want not in md:
        bad.append(f"summary.md lacks '{want}'")
# gossipgrad's own metrics and the DDP side's model: the checkpoint loads strictly and gives
# gossipgrad's top-1 on the test set.
sys.path.insert(0, "bench/mainjob")
import numpy as np, torch, ddp_resnet8 as m
torch.set_num_threads(1)
ev = [json.loads(l) for l in open(os.path.join(d, "gossipgrad-r1", "metrics.jsonl"))]
summary = [e for e in ev if e["event"] == "summary"][-1]
ddp = json.load(open(os.path.join(d, "ddp-r1", "result.json")))
if ddp["params"] != summary["params"]:
    bad.append(f"DDP's resnet8 has {ddp['params']} parameters, gossipgrad's {summary['params']}")
net = m.resnet8(16, 1, 10)
z = np.load(os.path.join(d, "gossipgrad-r1", "checkpoint", "model.npz"))
net.load_state_dict({k: torch.from_numpy(z[k]) for k in z.files}, strict=True)
train_x, _ = m.load_split("/usr/share/datasets/fashion-mnist", "train")
x, y = m.load_split("/usr/share/datasets/fashion-mnist", "t10k")
lut, _, _ = m.normaliser(train_x)
with torch.no_grad():
    top1 = float((net.eval()(lut[x.long()]).argmax(1) == y).double().mean())
if abs(top1 - summary["top1"]) > 5e-4:
    bad.append(f"gossipgrad's checkpoint gives top-1 {top1:.4f} in the DDP side's resnet8, "
               f"gossipgrad reported {summary['top1']:.4f}")
for b in bad:
    print("FAIL:", b)
if not bad:
    print(f"ok: points.csv and summary.md; gossipgrad's checkpoint: top-1 {top1:.4f} in PyTorch, "
          f"{summary['top1']:.4f} in gossipgrad")
sys.exit(1 if bad else 0)
PY

# The folder now holds 6-step runs: 7 steps would pool with them.
rows=$(wc -l <"$TMP/mj/points.csv" 2>/dev/null)
expect "holds runs of 'recipe: configs/laptop.ini --train.max_steps 6 at 2 ranks" -- "${RUN[@]}" --max-steps 7 --out "$TMP/mj"
[ "$(wc -l <"$TMP/mj/points.csv" 2>/dev/null)" = "$rows" ] || { echo "FAIL: points.csv changed on a refused invocation"; fail=1; }
exit $fail
