#!/usr/bin/env bash
# bench/comm/ratios.sh: the exchange targets, side by side. Runs `mpirun -n 2 gg_bench_comm`
# INVOCATIONS times (default 5) up to ResNet-50's gradient size (102,228,128 bytes) and prints,
# for each transport, its time over memcpy's and over MPI_Allreduce's in the same invocation,
# per invocation and the median. Writes bench/results/comm-ratios-<host>.md.
# Usage: bench/comm/ratios.sh [INVOCATIONS]
set -euo pipefail
cd "$(dirname "$0")/../.."
N=${1:-5}
. scripts/checks.sh
gg_int INVOCATIONS "$N" 1 1000  # 'abc' ran none and ended in a traceback, after the build
./scripts/deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF -DGG_BENCH=ON >/dev/null
cmake --build build --target gg_bench_comm >/dev/null
OUT=bench/results/comm-ratios-$(hostname)
RAW=$(mktemp)
trap 'rm -f "$RAW"' EXIT
for ((i = 1; i <= N; i++)); do
  echo "invocation $i/$N" >&2
  # A failed invocation, or one without the rows, ends it with its line (it ended without a word).
  out=$(OMP_NUM_THREADS=1 mpirun -n 2 build/bench/gg_bench_comm --max-bytes 102228128 --runs 7 2>&1) ||
    { echo "bench/comm/ratios.sh: invocation $i failed: $(tail -1 <<<"$out")" >&2; exit 1; }
  rows=$(grep '^2,.*,102228128,' <<<"$out") ||
    { echo "bench/comm/ratios.sh: invocation $i printed no row at 102228128 bytes: $(tail -1 <<<"$out")" >&2; exit 1; }
  sed "s/^/$i,/" <<<"$rows" >>"$RAW"
done
python3 - "$RAW" "$N" <<'PY' | tee "$OUT.md"
import statistics, sys
rows = [l.strip().split(",") for l in open(sys.argv[1]) if l.strip()]
t = {}
for inv, _, method, _, med, *_ in rows:
    t.setdefault(method, {})[int(inv)] = float(med)
inv = sorted(t["memcpy"])
print(f"mpirun -n 2 gg_bench_comm, 102,228,128 bytes, {len(inv)} invocations (median of 7 runs each)\n")
print("| method | ms per invocation | / memcpy | median | / MPI_Allreduce | median |")
print("|---|---|---|---|---|---|")
for m in [m for m in ("shm", "shm-copy", "p2p", "rma", "allreduce", "memcpy") if m in t]:
    ms = " ".join(f"{t[m][i] * 1e3:.1f}" for i in inv)
    rm = [t[m][i] / t["memcpy"][i] for i in inv]
    ra = [t[m][i] / t["allreduce"][i] for i in inv]
    print(f"| {m} | {ms} | {' '.join(f'{x:.2f}' for x in rm)} | **{statistics.median(rm):.2f}** "
          f"| {' '.join(f'{x:.2f}' for x in ra)} | **{statistics.median(ra):.2f}** |")
PY
