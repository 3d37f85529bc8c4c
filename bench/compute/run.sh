#!/usr/bin/env bash
# bench/compute: training images/s (forward + backward + SGD update) of gossipgrad's oneDNN
# backend side by side with PyTorch (Debian's python3-torch, /usr/bin/python3) on the same model,
# batch, resolution and thread count, one process each, alternating, REPEATS times per setting.
# Writes bench/results/compute-<host>.csv and a markdown table with the ratio of the medians.
# Usage: bench/compute/run.sh [MODEL:BATCH:RES:THREADS[:PRECISION] ...]
#   default: resnet50:16:224:2 googlenet:16:224:2 resnet50:16:64:2 and the same in bf16
#   PRECISION (fp32 default, or bf16) is gossipgrad's; PyTorch always runs fp32, the baseline.
# Environment: REPEATS (default 3), STEPS (timed steps, default 10), WARMUP (default 3).
set -euo pipefail
cd "$(dirname "$0")/../.."
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
