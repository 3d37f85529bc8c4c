#!/usr/bin/env bash
# bench/comm: gossip exchange (shm, shm-copy, p2p, rma at p=2) vs MPI_Allreduce vs a local memcpy, 4 KiB to
# 128 MiB, for each rank count given (default 2). Writes bench/results/comm-<host>.csv, a
# markdown summary and a PNG plot (gnuplot). Usage: bench/comm/run.sh [RANKS...]
set -euo pipefail
cd "$(dirname "$0")/../.."
RANKS=("${@:-2}")
read -r -a RANKS <<<"${RANKS[*]}"
. scripts/checks.sh
gg_ints RANKS 2 1024 "${RANKS[@]}"
./scripts/deps.sh
command -v gnuplot >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends gnuplot-nox; }
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF -DGG_BENCH=ON >/dev/null
cmake --build build --target gg_bench_comm
OUT=bench/results/comm-$(hostname)
: >"$OUT.csv"
{
  echo "# $(date -u +%FT%TZ) $(uname -srm), $(nproc) cores: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
} >"$OUT.txt"
for p in "${RANKS[@]}"; do
  # A rank count that fails ends the script with its line (its rows were silently missing).
  OMP_NUM_THREADS=1 mpirun -n "$p" build/bench/gg_bench_comm >"$OUT.p$p.tmp" 2>&1 ||
    { echo "bench/comm: p = $p failed: $(tail -2 "$OUT.p$p.tmp")" >&2; rm -f "$OUT.p$p.tmp"; exit 1; }
  tee -a "$OUT.txt" <"$OUT.p$p.tmp" | grep -v '^#' | { grep -v '^ranks' || true; } >>"$OUT.csv"
  rm -f "$OUT.p$p.tmp"
done
sed -i '1i ranks,method,bytes,median_s,min_s,runs' "$OUT.csv"
python3 - "$OUT.csv" <<'PY' >"$OUT.md"
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
by = {}
for r in rows:
    by[(int(r["ranks"]), int(r["bytes"]), r["method"])] = float(r["median_s"])
print("| ranks | bytes | method | median s | / memcpy | / allreduce |")
print("|---|---|---|---|---|---|")
for (p, b, m), t in sorted(by.items()):
    mc, ar = by.get((p, b, "memcpy")), by.get((p, b, "allreduce"))
    print(f"| {p} | {b} | {m} | {t:.4g} | {t / mc:.2f} | {t / ar:.2f} |")
PY
gnuplot <<GP
set terminal pngcairo size 900,600 noenhanced
set output "$OUT.png"
set datafile separator ","
set logscale xy
set xlabel "bytes per rank"
set ylabel "median seconds"
set key top left
set title "gossip exchange vs MPI_Allreduce vs memcpy ($(hostname), p=${RANKS[0]})"
plot for [m in "memcpy shm shm-copy p2p rma allreduce"] "< grep ',".m.",' $OUT.csv | grep '^${RANKS[0]},'" using 3:4 with linespoints title m
GP
echo "bench/comm: wrote $OUT.csv, $OUT.md, $OUT.png"
