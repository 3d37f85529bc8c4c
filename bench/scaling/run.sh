#!/usr/bin/env bash
# bench/scaling: weak scaling of `gossipgrad train` over rank counts, gossip against allreduce,
# side by side, with the simulator's prediction for each point. For every rank count P and mode
# it runs `mpirun -n P gossipgrad train --config CONFIG --train.max_steps STEPS` (fixed batch per
# rank, THREADS threads per rank) and reads the metrics: median step time after WARM steps,
# images/s, efficiency against P times the one-rank speed, exposed communication and data-wait
# shares. `gossipgrad simulate` is given the one-rank compute times measured in the same run and
# predicts each point; the prediction error is reported. Writes bench/results/scaling-<host>.csv,
# .md and .png (gnuplot).
# Usage: bench/scaling/run.sh [CONFIG] [RANKS...]   (default: configs/laptop.ini 1 2)
# Environment: STEPS (default 200), WARM (default 30), THREADS (default 1), EXTRA (more train
# options, e.g. "--model.width 8").
set -euo pipefail
cd "$(dirname "$0")/../.."
CONFIG=${1:-configs/laptop.ini}
shift || true
RANKS=("${@:-1 2}")
read -r -a RANKS <<<"${RANKS[*]}"
STEPS=${STEPS:-200}
WARM=${WARM:-30}
THREADS=${THREADS:-1}
. scripts/checks.sh
gg_int STEPS "$STEPS" 1
gg_int WARM "$WARM" 0
gg_int THREADS "$THREADS" 1 1024
gg_ints RANKS 1 4096 "${RANKS[@]}"
((WARM < STEPS)) || { echo "run.sh: WARM = $WARM must be below STEPS = $STEPS" >&2; exit 2; }
[ -f "$CONFIG" ] || { echo "run.sh: config '$CONFIG' is not a file (usage: bench/scaling/run.sh [CONFIG] [RANKS...])" >&2; exit 2; }
[[ " ${RANKS[*]} " == *" 1 "* ]] ||
  { echo "run.sh: RANKS = '${RANKS[*]}' must include 1: the one-rank step drives the simulator and the efficiency" >&2; exit 2; }
read -r -a EXTRA <<<"${EXTRA:-}"
./scripts/deps.sh
command -v gnuplot >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends gnuplot-nox >/dev/null; }
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF >/dev/null
cmake --build build --target gossipgrad >/dev/null
BIN=build/gossip/gossipgrad
OUT=bench/results/scaling-$(hostname)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
echo "ranks,mode,median_step_s,images_per_s,efficiency,exposed_comm_share,data_wait_share,predicted_step_s,prediction_error" >"$OUT.csv"
{
  echo "# $(date -u +%FT%TZ) $(uname -srm), $(nproc) cores: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
  echo "# config $CONFIG, steps $STEPS (median after $WARM), $THREADS thread(s) per rank, extra: ${EXTRA[*]:-none}"
} >"$OUT.txt"
for p in "${RANKS[@]}"; do
  for mode in both allreduce; do
    [ "$p" -eq 1 ] && [ "$mode" = both ] && continue # one rank: no communication to compare
    echo "scaling: $p rank(s), $mode" >&2
    OMP_NUM_THREADS=$THREADS mpirun -n "$p" "$BIN" train --config "$CONFIG" \
      --train.max_steps "$STEPS" --train.threads "$THREADS" --gossip.mode "$mode" \
      --log.metrics "$TMP/$p-$mode.jsonl" --log.progress false "${EXTRA[@]}" >>"$OUT.txt" 2>&1 ||
      { echo "scaling: $p rank(s), $mode failed: $(tail -2 "$OUT.txt")" >&2; exit 1; }
  done
done
# The one-rank compute per step, measured in the same session, drives the simulator.
python3 - "$TMP" "$WARM" <<'PY' >"$TMP/compute.txt"
import glob, json, statistics, sys
f = glob.glob(sys.argv[1] + "/1-allreduce.jsonl")
steps = [json.loads(l) for l in open(f[0]) if '"event":"step"' in l][int(sys.argv[2]):]
print(statistics.median(s["step_s"] for s in steps) * 1e3)
PY
STEP1_MS=$(cat "$TMP/compute.txt")
for p in "${RANKS[@]}"; do
  [ "$p" -eq 1 ] && continue
  # Forward:backward as 1:2 of the measured one-rank step (the simulator's overlap window).
  "$BIN" simulate --config "$CONFIG" --ranks "$p" --json --train.threads "$THREADS" \
    --simulate.forward_ms "$(python3 -c "print($STEP1_MS/3)")" \
    --simulate.backward_ms "$(python3 -c "print($STEP1_MS*2/3)")" --simulate.update_ms 0 \
    "${EXTRA[@]}" >"$TMP/sim-$p.json"
done
python3 - "$TMP" "$WARM" "${RANKS[@]}" <<'PY' >>"$OUT.csv"
import json, os, statistics, sys
tmp, warm, ranks = sys.argv[1], int(sys.argv[2]), [int(r) for r in sys.argv[3:]]
def load(p, mode):
    path = f"{tmp}/{p}-{mode}.jsonl"
    if not os.path.exists(path):
        return None
    ev = [json.loads(l) for l in open(path)]
    steps = [e for e in ev if e["event"] == "step"][warm:]
    med = statistics.median(s["step_s"] for s in steps)
    total = sum(s["step_s"] for s in steps)
    return dict(step=med, ips=statistics.median(s["images_per_s"] for s in steps),
                comm=sum(s["comm_s"] for s in steps) / total,
                wait=sum(s["data_wait_s"] for s in steps) / total)
one = load(1, "allreduce")
for p in ranks:
    for mode in ("both", "allreduce"):
        r = load(p, mode)
        if r is None:
            continue
        eff = r["ips"] / (p * one["ips"]) if one else float("nan")
        pred = err = ""
        if p > 1:
            sim = json.load(open(f"{tmp}/sim-{p}.json"))["rows"][0]
            s = sim["gossip" if mode == "both" else "rabenseifner_allreduce"]["step_s"]
            pred, err = f"{s:.6g}", f"{(s - r['step']) / r['step']:.4f}"
        print(f"{p},{'gossip' if mode == 'both' else mode},{r['step']:.6g},{r['ips']:.6g},"
              f"{eff:.4f},{r['comm']:.4f},{r['wait']:.4f},{pred},{err}")
PY
python3 - "$OUT.csv" <<'PY' >"$OUT.md"
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
print("| ranks | mode | median step ms | images/s | efficiency | exposed comm | data wait | simulated step ms | simulator error |")
print("|---|---|---|---|---|---|---|---|---|")
for r in rows:
    pred = f"{float(r['predicted_step_s']) * 1e3:.2f}" if r["predicted_step_s"] else "-"
    err = f"{float(r['prediction_error']) * 100:+.1f}%" if r["prediction_error"] else "-"
    print(f"| {r['ranks']} | {r['mode']} | {float(r['median_step_s']) * 1e3:.2f} | "
          f"{float(r['images_per_s']):.0f} | {float(r['efficiency']) * 100:.1f}% | "
          f"{float(r['exposed_comm_share']) * 100:.1f}% | {float(r['data_wait_share']) * 100:.1f}% | {pred} | {err} |")
PY
gnuplot <<GP
set terminal pngcairo size 900,600 noenhanced
set output "$OUT.png"
set datafile separator ","
set key top left
set xlabel "ranks"
set ylabel "images/s"
set title "weak scaling, $(basename "$CONFIG") ($(hostname))"
plot "< grep ',gossip,' $OUT.csv" using 1:4 with linespoints title "gossip", \
     "< grep ',allreduce,' $OUT.csv" using 1:4 with linespoints title "allreduce"
GP
cat "$OUT.md"
echo "bench/scaling: wrote $OUT.csv, $OUT.md, $OUT.png"
