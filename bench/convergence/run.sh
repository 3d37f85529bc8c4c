#!/usr/bin/env bash
# bench/convergence: Fashion-MNIST accuracy of gossip against allreduce at the same
# hyper-parameters and epochs: one rank; then for each rank count allreduce, gossip both, grad,
# model, both without rotation, and both with the distributed shuffle. Writes
# bench/results/convergence-<host>.{csv,md} (final top-1 per run, gap to allreduce) and two PNG
# plots per rank count (top-1 against epoch and against wall time), from the runs' metrics.
# Usage: bench/convergence/run.sh [RANKS...]   (default 2 4 8)
# Environment: EPOCHS (default 12), EXTRA (more train options, e.g. "--model.width 8"), GG_BIN
# (a gossipgrad built from this checkout; default: build it in build/), NAME (the results' name,
# default the host name),
# VARIANTS (a subset of: single allreduce both grad model both-norotate both-shuffle, and the lean
# ones of issue 17: grad-bf16 model-bf16 both-bf16 (bf16 wire with error feedback), grad-stale
# (staleness 1, guard.lag 1), grad-hier (gossip.hierarchy node over simulated nodes of 2 ranks,
# GG_RANKS_PER_NODE=2), both-every4 (the weights every 4th step: gossip.model_every 4),
# both-every4-bf16 (the same with both bf16 wires), model-int8 and model-int4 (the weights on the
# int8 / int4 wire with error feedback), model-int8-choco and model-int4-choco (the same wires
# carrying the difference to CHOCO's public copies: gossip.choco, no rotation; model-int8-choco-sr
# and model-int4-choco-sr with stochastic rounding, gossip.rounding stochastic), model-lowrank1 and
# model-lowrank4 (low-rank gossip of rank 1 / 4, PowerGossip: gossip.low_rank, fp32 factors, the
# hypercube without rotation), grad-global (grad with an exact average of
# the weights every 50 steps), grad-skip (staleness 1, late buckets skipped, guard.lag 1)).
# Default: all but the lean ones. A variant it does not know, or one whose run would be refused at
# a rank count (the dry run at that count, PMI_SIZE; a gossip variant at 1 rank, grad-hier at an
# odd count), ends it in one line before anything runs;
# the first run that fails ends it with exit 1.
set -euo pipefail
cd "$(dirname "$0")/../.."
RANKS=("${@:-2 4 8}")
read -r -a RANKS <<<"${RANKS[*]}"
EPOCHS=${EPOCHS:-12}
. scripts/checks.sh
gg_int EPOCHS "$EPOCHS" 1 100000
gg_ints RANKS 1 4096 "${RANKS[@]}"
NAME=${NAME:-$(hostname)}
gg_name NAME "$NAME"
KNOWN=(single allreduce both grad model both-norotate both-shuffle grad-bf16 model-bf16 both-bf16
  model-int8 model-int4 model-int8-choco model-int4-choco model-int8-choco-sr model-int4-choco-sr
  model-lowrank1 model-lowrank4 grad-stale both-every4 both-every4-bf16 grad-global grad-skip grad-hier)
read -r -a VARIANTS <<<"${VARIANTS:-single allreduce both grad model both-norotate both-shuffle}"
((${#VARIANTS[@]})) || { echo "bench/convergence: VARIANTS is empty: name some of: ${KNOWN[*]}" >&2; exit 2; }
for v in "${VARIANTS[@]}"; do
  [[ " ${KNOWN[*]} " == *" $v "* ]] ||
    { echo "bench/convergence: VARIANTS: unknown variant '$v'; known: ${KNOWN[*]}" >&2; exit 2; }
done
if [ -n "${GG_BIN:-}" ] && [ ! -x "$GG_BIN" ]; then
  echo "bench/convergence: GG_BIN=$GG_BIN is not an executable" >&2
  exit 2
fi
read -r -a EXTRA <<<"${EXTRA:-}"
./scripts/deps.sh
# GG_BIN: a gossipgrad already built from this checkout (default: build it in build/).
BIN=${GG_BIN:-}
if [ -z "$BIN" ]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF >/dev/null
  cmake --build build --target gossipgrad >/dev/null
  BIN=build/gossip/gossipgrad
fi
OUT=bench/results/convergence-$NAME
RUNS=$OUT.runs
# PHASE check: every run's verdict from the dry run at its rank count (PMI_SIZE), before any
# runs; PHASE run: the runs, the first that fails ends the script with its line (exit 1).
PHASE=check
run() { # name ranks options...
  local name=$1 p=$2
  shift 2
  if [ "$PHASE" = check ]; then
    local err
    # What the dry run cannot see: one rank has no partner (p1-gossip-both ran as a single rank
    # under its gossip name), and grad-hier's simulated nodes of 2 need an even p (at p = 3 the
    # run failed on its uneven nodes after the folder was made).
    if [ "$p" = 1 ] && [ "$name" != p1-single ]; then
      echo "convergence: $name: one rank has no partner, it would run as 'single' under this name: give RANKS of at least 2" >&2
      exit 2
    fi
    if [[ $name == *-grad-hier ]] && ((p % 2)); then
      echo "convergence: $name: grad-hier simulates nodes of 2 ranks (GG_RANKS_PER_NODE=2): give an even rank count" >&2
      exit 2
    fi
    if ! err=$(env PMI_SIZE="$p" ${RUN_ENV:-} "$BIN" train --config configs/laptop.ini \
      --train.epochs "$EPOCHS" --log.progress false "${EXTRA[@]}" "$@" --dry-run 2>&1 >/dev/null); then
      echo "convergence: $name ($p ranks): $(gg_refusal "$err")" >&2
      exit 2
    fi
    return 0
  fi
  echo "convergence: $name ($p ranks)" >&2
  local over=()
  [ "$p" -le "$(nproc)" ] && over=(-bind-to core)
  OMP_NUM_THREADS=1 ${RUN_ENV:-} mpirun -n "$p" "${over[@]}" "$BIN" train --config configs/laptop.ini \
    --train.epochs "$EPOCHS" --log.metrics "$RUNS/$name.jsonl" --log.overwrite true \
    --log.progress false "${EXTRA[@]}" "$@" >"$RUNS/$name.log" 2>&1 ||
    { echo "convergence: $name failed: $(tail -2 "$RUNS/$name.log")" >&2; exit 1; }
}
want() { [[ " ${VARIANTS[*]} " == *" $1 "* ]]; }
all_runs() {
if want single; then run "p1-single" 1 --gossip.mode allreduce; fi
for p in "${RANKS[@]}"; do
  if want allreduce; then run "p$p-allreduce" "$p" --gossip.mode allreduce; fi
  if want both; then run "p$p-gossip-both" "$p" --gossip.mode both; fi
  if want grad; then run "p$p-gossip-grad" "$p" --gossip.mode grad; fi
  if want model; then run "p$p-gossip-model" "$p" --gossip.mode model; fi
  if want both-norotate; then run "p$p-gossip-both-norotate" "$p" --gossip.mode both --gossip.rotate false; fi
  if want both-shuffle; then run "p$p-gossip-both-shuffle" "$p" --gossip.mode both --data.shuffle ids; fi
  # Each wire only where the mode sends that buffer (another is refused: it would do nothing).
  bf16=(--gossip.wire bf16 --gossip.model_wire bf16 --gossip.error_feedback true)
  if want grad-bf16; then
    run "p$p-gossip-grad-bf16" "$p" --gossip.mode grad --gossip.wire bf16 --gossip.error_feedback true
  fi
  if want model-bf16; then
    run "p$p-gossip-model-bf16" "$p" --gossip.mode model --gossip.model_wire bf16 \
      --gossip.error_feedback true
  fi
  if want both-bf16; then run "p$p-gossip-both-bf16" "$p" --gossip.mode both "${bf16[@]}"; fi
  for q in int8 int4; do  # the quantized weights' wire, error feedback or CHOCO's public copies
    if want "model-$q"; then
      run "p$p-gossip-model-$q" "$p" --gossip.mode model --gossip.model_wire "$q" \
        --gossip.error_feedback true
    fi
    if want "model-$q-choco"; then
      run "p$p-gossip-model-$q-choco" "$p" --gossip.mode model --gossip.model_wire "$q" \
        --gossip.choco true --gossip.rotate false
    fi
    if want "model-$q-choco-sr"; then
      run "p$p-gossip-model-$q-choco-sr" "$p" --gossip.mode model --gossip.model_wire "$q" \
        --gossip.choco true --gossip.rotate false --gossip.rounding stochastic
    fi
  done
  for r in 1 4; do  # low-rank gossip: PowerGossip's projections of the weights' difference
    if want "model-lowrank$r"; then
      run "p$p-gossip-model-lowrank$r" "$p" --gossip.mode model --gossip.low_rank "$r" \
        --gossip.schedule hypercube --gossip.rotate false
    fi
  done
  if want grad-stale; then
    run "p$p-gossip-grad-stale" "$p" --gossip.mode grad --gossip.staleness 1 --guard.lag 1
  fi
  if want both-every4; then run "p$p-gossip-both-every4" "$p" --gossip.mode both --gossip.model_every 4; fi
  if want both-every4-bf16; then
    run "p$p-gossip-both-every4-bf16" "$p" --gossip.mode both --gossip.model_every 4 "${bf16[@]}"
  fi
  if want grad-global; then run "p$p-gossip-grad-global" "$p" --gossip.mode grad --gossip.global_every 50; fi
  if want grad-skip; then
    run "p$p-gossip-grad-skip" "$p" --gossip.mode grad --gossip.staleness 1 --gossip.late skip \
      --guard.lag 1
  fi
  if want grad-hier; then
    RUN_ENV="env GG_RANKS_PER_NODE=2" run "p$p-gossip-grad-hier" "$p" --gossip.mode grad \
      --gossip.hierarchy node
  fi
done
}
all_runs
# One runs folder, one recipe: the table sets every run in it against the allreduce run of its
# rank count, and a run's name carries no epochs (an invocation at other EPOCHS or EXTRA kept the
# earlier runs beside its own). The first invocation writes settings.txt.
SETTINGS="EPOCHS=$EPOCHS EXTRA='${EXTRA[*]}'"
if [ -f "$RUNS/settings.txt" ] && [ "$(cat "$RUNS/settings.txt")" != "$SETTINGS" ]; then
  echo "bench/convergence: $RUNS holds runs of $(cat "$RUNS/settings.txt"), not $SETTINGS: use another NAME" >&2
  exit 2
fi
command -v gnuplot >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends gnuplot-nox >/dev/null; }
PHASE=run
mkdir -p "$RUNS"
[ -f "$RUNS/settings.txt" ] || echo "$SETTINGS" >"$RUNS/settings.txt"
all_runs
python3 - "$RUNS" "$OUT" <<'PY'
import glob, json, os, sys
runs, out = sys.argv[1], sys.argv[2]
rows = []
for f in sorted(glob.glob(runs + "/*.jsonl")):
    name = os.path.basename(f)[:-6]
    ev = [json.loads(l) for l in open(f)]
    evals = [e for e in ev if e["event"] == "eval"]
    summ = [e for e in ev if e["event"] == "summary"]
    if not evals or not summ:
        continue
    p = int(name.split("-")[0][1:])
    cons = [e["consensus"] for e in ev if e["event"] == "consensus"]
    sent = [e["sent_bytes"] for e in ev if e["event"] == "step" and e.get("sent_bytes") is not None]
    rows.append(dict(name=name, ranks=p, run="-".join(name.split("-")[1:]), top1=evals[-1]["top1"],
                     wall=summ[0]["wall_s"], consensus=evals[-1].get("consensus", 0.0),
                     mean_consensus=sum(cons) / len(cons) if cons else 0.0,
                     sent=sum(sent) / len(sent) if sent else 0.0))
    # curves: epoch, top1, wall seconds at that evaluation
    t0 = None
    with open(f"{runs}/{name}.curve", "w") as c:
        for e in evals:
            c.write(f"{e['epoch']} {e['top1'] * 100:.3f} {e.get('wall_s', 0):.3f}\n")
base = {r["ranks"]: r["top1"] for r in rows if r["run"] == "allreduce"}
with open(out + ".csv", "w") as c:
    c.write("ranks,run,final_top1,gap_to_allreduce,wall_s,final_consensus,mean_consensus,"
            "sent_bytes_per_step\n")
    for r in sorted(rows, key=lambda r: (r["ranks"], r["run"])):
        # No allreduce run at this rank count in the folder: no gap (not a zero one).
        gap = f"{r['top1'] - base[r['ranks']]:.4f}" if r["ranks"] in base else ""
        c.write(f"{r['ranks']},{r['run']},{r['top1']:.4f},{gap},{r['wall']:.1f},"
                f"{r['consensus']:.4g},{r['mean_consensus']:.4g},{r['sent']:.0f}\n")
with open(out + ".md", "w") as m:
    m.write("| ranks | run | final top-1 | vs allreduce | wall s | final consensus distance | "
            "mean consensus distance | bytes sent per step and rank |\n")
    m.write("|---|---|---|---|---|---|---|---|\n")
    for r in sorted(rows, key=lambda r: (r["ranks"], r["run"])):
        gap = f"{(r['top1'] - base[r['ranks']]) * 100:+.2f}" if r["ranks"] in base else "–"
        sent = f"{r['sent'] / 1e3:.0f} kB" if r["sent"] else "-"
        m.write(f"| {r['ranks']} | {r['run']} | {r['top1'] * 100:.2f}% | {gap} | "
                f"{r['wall']:.0f} | {r['consensus']:.3g} | {r['mean_consensus']:.3g} | {sent} |\n")
PY
for p in "${RANKS[@]}"; do
  for axis in epoch wall; do
    col=1; xl="epoch"
    [ "$axis" = wall ] && { col=3; xl="wall seconds"; }
    plots=""
    for f in "$RUNS"/p"$p"-*.curve "$RUNS"/p1-single.curve; do
      [ -s "$f" ] || continue
      t=$(basename "$f" .curve)
      plots+="${plots:+, }\"$f\" using $col:2 with linespoints title \"$t\""
    done
    gnuplot <<GP
set terminal pngcairo size 900,600 noenhanced
set output "$OUT-p$p-$axis.png"
set key bottom right
set xlabel "$xl"
set ylabel "test top-1 %"
set title "Fashion-MNIST, $p ranks, gossip vs allreduce ($(hostname))"
plot $plots
GP
  done
done
cat "$OUT.md"
echo "bench/convergence: wrote $OUT.csv, $OUT.md and $OUT-p*-{epoch,wall}.png (runs in $RUNS)"
