#!/usr/bin/env bash
# bench/loader: decode + augment images/s per worker thread, gossipgrad (TurboJPEG with DCT
# scaling, RandomResizedCrop/flip/normalise) vs torchvision transforms + PIL, on the same
# generated ImageNet-sized JPEGs, in one run. Writes bench/results/loader-<host>.csv and .txt.
# Usage: bench/loader/run.sh [SECONDS per figure, default 5] [IMAGES, default 200]
set -euo pipefail
cd "$(dirname "$0")/../.."
SECONDS_PER=${1:-5}
IMAGES=${2:-200}
./scripts/deps.sh
dpkg-query -W python3-torchvision >/dev/null 2>&1 || {
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-torchvision; }
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF -DGG_BENCH=ON >/dev/null
cmake --build build --target gg_bench_loader
IMG=build/bench-loader-images
[ -d "$IMG" ] || build/bench/gg_bench_loader make "$IMG" "$IMAGES"
OUT=bench/results/loader-$(hostname)
{
  echo "# $(date -u +%FT%TZ) $(uname -srm), $(nproc) cores: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
  echo "# libturbojpeg $(dpkg-query -W -f='${Version}' libturbojpeg0), $(/usr/bin/python3 -c 'import torch, torchvision, PIL; print("torch", torch.__version__, "torchvision", torchvision.__version__, "PIL", PIL.__version__)')"
  echo "# $IMAGES JPEGs in $IMG, $(du -sh "$IMG" | cut -f1); output 3x224x224 float; ${SECONDS_PER}s per figure"
} >"$OUT.txt"
build/bench/gg_bench_loader run "$IMG" "$SECONDS_PER" >"$OUT.csv"
/usr/bin/python3 bench/loader/torchvision_bench.py "$IMG" "$SECONDS_PER" >>"$OUT.csv"
cat "$OUT.csv" >>"$OUT.txt"
python3 - "$OUT.csv" <<'PY' | tee -a "$OUT.txt"
import csv, sys
rows = {(r["impl"], r["transform"], r["threads"]): float(r["images_per_s"]) for r in csv.DictReader(open(sys.argv[1]))}
for t in ("train", "eval"):
    g, tv = rows[("gossipgrad", t, "1")], rows[("torchvision", t, "1")]
    print(f"{t}: gossipgrad {g:.0f} img/s per thread, torchvision {tv:.0f} img/s per thread: {g / tv:.2f}x")
PY
echo "bench/loader: wrote $OUT.csv and $OUT.txt"
