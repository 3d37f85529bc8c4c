#!/usr/bin/env bash
# bench/apoptosis: neuron apoptosis on Fashion-MNIST, with and without, side by side. For each
# rank count P (1, and gossip at 2) it trains the same model twice with the same seed and data
# order, once plain and once with --apoptosis.enable true, and reads the metrics: final top-1,
# parameter count (start and end), training time (steps plus rebuilds, evaluation excluded) and
# the time to reach the target top-1 = the plain run's final top-1 minus 0.5 points, at
# epoch-end evaluations. Writes bench/results/apoptosis-<host>.csv, .md, .txt and .png (gnuplot:
# top-1 and parameter count over training time).
# Usage: bench/apoptosis/run.sh [CONFIG]   (default configs/laptop.ini)
# Also the CPU seconds of each run (user + system of every rank, evaluation included): on a
# machine shared with other jobs, wall times swing by several times between identical runs
# while CPU time stays put, so both are reported. OpenMP threads sleep instead of spinning
# (OMP_WAIT_POLICY=passive) in both variants, so that CPU time is compute.
# Environment: MODEL (cnn), WIDTH (16), EPOCHS (2), APOP_EPOCHS (epochs of the apoptosis runs,
# default EPOCHS), RANKS ("1 2"), REPEAT (1: pairs per rank count, interleaved), DECISIONS (4:
# decisions every ~1/9 epoch from the start, then the shrunk model trains on), APOP (apoptosis
# options; default threshold 0.95, max_share 0.2, both layer kinds), EXTRA (more train options),
# BIN (a built gossipgrad Release binary; default: build one in build/), TAG (suffix of the
# result files).
set -euo pipefail
cd "$(dirname "$0")/../.."
CONFIG=${1:-configs/laptop.ini}
MODEL=${MODEL:-cnn}
WIDTH=${WIDTH:-16}
EPOCHS=${EPOCHS:-2}
APOP_EPOCHS=${APOP_EPOCHS:-$EPOCHS}
DECISIONS=${DECISIONS:-4}
REPEAT=${REPEAT:-1}
read -r -a RANKS <<<"${RANKS:-1 2}"
. scripts/checks.sh
gg_int WIDTH "$WIDTH" 1 1024
gg_int EPOCHS "$EPOCHS" 1 100000
gg_int APOP_EPOCHS "$APOP_EPOCHS" 1 100000
gg_int DECISIONS "$DECISIONS" 1
gg_int REPEAT "$REPEAT" 1
gg_ints RANKS 1 4096 "${RANKS[@]}"
read -r -a APOP <<<"${APOP:---apoptosis.threshold 0.95 --apoptosis.max_share 0.2 --apoptosis.min_keep 4 --apoptosis.layers both}"
read -r -a EXTRA <<<"${EXTRA:-}"
[ -f "$CONFIG" ] || { echo "bench/apoptosis: config '$CONFIG' is not a file (usage: bench/apoptosis/run.sh [CONFIG])" >&2; exit 2; }
./scripts/deps.sh
command -v gnuplot >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends gnuplot-nox >/dev/null; }
if [ -z "${BIN:-}" ]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF >/dev/null
  cmake --build build --target gossipgrad >/dev/null
  BIN=$PWD/build/gossip/gossipgrad
fi
common_args() { # the train options of both variants, one per line
  printf '%s\n' --config "$CONFIG" --model.name "$MODEL" --model.width "$WIDTH" --log.progress false \
    "${EXTRA[@]}"
}
dry_run() { # p options... -> the dry run's settings at p ranks; a refusal: one line, exit 2
  local p=$1 out
  shift
  out=$(PMI_SIZE=$p "$BIN" train "$@" --dry-run 2>&1) || {
    echo "bench/apoptosis: $p rank(s): $(gg_refusal "$out")" >&2
    exit 2
  }
  echo "$out"
}
# Every rank count's runs checked before any runs: the batch they train with (the dry run of
# their options: 64 was assumed whatever CONFIG or EXTRA said), an epoch long enough for a
# decision every ~1/9 of it (at fewer than 9 steps apoptosis.interval was 0, refused by the
# apoptosis run after the plain one had run), and the apoptosis run's own dry run (APOP).
declare -A INTERVAL APOP_UNTIL
for p in "${RANKS[@]}"; do
  mapfile -t args < <(common_args)
  batch=$(dry_run "$p" "${args[@]}" --train.epochs "$EPOCHS" | awk -F' = ' '/^batch = /{print $2; exit}') || exit 2
  spe=$(((60000 + batch * p - 1) / (batch * p)))  # Fashion-MNIST's 60,000 samples
  ((spe >= 9)) || {
    echo "bench/apoptosis: at $p rank(s) of batch $batch an epoch has $spe step(s): too few for a decision every 1/9 epoch (9 needed)" >&2
    exit 2
  }
  INTERVAL[$p]=$((spe / 9))
  APOP_UNTIL[$p]=$(python3 -c "print(min(1.0, ($DECISIONS * ${INTERVAL[$p]} + 1) / ($spe * $APOP_EPOCHS)))")
  dry_run "$p" "${args[@]}" --train.epochs "$APOP_EPOCHS" --apoptosis.enable true \
    --apoptosis.interval "${INTERVAL[$p]}" --apoptosis.until "${APOP_UNTIL[$p]}" "${APOP[@]}" >/dev/null
done
OUT=bench/results/apoptosis-$(hostname)${TAG:+-$TAG}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
{
  echo "# $(date -u +%FT%TZ) $(uname -srm), $(nproc) cores: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
  echo "# config $CONFIG, model $MODEL width $WIDTH, $EPOCHS epochs (apoptosis runs $APOP_EPOCHS), repeat $REPEAT, $DECISIONS decisions, apoptosis: ${APOP[*]}, extra: ${EXTRA[*]:-none}"
  echo "# $(mpirun --version 2>&1 | head -1); oneDNN $(dpkg-query -W -f '${Version}' libdnnl-dev 2>/dev/null || echo '?')"
} >"$OUT.txt"
for p in "${RANKS[@]}"; do
  for r in $(seq 1 "$REPEAT"); do
    for variant in plain apoptosis; do
      echo "apoptosis bench: $p rank(s), $variant, run $r" >&2
      args=(--train.epochs "$EPOCHS")
      if [ "$variant" = apoptosis ]; then
        args=(--train.epochs "$APOP_EPOCHS" --apoptosis.enable true --apoptosis.interval "${INTERVAL[$p]}"
              --apoptosis.until "${APOP_UNTIL[$p]}" "${APOP[@]}")
      fi
      # All cores shared by the ranks (train.threads 0), the same for both variants.
      OMP_WAIT_POLICY=passive OMP_NUM_THREADS=$(($(nproc) / p > 0 ? $(nproc) / p : 1)) \
        /usr/bin/time -f "%U %S" -o "$TMP/$p-$variant-$r.cpu" mpirun -n "$p" "$BIN" train \
        --config "$CONFIG" --model.name "$MODEL" --model.width "$WIDTH" \
        --log.metrics "$TMP/$p-$variant-$r.jsonl" --log.progress false "${args[@]}" "${EXTRA[@]}" \
        >>"$OUT.txt" 2>&1 || { echo "bench/apoptosis: $p rank(s), $variant, run $r failed: $(tail -1 "$OUT.txt")" >&2; exit 1; }
    done
  done
done
python3 - "$TMP" "$REPEAT" "${RANKS[@]}" <<'PY' >"$OUT.csv"
import json, statistics, sys
tmp, repeat, ranks = sys.argv[1], int(sys.argv[2]), [int(r) for r in sys.argv[3:]]

def load(p, variant, r):
    ev = [json.loads(l) for l in open(f"{tmp}/{p}-{variant}-{r}.jsonl")]
    steps = {e["step"]: e["step_s"] for e in ev if e["event"] == "step"}
    rebuilds = [(e["step"], e["rebuild_s"]) for e in ev if e["event"] == "apoptosis"]
    start = next(e for e in ev if e["event"] == "start")
    summary = next(e for e in ev if e["event"] == "summary")
    def train_s(upto):  # training time of the first `upto` steps, rebuilds included
        return (sum(t for s, t in steps.items() if s < upto) +
                sum(t for s, t in rebuilds if s <= upto))
    evals = [(e["epoch"], e["step"], e["top1"], train_s(e["step"]))
             for e in ev if e["event"] == "eval"]
    params = [(0, start["params"])] + [(train_s(e["step"]), e["params"])
                                        for e in ev if e["event"] == "apoptosis"]
    cpu = sum(float(v) for v in open(f"{tmp}/{p}-{variant}-{r}.cpu").read().split()[-2:])
    return dict(params0=start["params"], params=summary["params"], top1=summary["top1"], cpu=cpu,
                train_s=train_s(10**12), ips=summary["images_per_s"], evals=evals,
                param_curve=params)

print("ranks,variant,run,params_start,params_final,top1_final,train_s,images_per_s,cpu_s,"
      "target_top1,time_to_target_s,epoch_at_target")
for p in ranks:
    for r in range(1, repeat + 1):
        plain = load(p, "plain", r)
        target = plain["top1"] - 0.005
        for variant in ("plain", "apoptosis"):
            d = plain if variant == "plain" else load(p, variant, r)
            hit = next(((ep, t) for ep, _, top1, t in d["evals"] if top1 >= target), None)
            print(f"{p},{variant},{r},{d['params0']},{d['params']},{d['top1']:.4f},"
                  f"{d['train_s']:.2f},{d['ips']:.1f},{d['cpu']:.1f},{target:.4f},"
                  f"{hit[1] if hit else float('nan'):.2f},{hit[0] if hit else ''}")
            with open(f"{tmp}/curve-{p}-{variant}-{r}.dat", "w") as f:
                for ep, _, top1, t in d["evals"]:
                    f.write(f"{t} {100 * top1}\n")
            with open(f"{tmp}/params-{p}-{variant}-{r}.dat", "w") as f:
                for t, n in d["param_curve"] + [(d["train_s"], d["params"])]:
                    f.write(f"{t} {n}\n")
PY
python3 - "$OUT.csv" <<'PY' >"$OUT.md"
import csv, math, sys
rows = list(csv.DictReader(open(sys.argv[1])))
print("| ranks | variant | run | params | top-1 | training s | images/s | CPU s, whole run | time to target s (epoch) |")
print("|---|---|---|---|---|---|---|---|---|")
for r in rows:
    t = float(r["time_to_target_s"])
    tt = f"{t:.1f} ({r['epoch_at_target']})" if not math.isnan(t) else "not reached"
    print(f"| {r['ranks']} | {r['variant']} | {r['run']} | {int(r['params_start']):,} -> "
          f"{int(r['params_final']):,} | {100 * float(r['top1_final']):.2f}% | "
          f"{float(r['train_s']):.1f} | {float(r['images_per_s']):.0f} | {float(r['cpu_s']):.1f} | "
          f"{tt} |")
print()
print("| ranks | run | parameters fewer | top-1 difference | speed-up to target (wall) | speed-up, whole run (wall) | CPU time, whole run |")
print("|---|---|---|---|---|---|---|")
for a, b in zip(rows[0::2], rows[1::2]):
    ta, tb = float(a["time_to_target_s"]), float(b["time_to_target_s"])
    speed = f"{ta / tb:.2f}x" if not math.isnan(tb) else "not reached"
    print(f"| {a['ranks']} | {a['run']} | {int(a['params_final']) / int(b['params_final']):.2f}x | "
          f"{100 * (float(b['top1_final']) - float(a['top1_final'])):+.2f} points | {speed} | "
          f"{float(a['train_s']) / float(b['train_s']):.2f}x | "
          f"{float(a['cpu_s']) / float(b['cpu_s']):.2f}x less |")
PY
plots=() pplots=()
for p in "${RANKS[@]}"; do
  for variant in plain apoptosis; do
    plots+=("\"$TMP/curve-$p-$variant-1.dat\" using 1:2 with linespoints title \"$p rank(s), $variant\"")
    pplots+=("\"$TMP/params-$p-$variant-1.dat\" using 1:2 with steps title \"$p rank(s), $variant\"")
  done
done
gnuplot <<GP
set terminal pngcairo size 1200,500 noenhanced
set output "$OUT.png"
set multiplot layout 1,2 title "apoptosis, $MODEL width $WIDTH on Fashion-MNIST ($(hostname))"
set key bottom right
set xlabel "training time, s"
set ylabel "test top-1, %"
plot $(IFS=,; echo "${plots[*]}")
set key top right
set ylabel "parameters"
set logscale y
plot $(IFS=,; echo "${pplots[*]}")
unset multiplot
GP
cat "$OUT.md"
echo "bench/apoptosis: wrote $OUT.csv, $OUT.md, $OUT.txt, $OUT.png"
