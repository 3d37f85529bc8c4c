#!/usr/bin/env bash
# Apoptosis end to end: 2 ranks gossip-train the cnn on Fashion-MNIST with decisions every 60
# steps; the network shrinks (apoptosis events with falling parameter counts and images/s), the
# shrunk model still learns, the checkpoint's meta.json records the shrunk widths, `export`
# writes the real (pruned) shapes and `infer` runs the exported weights.
set -euo pipefail
BIN="$1"; ROOT="$2"; MPIEXEC="$3"
if ! /usr/bin/python3 -c 'import numpy' 2>/dev/null; then
  echo "skipped: /usr/bin/python3 with numpy is not available"; exit 77
fi
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
cd "$TMP"
DATA=/usr/share/datasets/fashion-mnist
OMP_NUM_THREADS=1 "$MPIEXEC" -n 2 "$BIN" train --config "$ROOT/configs/laptop.ini" \
  --data.dir "$DATA" --model.name cnn --model.width 8 --train.threads 1 --train.max_steps 300 \
  --train.warmup_epochs 0.1 --train.eval_batch 1000 --log.progress false --log.metrics m.jsonl \
  --checkpoint.dir ck --apoptosis.enable true --apoptosis.interval 60 \
  --apoptosis.threshold 0.8 --apoptosis.max_share 0.3 --apoptosis.min_keep 4
"$BIN" export --checkpoint ck --output w.npz

/usr/bin/python3 - "$DATA" <<'PY'
import gzip, json, sys
import numpy as np
events = [json.loads(l) for l in open("m.jsonl")]
start = next(e for e in events if e["event"] == "start")
apo = [e for e in events if e["event"] == "apoptosis"]
summary = next(e for e in events if e["event"] == "summary")
assert len(apo) == 4, len(apo)  # steps 60, 120, 180, 240
params = [start["params"]] + [e["params"] for e in apo]
assert all(b <= a for a, b in zip(params, params[1:])), params
assert params[-1] < 0.7 * params[0], params
for e in apo:
    assert e["params_before"] >= e["params"], e
    assert e["images_per_s"] is not None and e["images_per_s"] > 0, e
    assert e["images_per_s_before"] > 0, e
    assert set(e["widths"]) == {"conv1", "conv2", "fc1"}, e
assert summary["params"] == params[-1], (summary["params"], params)
top1 = [e for e in events if e["event"] == "eval"][-1]["top1"]
print(f"params {params[0]} -> {params[-1]}, top-1 after 300 steps: {top1:.4f}")
assert top1 > 0.75, top1

meta = json.load(open("ck/meta.json"))
widths = apo[-1]["widths"]
full = {"conv1": 8, "conv2": 16, "fc1": 64}
assert meta["widths"] == {k: v for k, v in widths.items() if v != full[k]}, meta.get("widths")
z = np.load("w.npz")
c1, c2, f1 = widths["conv1"], widths["conv2"], widths["fc1"]
assert z["conv1.weight"].shape == (c1, 1, 3, 3), z["conv1.weight"].shape
assert z["bn1.running_var"].shape == (c1,)
assert z["conv2.weight"].shape == (c2, c1, 3, 3), z["conv2.weight"].shape
assert z["fc1.weight"].shape == (f1, c2 * 49), z["fc1.weight"].shape
assert z["fc2.weight"].shape == (10, f1), z["fc2.weight"].shape
assert sum(z[k].size for k in z.files if not k.endswith(("running_mean", "running_var",
           "num_batches_tracked"))) == params[-1]

norm = meta["normalize"]
with gzip.open(sys.argv[1] + "/t10k-images-idx3-ubyte.gz") as f:
    images = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 1, 28, 28)[:500]
with gzip.open(sys.argv[1] + "/t10k-labels-idx1-ubyte.gz") as f:
    labels = np.frombuffer(f.read(), np.uint8, offset=8)[:500]
np.save("x.npy", ((images / 255.0 - norm["mean"]) / norm["std"]).astype(np.float32))
np.save("labels.npy", labels)
PY
OMP_NUM_THREADS=1 "$BIN" infer --model cnn --width 8 --weights w.npz --input x.npy --output y.npy
/usr/bin/python3 - <<'PY'
import numpy as np
y, labels = np.load("y.npy"), np.load("labels.npy")
acc = float((y.argmax(1) == labels).mean())
print(f"infer on the exported pruned model: {acc:.3f} of 500 test images")
assert acc > 0.7, acc
PY
echo "apoptosis end to end: ok"

# Resume from a full checkpoint taken after shrinks is exact: 80 steps straight equal 40, a stop
# (the checkpoint holds the shrunk widths), and 40 more resumed; every rank's state file at steps
# 60 and 80 is identical byte for byte (decisions every 20 steps on both sides of the stop).
RUN=(train --config "$ROOT/configs/laptop.ini" --data.source synthetic:1x28x28:10:2000
     --model.name cnn --model.width 8 --train.batch 32 --train.threads 1 --train.epochs 3
     --train.max_steps 80 --log.progress false --gossip.consensus_every 0 --checkpoint.every 20
     --apoptosis.enable true --apoptosis.interval 20 --apoptosis.threshold 0.9
     --apoptosis.max_share 0.3 --apoptosis.min_keep 2)
OMP_NUM_THREADS=1 "$MPIEXEC" -n 2 "$BIN" "${RUN[@]}" --checkpoint.dir A --log.metrics a.jsonl > a.log
OMP_NUM_THREADS=1 "$MPIEXEC" -n 2 "$BIN" "${RUN[@]}" --checkpoint.dir B --log.metrics b.jsonl \
  --train.stop_at 40 > b1.log
OMP_NUM_THREADS=1 "$MPIEXEC" -n 2 "$BIN" "${RUN[@]}" --checkpoint.dir B --log.metrics b.jsonl \
  --checkpoint.resume auto > b2.log
grep -q "resumed from B/ckpt-000000000040 at step 40" b2.log || { echo "FAIL: not resumed"; exit 1; }
/usr/bin/python3 - <<'PY'
import json
w40 = json.load(open("B/ckpt-000000000040/MANIFEST.json"))["model"].get("widths")
w80 = json.load(open("A/ckpt-000000000080/MANIFEST.json"))["model"].get("widths")
print("widths at step 40:", w40, "at step 80:", w80)
assert w40, "no shrink recorded by step 40"
assert w80 and w80 != w40, "no decision removed units after the resume point"
PY
for step in 000000000060 000000000080; do
  for r in 00000 00001; do
    cmp -s "A/ckpt-$step/rank-$r.bin" "B/ckpt-$step/rank-$r.bin" ||
      { echo "FAIL: rank $r at step $step differs after resuming a shrunk model"; exit 1; }
  done
done
echo "exact resume after a shrink: ok"
