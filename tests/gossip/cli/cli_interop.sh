#!/usr/bin/env bash
# End to end: 2 ranks train resnet8 for a few steps with a checkpoint folder; `export` writes an
# npz whose names and shapes numpy checks against an independent list of torchvision-style
# names; `infer` on Fashion-MNIST test images gives the same logits on both backends, batched or
# not, and predicts as well as the checkpoint's measured top-1; a run started from the export
# with train.init_from starts where the first one ended.
set -euo pipefail
BIN="$1"; ROOT="$2"; MPIEXEC="$3"
if ! /usr/bin/python3 -c 'import numpy' 2>/dev/null; then
  echo "skipped: /usr/bin/python3 with numpy is not available"; exit 77
fi
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
cd "$TMP"
DATA=/usr/share/datasets/fashion-mnist
RUN=(train --config "$ROOT/configs/laptop.ini" --data.dir "$DATA" --model.width 4 --train.threads 1
     --train.warmup_epochs 0 --log.progress false --train.eval_batch 1000)
OMP_NUM_THREADS=1 "$MPIEXEC" -n 2 "$BIN" "${RUN[@]}" --train.max_steps 60 --log.metrics m.jsonl \
  --checkpoint.dir ck
"$BIN" export --checkpoint ck --output w.npz

/usr/bin/python3 - "$DATA" <<'PY'
import gzip, json, sys
import numpy as np
meta = json.load(open("ck/meta.json"))
norm = meta["normalize"]
with gzip.open(sys.argv[1] + "/t10k-images-idx3-ubyte.gz") as f:
    images = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 1, 28, 28)[:200]
with gzip.open(sys.argv[1] + "/t10k-labels-idx1-ubyte.gz") as f:
    labels = np.frombuffer(f.read(), np.uint8, offset=8)[:200]
x = ((images / 255.0 - norm["mean"]) / norm["std"]).astype(np.float32)
np.save("x.npy", x)
np.save("labels.npy", labels)
PY
OMP_NUM_THREADS=1 "$BIN" infer --model resnet8 --weights w.npz --input x.npy --output y.npy --batch 64
OMP_NUM_THREADS=1 "$BIN" infer --model resnet8 --weights w.npz --input x.npy --output y1.npy \
  --batch 200 --backend reference

/usr/bin/python3 - <<'PY'
import json
import numpy as np
meta = json.load(open("ck/meta.json"))
for key, want in [("format", "gossipgrad-checkpoint"), ("model", "resnet8"), ("input", [1, 28, 28]),
                  ("classes", 10), ("width", 4), ("batch_norm", True), ("epoch", 1), ("step", 60),
                  ("ranks", 2)]:
    assert meta[key] == want, (key, meta[key], want)

# torchvision's naming, written out independently of the C++ model code.
w, c, k = 4, 1, 10
shapes = {}
def bn(name, ch):
    for s in ("weight", "bias", "running_mean", "running_var"):
        shapes[f"{name}.{s}"] = (ch,)
    shapes[f"{name}.num_batches_tracked"] = ()
def block(p, cin, cout, downsample):
    shapes[f"{p}.conv1.weight"] = (cout, cin, 3, 3); bn(f"{p}.bn1", cout)
    shapes[f"{p}.conv2.weight"] = (cout, cout, 3, 3); bn(f"{p}.bn2", cout)
    if downsample:
        shapes[f"{p}.downsample.0.weight"] = (cout, cin, 1, 1); bn(f"{p}.downsample.1", cout)
shapes["conv1.weight"] = (w, c, 3, 3); bn("bn1", w)
block("layer1.0", w, w, False)
block("layer2.0", w, 2 * w, True)
block("layer3.0", 2 * w, 4 * w, True)
shapes["fc.weight"] = (k, 4 * w); shapes["fc.bias"] = (k,)

z = np.load("w.npz")
assert sorted(z.files) == sorted(shapes), set(z.files) ^ set(shapes)
for name, shape in shapes.items():
    a = z[name]
    assert a.shape == shape, (name, a.shape, shape)
    if name.endswith("num_batches_tracked"):
        assert a.dtype == np.int64 and int(a) == 60, (name, a.dtype, a)
    else:
        assert a.dtype == np.float32 and np.isfinite(a).all(), (name, a.dtype)
assert (z["bn1.running_var"] != 1).any(), "running statistics were not exported"
ck = np.load("ck/model.npz")
assert all(np.array_equal(ck[n], z[n]) for n in shapes), "export changed the checkpoint's arrays"

y, y1 = np.load("y.npy"), np.load("y1.npy")
assert y.shape == (200, 10) and y.dtype == np.float32, (y.shape, y.dtype)
scale = max(1.0, float(np.abs(y1).max()))
diff = float(np.abs(y - y1).max())
assert diff <= 1e-4 * scale, f"onednn (batch 64) vs reference (batch 200): max |diff| {diff}"
acc = float((y.argmax(1) == np.load("labels.npy")).mean())
print(f"checkpoint top-1 {meta['top1']:.4f}, infer accuracy on 200 test images {acc:.4f}, "
      f"onednn vs reference max |diff| {diff:.2e}")
assert meta["top1"] > 0.3, "training did not learn enough to make the comparison meaningful"
assert abs(acc - meta["top1"]) < 0.12, (acc, meta["top1"])
PY

# Start from the export with a negligible learning rate: the model must start where it ended
# (random weights would score about 10%). The checkpoint folder is reused with log.overwrite.
OMP_NUM_THREADS=1 "$MPIEXEC" -n 2 "$BIN" "${RUN[@]}" --train.max_steps 2 --train.lr 1e-6 \
  --train.init_from w.npz --log.metrics m2.jsonl --checkpoint.dir ck --log.overwrite true
/usr/bin/python3 - <<'PY'
import json
top1 = [json.loads(l) for l in open("m.jsonl") if '"eval"' in l][-1]["top1"]
resumed = [json.loads(l) for l in open("m2.jsonl") if '"eval"' in l][-1]["top1"]
meta = json.load(open("ck/meta.json"))
print(f"top-1 at the end of the first run {top1:.4f}, after resuming from its export {resumed:.4f}")
assert abs(resumed - top1) < 0.03, (top1, resumed)
assert meta["step"] == 2 and abs(meta["top1"] - resumed) < 1e-9, meta
PY
