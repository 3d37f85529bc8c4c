#!/usr/bin/env bash
# bench/loader: decode + augment images/s per worker thread, gossipgrad (TurboJPEG with DCT
# scaling, RandomResizedCrop/flip/normalise) vs torchvision transforms + PIL, on the same
# generated ImageNet-sized JPEGs, in one run. Writes bench/results/loader-<host>.csv and .txt.
# The two run alternately, ROUNDS times (default 3), so that load from other processes hits both
# alike; the summary gives every round's ratio and their median.
# Usage: bench/loader/run.sh [SECONDS per figure, default 5] [IMAGES, default 200]
# (BUILD=dir uses an existing build tree instead of configuring build/.)
set -euo pipefail
cd "$(dirname "$0")/../.."
SECONDS_PER=${1:-5}
IMAGES=${2:-200}
. scripts/checks.sh
gg_decimal SECONDS "$SECONDS_PER" 0.1
gg_int IMAGES "$IMAGES" 1
gg_int ROUNDS "${ROUNDS:-3}" 1
IMAGES=$((10#$IMAGES))
BUILD=${BUILD:-build}
# The JPEGs, made once per count: IMAGES was ignored once the folder existed (the report said
# IMAGES JPEGs of a folder holding another number), and a make cut short left fewer.
IMG=$BUILD/bench-loader-images-$IMAGES
jpegs() { find "$IMG" -name '*.JPEG' | wc -l; }
if [ -d "$IMG" ] && [ "$(jpegs)" != "$IMAGES" ]; then
  echo "bench/loader: $IMG holds $(jpegs) JPEGs, not $IMAGES (a make cut short?): remove it" >&2
  exit 1
fi
./scripts/deps.sh
dpkg-query -W python3-torchvision >/dev/null 2>&1 || {
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-torchvision; }
[ -f "$BUILD/CMakeCache.txt" ] ||
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF -DGG_BENCH=ON >/dev/null
cmake --build "$BUILD" --target gg_bench_loader
[ -d "$IMG" ] || "$BUILD"/bench/gg_bench_loader make "$IMG" "$IMAGES"
OUT=bench/results/loader-$(hostname)
{
  echo "# $(date -u +%FT%TZ) $(uname -srm), $(nproc) cores: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
  echo "# libturbojpeg $(dpkg-query -W -f='${Version}' libturbojpeg0), $(/usr/bin/python3 -c 'import torch, torchvision, PIL; print("torch", torch.__version__, "torchvision", torchvision.__version__, "PIL", PIL.__version__)')"
  echo "# $IMAGES JPEGs in $IMG, $(du -sh "$IMG" | cut -f1); output 3x224x224 float; ${SECONDS_PER}s per figure"
} >"$OUT.txt"
echo "round,impl,transform,threads,images,seconds,images_per_s" >"$OUT.csv"
for round in $(seq 1 "${ROUNDS:-3}"); do
  "$BUILD"/bench/gg_bench_loader run "$IMG" "$SECONDS_PER" | tail -n +2 | sed "s/^/$round,/" >>"$OUT.csv"
  /usr/bin/python3 bench/loader/torchvision_bench.py "$IMG" "$SECONDS_PER" | sed "s/^/$round,/" >>"$OUT.csv"
done
cat "$OUT.csv" >>"$OUT.txt"
python3 - "$OUT.csv" <<'PY' | tee -a "$OUT.txt"
import csv, sys
import statistics
rows = {}
for r in csv.DictReader(open(sys.argv[1])):
    rows.setdefault((r["impl"], r["transform"], r["threads"]), {})[r["round"]] = float(r["images_per_s"])
for t in ("train", "eval"):
    g, tv = rows[("gossipgrad", t, "1")], rows[("torchvision", t, "1")]
    ratios = [g[k] / tv[k] for k in sorted(g)]
    print(f"{t}: gossipgrad {statistics.median(g.values()):.0f} img/s per thread, torchvision "
          f"{statistics.median(tv.values()):.0f} (medians); per-round ratio "
          f"{' '.join(f'{x:.2f}' for x in ratios)}, median {statistics.median(ratios):.2f}x")
for w in ("1", "2"):
    v = rows.get(("gossipgrad-loader", "train", w))
    if v:
        print(f"PrefetchLoader, {w} worker(s), batches of 32: {statistics.median(v.values()):.0f} img/s")
PY
echo "bench/loader: wrote $OUT.csv and $OUT.txt"
