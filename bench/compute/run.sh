#!/usr/bin/env bash
# bench/compute: training images/s (forward + backward + SGD update) of gossipgrad's oneDNN
# backend side by side with PyTorch (Debian's python3-torch, /usr/bin/python3) on the same model,
# batch, resolution and thread count, one process each, alternating, REPEATS times per setting.
# Writes bench/results/compute-<host>.csv and a markdown table with the ratio of the medians.
# Usage: bench/compute/run.sh [MODEL:BATCH:RES:THREADS[:PRECISION] ...]
#   default: resnet50:16:224:2 googlenet:16:224:2 resnet50:16:64:2 and the same in bf16
#   PRECISION (fp32 default, or bf16) is gossipgrad's; PyTorch always runs fp32, the baseline.
# Environment: REPEATS (default 3), STEPS (timed steps, default 10), WARMUP (default 3).
#
# bench/compute/run.sh --backend cuda [MODEL:BATCH:RES:PRECISION ...]: the GPU comparison. The
#   CUDA backend (resident: the step never leaves the GPU) against PyTorch 2.x on the same GPU
#   (same model, batch and precision; PyTorch in channels_last, cudnn.benchmark on), alternating,
#   REPEATS times. PRECISION: fp32 (TF32 off on both sides), tf32 (TF32 on on both), bf16 (ours:
#   bf16 activations over fp32 master weights; PyTorch: autocast bf16). Default settings:
#   resnet50:256:224:tf32 resnet50:256:224:bf16 googlenet:256:224:tf32 googlenet:256:224:bf16.
#   PYTHON (default python3) must have torch 2.x with CUDA; nothing is installed (GPU machines
#   may have no package registry: see bench/compute/gpu_device_run.sh). Writes
#   bench/results/compute-cuda-<host>.{csv,md,txt}.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ "${1:-}" = "--backend" ]; then
  BACKEND="${2:?--backend needs a value}"
  shift 2
  [ "$BACKEND" = "cuda" ] || [ "$BACKEND" = "onednn" ] || {
    echo "run.sh: --backend must be onednn or cuda" >&2
    exit 2
  }
else
  BACKEND=onednn
fi
if [ "$BACKEND" = "cuda" ]; then
  SETTINGS=("${@:-resnet50:256:224:tf32 resnet50:256:224:bf16 googlenet:256:224:tf32 googlenet:256:224:bf16}")
  read -r -a SETTINGS <<<"${SETTINGS[*]}"
  REPEATS=${REPEATS:-3}
  STEPS=${STEPS:-20}
  WARMUP=${WARMUP:-5}
  PYTHON=${PYTHON:-python3}
  BUILD=${BUILD:-build}
  if [ ! -x "$BUILD/bench/gg_bench_compute" ] || [ "${REBUILD:-1}" = "1" ]; then
    cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF -DGG_BENCH=ON \
      -DGG_CUDA=ON >/dev/null
    cmake --build "$BUILD" --target gg_bench_compute
  fi
  "$PYTHON" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' || {
    echo "run.sh: $PYTHON has no CUDA-enabled torch" >&2
    exit 1
  }
  OUT=bench/results/compute-cuda-$(hostname)
  mkdir -p bench/results
  echo "impl,model,batch,res,threads,precision,median_step_s,images_per_s,peak_rss_mb,params" >"$OUT.csv"
  {
    echo "# $(date -u +%FT%TZ) $(uname -srm), $(nproc) cores"
    echo "# GPU: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)"
    echo "# torch: $("$PYTHON" -c 'import torch; print(torch.__version__, "CUDA", torch.version.cuda, "cuDNN", torch.backends.cudnn.version())')"
    echo "# repeats=$REPEATS steps=$STEPS warmup=$WARMUP; PyTorch channels_last, cudnn.benchmark"
  } >"$OUT.txt"
  for s in "${SETTINGS[@]}"; do
    IFS=: read -r model batch res precision <<<"$s"
    args=(--model "$model" --batch "$batch" --res "$res" --threads 1 --steps "$STEPS" --warmup "$WARMUP"
      --precision "$precision")
    for ((r = 1; r <= REPEATS; r++)); do
      "$BUILD/bench/gg_bench_compute" "${args[@]}" --backend cuda 2>>"$OUT.txt" | tee -a "$OUT.txt" >>"$OUT.csv"
      "$PYTHON" bench/compute/torch_bench.py "${args[@]}" --device cuda --channels-last 2>>"$OUT.txt" |
        tee -a "$OUT.txt" >>"$OUT.csv"
    done
  done
  "$PYTHON" - "$OUT.csv" <<'PY' >"$OUT.md"
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1])))
key = lambda r: (r["model"], r["batch"], r["res"], r["precision"])
print("| model | batch | res | precision | gossipgrad cuda img/s | PyTorch img/s | ratio of medians |")
print("|---|---|---|---|---|---|---|")
for k in dict.fromkeys(key(r) for r in rows):
    ours = [float(r["images_per_s"]) for r in rows if key(r) == k and r["impl"].startswith("gossipgrad")]
    theirs = [float(r["images_per_s"]) for r in rows if key(r) == k and r["impl"].startswith("pytorch")]
    if ours and theirs:
        a, b = statistics.median(ours), statistics.median(theirs)
        print(f"| {' | '.join(k)} | {a:.1f} | {b:.1f} | {a / b:.2f} |")
PY
  cat "$OUT.md"
  echo "bench/compute: wrote $OUT.csv, $OUT.md (raw output in $OUT.txt)"
  exit 0
fi
SETTINGS=("${@:-resnet50:16:224:2 googlenet:16:224:2 resnet50:16:64:2 resnet50:16:224:2:bf16 googlenet:16:224:2:bf16 resnet50:16:64:2:bf16}")
read -r -a SETTINGS <<<"${SETTINGS[*]}"
REPEATS=${REPEATS:-3}
STEPS=${STEPS:-10}
WARMUP=${WARMUP:-3}
./scripts/deps.sh
if ! /usr/bin/python3 -c 'import torch, torchvision' 2>/dev/null; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    python3-torch python3-torchvision >/dev/null
fi
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF -DGG_BENCH=ON >/dev/null
cmake --build build --target gg_bench_compute
OUT=bench/results/compute-$(hostname)
mkdir -p bench/results
echo "impl,model,batch,res,threads,precision,median_step_s,images_per_s,peak_rss_mb,params" >"$OUT.csv"
{
  echo "# $(date -u +%FT%TZ) $(uname -srm), $(nproc) cores: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
  echo "# flags: $(grep -m1 '^flags' /proc/cpuinfo | grep -o 'avx512[a-z_0-9]*\|avx2\|amx[a-z_0-9]*' | sort -u | xargs)"
  echo "# oneDNN: $(dpkg-query -W -f '${Version}' libdnnl-dev 2>/dev/null), torch: $(/usr/bin/python3 -c 'import torch; print(torch.__version__)')"
  echo "# repeats=$REPEATS steps=$STEPS warmup=$WARMUP"
} >"$OUT.txt"
for s in "${SETTINGS[@]}"; do
  IFS=: read -r model batch res threads precision <<<"$s"
  args=(--model "$model" --batch "$batch" --res "$res" --threads "$threads" --steps "$STEPS"
    --warmup "$WARMUP")
  for ((r = 1; r <= REPEATS; r++)); do
    OMP_NUM_THREADS=$threads build/bench/gg_bench_compute "${args[@]}" --precision "${precision:-fp32}" |
      tee -a "$OUT.txt" >>"$OUT.csv"
    OMP_NUM_THREADS=$threads /usr/bin/python3 bench/compute/torch_bench.py "${args[@]}" |
      tee -a "$OUT.txt" >>"$OUT.csv"
  done
done
/usr/bin/python3 - "$OUT.csv" <<'PY' >"$OUT.md"
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1])))
setting = lambda r: (r["model"], r["batch"], r["res"], r["threads"])
keys = []
for r in rows:
    k = setting(r) + (r["precision"],)
    if r["impl"].startswith("gossipgrad") and k not in keys:
        keys.append(k)
print("| model | batch | res | threads | gossipgrad precision | gossipgrad img/s | PyTorch fp32 img/s "
      "| ratio of medians | gossipgrad peak MB | PyTorch peak MB |")
print("|---|---|---|---|---|---|---|---|---|---|")
for k in keys:
    ours = [r for r in rows if r["impl"].startswith("gossipgrad") and setting(r) + (r["precision"],) == k]
    # PyTorch rows of the same setting, run alternately with these (its own fp32 baseline)
    theirs = [r for r in rows if r["impl"].startswith("pytorch") and setting(r) == k[:4]]
    if not ours or not theirs:
        continue
    a = statistics.median(float(r["images_per_s"]) for r in ours)
    b = statistics.median(float(r["images_per_s"]) for r in theirs)
    mo = max(float(r["peak_rss_mb"]) for r in ours)
    mt = max(float(r["peak_rss_mb"]) for r in theirs)
    print(f"| {' | '.join(k)} | {a:.2f} | {b:.2f} | {a / b:.2f} | {mo:.0f} | {mt:.0f} |")
PY
cat "$OUT.md"
echo "bench/compute: wrote $OUT.csv, $OUT.md (raw output in $OUT.txt)"
