#!/usr/bin/env bash
# bench/scale: does gossip keep accuracy at scale? Top-1 against the rank count p on Fashion-MNIST
# (resnet8), each p run on VIRTUAL ranks (train.virtual_ranks: p logical ranks in one process,
# each with its own weights, momentum, statistics and shard, mixing exactly as p real ranks would;
# tests/gossip/cli/virtual_ranks.sh checks them bit for bit against mpirun at p = 4).
# Recipe: weak scaling, a fixed per-rank batch (BATCH, default 8: at p = 256 the global batch is
# 2048, 29 steps per epoch of the 60,000 images), the learning rate scaled linearly from
# configs/laptop.ini's 0.2 per 256 samples, warm-up over the first half epoch, cosine decay; the
# same EPOCHS at every p, so every run trains on the same number of samples, unless MIN_STEPS
# raises a p's epochs until it takes at least that many steps (at large p the global batch is so
# large that EPOCHS leave too few steps for any mode, allreduce included).
# Writes bench/results/scale-<NAME>.{csv,md,png}: per run the final top-1 of the ranks' average
# model, each rank's own top-1 (min / median / max over the ranks, on RANK_EVAL test samples), the
# consensus distance at the end, the wall time, and the bytes each rank sends per step beside a
# ring allreduce's 2 (p - 1) / p x the model.
# Usage: bench/scale/run.sh [P...]   (default 8 16 32 64 128 256)
# Environment: GG_BIN (a gossipgrad built from this checkout; default: build it in build/), NAME
# (default the host name), EPOCHS (default 2), MIN_STEPS (default 0: EPOCHS at every p), BATCH
# (8), SEEDS (default "1";
# "1 2" for two seeds), RANK_EVAL (500), EXTRA (more train options), MODES, a subset of:
#   allreduce     exact average of the gradients (the baseline)
#   both          gradients and weights with the partner (the default mode)
#   model         weights after the update (D-PSGD)
#   model-bf16    model with the bf16 wire and error feedback
#   model-int8, model-int4  model with the int8 / int4 wire and error feedback (0.13x / 0.07x a
#                 ring's bytes)
#   gossipgrad    weights and momentum after the update (the authors' GossipGraD)
#   gossipgrad-bf16  gossipgrad with the bf16 wire and error feedback (half a ring's bytes;
#                 gossipgrad-int8, -int4 likewise)
#   grad          gradients only (the abstract's reading)
#   *-global<H>   any of the above with an exact global average every H steps, e.g.
#                 gossipgrad-global50 (Gossip-PGA)
#   *-choco       a mode with a lossy wire sent as the difference to CHOCO-SGD's public copies
#                 (gossip.choco, no error feedback; the dissemination schedule without rotation,
#                 as choco needs), e.g. model-int4-choco, model-int4-choco-nooverlap
#   *-lowrank<R>  model or gossipgrad with low-rank gossip of rank R (gossip.low_rank R,
#                 PowerGossip: the hypercube's pairs without rotation, as it needs; fp32
#                 factors), e.g. model-lowrank1, model-lowrank4-nooverlap
#   *-sr          an int8 / int4 mode with stochastic rounding (gossip.rounding stochastic),
#                 e.g. model-int4-choco-sr-nooverlap
#   *-ring        the ring schedule without rotation (before -nooverlap, after the rest), e.g.
#                 model-int4-choco-sr-ring-nooverlap
#   *-pushsum     push-sum (gossip.rule push-sum, SGP's rule; before -exp2), e.g.
#                 model-pushsum-exp2-nooverlap
#   *-exp2        the two-peer exponential graph (gossip.schedule exponential2, rotated; before
#                 -nooverlap, which it needs for the weights), e.g. model-exp2-nooverlap
#   *-nooverlap   a mode that exchanges weights, with gossip.overlap_model false (the weights
#                 mixed before the next forward, not behind it), e.g. gossipgrad-nooverlap
#   *-cc<B>       any gossip mode with consensus control, gossip.consensus_bound B (a global
#                 average when the ranks' relative distance estimate exceeds B), e.g.
#                 model-bf16-cc1e-4
# (default: allreduce both model-bf16 gossipgrad). A mode it does not know, a suffix that would
# change nothing for its mode (model-choco without a lossy wire, allreduce-global50,
# grad-nooverlap), a p and BATCH with no step per epoch, or a point the run would refuse (the dry
# run: model-lowrank1 at p = 6) ends it in one line, exit 2, before anything runs.
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/checks.sh
PS=("${@:-8 16 32 64 128 256}")
read -r -a PS <<<"${PS[*]}"
EPOCHS=${EPOCHS:-2}
BATCH=${BATCH:-8}
MIN_STEPS=${MIN_STEPS:-0}
RANK_EVAL=${RANK_EVAL:-500}
NAME=${NAME:-$(hostname)}
read -r -a SEEDS <<<"${SEEDS:-1}"
read -r -a MODES <<<"${MODES:-allreduce both model-bf16 gossipgrad}"
read -r -a EXTRA <<<"${EXTRA:-}"
gg_name NAME "$NAME"
gg_int EPOCHS "$EPOCHS" 1 1000
gg_int BATCH "$BATCH" 1 4096
gg_int MIN_STEPS "$MIN_STEPS" 0 1000000
gg_int RANK_EVAL "$RANK_EVAL" 0 10000
gg_ints P 2 4096 "${PS[@]}"
gg_ints SEEDS 0 1000000 "${SEEDS[@]}"
options_of() { # mode -> its train options; a name that would run something else: one line, exit 2
  local mode=$1 global="" bound="" nooverlap="" sched="" lowrank="" choco=""
  refuse() { echo "bench/scale: mode '$1': $2" >&2; exit 2; }
  if [[ $mode =~ ^(.*)-cc([0-9.]+(e-?[0-9]+)?)$ ]]; then mode=${BASH_REMATCH[1]}; bound=${BASH_REMATCH[2]}; fi
  if [[ $mode =~ ^(.*)-global([0-9]+)$ ]]; then mode=${BASH_REMATCH[1]}; global=${BASH_REMATCH[2]}; fi
  if [[ $mode =~ ^(.*)-nooverlap$ ]]; then mode=${BASH_REMATCH[1]}; nooverlap=1; echo "--gossip.overlap_model false"; fi
  local fixed=""  # choco and the ring: the same partners again, no rotation
  if [[ $mode =~ ^(.*)-ring$ ]]; then mode=${BASH_REMATCH[1]}; fixed=1; sched=-ring; echo "--gossip.schedule ring"; fi
  if [[ $mode =~ ^(.*)-exp2$ ]]; then mode=${BASH_REMATCH[1]}; sched=-exp2; echo "--gossip.schedule exponential2"; fi
  if [[ $mode =~ ^(.*)-pushsum$ ]]; then mode=${BASH_REMATCH[1]}; sched=$sched-pushsum; echo "--gossip.rule push-sum"; fi
  if [[ $mode =~ ^(.*-int[48].*)-sr$ ]]; then mode=${BASH_REMATCH[1]}; echo "--gossip.rounding stochastic"; fi
  if [[ $mode =~ ^(model|gossipgrad)-lowrank([0-9]+)$ ]]; then
    mode=${BASH_REMATCH[1]}; lowrank=1
    echo "--gossip.low_rank ${BASH_REMATCH[2]} --gossip.schedule hypercube --gossip.rotate false"
  fi
  local feedback="--gossip.error_feedback true"
  if [[ $mode =~ ^(.*)-choco$ ]]; then mode=${BASH_REMATCH[1]}; fixed=1; choco=1; feedback="--gossip.choco true"; fi
  [ -z "$fixed" ] || echo "--gossip.rotate false"
  # Suffixes that would run a mode as another one under this name (issue 52: model-choco ran
  # plain model): refused.
  [ -z "$sched" ] || [ -z "$lowrank" ] ||
    refuse "$1" "low-rank gossip is a rule of its own on the hypercube's pairs: drop $sched"
  case $mode in
    allreduce | grad)
      [ -z "$choco$nooverlap" ] ||
        refuse "$1" "-choco and -nooverlap act on the weights' gossip, which $mode has not"
      [ "$mode" != allreduce ] || [ -z "$global$bound$sched" ] ||
        refuse "$1" "allreduce averages exactly at every step: -global, -cc, -ring, -exp2 and -pushsum would change nothing"
      echo "--gossip.mode $mode" ;;
    both | model | gossipgrad)
      [ -z "$choco" ] ||
        refuse "$1" "-choco sends a lossy wire's difference to the public copies: name the wire first, e.g. model-int4-choco"
      echo "--gossip.mode $mode" ;;
    model-bf16 | model-int8 | model-int4 | gossipgrad-bf16 | gossipgrad-int8 | gossipgrad-int4)
      echo "--gossip.mode ${mode%-*} --gossip.model_wire ${mode##*-} $feedback" ;;
    *) refuse "$1" "unknown (see the usage at the top of $0)" ;;
  esac
  [ -z "$global" ] || echo "--gossip.global_every $global"
  [ -z "$bound" ] || echo "--gossip.consensus_bound $bound"
}
for m in "${MODES[@]}"; do options_of "$m" >/dev/null; done
# Steps per epoch at each p: Fashion-MNIST's 60,000 training images over p x BATCH (none: the
# epoch loop below would never end).
for p in "${PS[@]}"; do
  if ((60000 / (p * BATCH) < 1)); then
    echo "bench/scale: BATCH = $BATCH at p = $p leaves no step in an epoch (60000 images / (p x BATCH) = 0): lower BATCH or p" >&2
    exit 2
  fi
done
if [ -n "${GG_BIN:-}" ] && [ ! -x "$GG_BIN" ]; then
  echo "bench/scale: GG_BIN = $GG_BIN is not an executable" >&2
  exit 2
fi
# GG_BIN: a gossipgrad already built (of this checkout: it must accept configs/laptop.ini).
BIN=${GG_BIN:-}
if [ -z "$BIN" ]; then
  ./scripts/deps.sh
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF >/dev/null
  cmake --build build --target gossipgrad >/dev/null
  BIN=build/gossip/gossipgrad
fi
[ -x "$BIN" ] || { echo "bench/scale: GG_BIN = $BIN is not an executable" >&2; exit 2; }
epochs_at() { # p -> the epochs of that p's runs
  local per_epoch=$((60000 / ($1 * BATCH))) epochs=$EPOCHS
  while ((epochs * per_epoch < MIN_STEPS)); do epochs=$((epochs + 1)); done
  echo "$epochs"
}
train_args() { # p mode seed -> the run's train options, one per line
  printf '%s\n' train --config configs/laptop.ini --train.virtual_ranks "$1" --train.batch "$BATCH" \
    --train.epochs "$(epochs_at "$1")" --train.seed "$3" --train.rank_eval_samples "$RANK_EVAL" \
    --gossip.consensus_every 0 --log.progress false
  options_of "$2" | tr ' ' '\n' | sed '/^$/d'
  ((${#EXTRA[@]} == 0)) || printf '%s\n' "${EXTRA[@]}"
}
# Every point's verdict before any runs (the dry run refuses what the run would: a schedule that
# needs another p, a setting the mode does not honour): one line, exit 2, nothing made.
for p in "${PS[@]}"; do
  for mode in "${MODES[@]}"; do
    mapfile -t args < <(train_args "$p" "$mode" "${SEEDS[0]}")
    if ! err=$("$BIN" "${args[@]}" --dry-run 2>&1 >/dev/null); then
      echo "bench/scale: p = $p, mode $mode: $(gg_refusal "$err")" >&2
      exit 2
    fi
  done
done
OUT=bench/results/scale-$NAME
RUNS=$OUT.runs
# One runs folder, one recipe: the table pairs every run in it by p, mode and seed, and a run's
# name carries none of these (an invocation at another BATCH replaced some runs and kept the
# others: allreduce at BATCH 8 beside model at 16). The first invocation writes settings.txt.
SETTINGS="EPOCHS=$EPOCHS MIN_STEPS=$MIN_STEPS BATCH=$BATCH RANK_EVAL=$RANK_EVAL EXTRA='${EXTRA[*]}'"
if [ -f "$RUNS/settings.txt" ] && [ "$(cat "$RUNS/settings.txt")" != "$SETTINGS" ]; then
  echo "bench/scale: $RUNS holds runs of $(cat "$RUNS/settings.txt"), not $SETTINGS: use another NAME" >&2
  exit 2
fi
mkdir -p "$RUNS"
[ -f "$RUNS/settings.txt" ] || echo "$SETTINGS" >"$RUNS/settings.txt"
command -v gnuplot >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends gnuplot-nox >/dev/null; }
# Every invocation's command, for the table (several invocations fill one runs folder).
echo "${ONEDNN_MAX_CPU_ISA:+ONEDNN_MAX_CPU_ISA=$ONEDNN_MAX_CPU_ISA }${GG_BIN:+GG_BIN=$GG_BIN }bench/scale/run.sh ${PS[*]} (EPOCHS=$EPOCHS$( ((MIN_STEPS == 0)) || echo " MIN_STEPS=$MIN_STEPS") BATCH=$BATCH SEEDS='${SEEDS[*]}' MODES='${MODES[*]}' RANK_EVAL=$RANK_EVAL${EXTRA:+ EXTRA='${EXTRA[*]}'})" >>"$RUNS/commands.txt"
total=$((${#PS[@]} * ${#MODES[@]} * ${#SEEDS[@]})); n=0
for seed in "${SEEDS[@]}"; do
  for p in "${PS[@]}"; do
    for mode in "${MODES[@]}"; do
      n=$((n + 1)); run="p$p-$mode-s$seed"
      mapfile -t args < <(train_args "$p" "$mode" "$seed")
      echo "bench/scale: [$n/$total] $run" >&2
      start=$(date +%s)
      "$BIN" "${args[@]}" --log.metrics "$RUNS/$run.jsonl" --log.overwrite true \
        >"$RUNS/$run.log" 2>&1 || { echo "bench/scale: $run failed: $(tail -2 "$RUNS/$run.log")" >&2; exit 1; }
      echo "  $(grep '^done' "$RUNS/$run.log" | cut -c1-150) ($(($(date +%s) - start)) s)" >&2
    done
  done
done
cpu="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs) (family $(grep -m1 'cpu family' /proc/cpuinfo | cut -d: -f2 | xargs) model $(grep -m1 '^model' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores, $(grep -qw avx512f /proc/cpuinfo && echo AVX-512 || echo 'AVX2, no AVX-512')${ONEDNN_MAX_CPU_ISA:+; oneDNN capped to $ONEDNN_MAX_CPU_ISA})"
python3 bench/scale/table.py "$RUNS" "$OUT" "$cpu"
echo "bench/scale: $OUT.md, $OUT.csv, $OUT.png" >&2
