#!/usr/bin/env bash
# bench/resilience: simulated failures on Fashion-MNIST at P ranks. One failure-free run, then for
# each recovery strategy (restart, rollback, forward) and each failure rate (random failures with
# a mean time between failures of 1/2 and 1/4 of the run's steps: fault.mtbf_steps), a run with
# the same seed, data order and failure plan (the plan depends on train.seed only, so the three
# strategies meet the same failures: with forward a failed rank is gone, so later victims may
# differ). summarize.py reads the metrics: final top-1, wall time and its overhead against the
# failure-free run, failures, steps redone and recovery seconds; it writes
# bench/results/resilience-<host>.csv, .md and .png (matplotlib, else gnuplot).
# Usage: bench/resilience/run.sh [CONFIG]   (default configs/laptop.ini)
# Wall times on a shared machine swing widely: every configuration runs REPEAT times, the rounds
# interleaved, and the table reports the median.
# Environment: RANKS (4), MODEL (cnn), WIDTH (8), EPOCHS (1), FRACTIONS ("2 4": MTBF = steps/F),
# REPEAT (3),
# CKPT_EVERY (full checkpoints for restart every this many steps; default steps/8), EXTRA (more
# train options), BIN (a built gossipgrad; default: build one in build/), TAG (file suffix).
set -euo pipefail
cd "$(dirname "$0")/../.."
CONFIG=${1:-configs/laptop.ini}
P=${RANKS:-4}
MODEL=${MODEL:-cnn}
WIDTH=${WIDTH:-8}
EPOCHS=${EPOCHS:-1}
REPEAT=${REPEAT:-3}
read -r -a FRACTIONS <<<"${FRACTIONS:-2 4}"
. scripts/checks.sh
gg_int RANKS "$P" 2 4096
gg_int WIDTH "$WIDTH" 1 1024
gg_int EPOCHS "$EPOCHS" 1 100000
gg_int REPEAT "$REPEAT" 1
gg_ints FRACTIONS 1 100000 "${FRACTIONS[@]}"
[ -z "${CKPT_EVERY:-}" ] || gg_int CKPT_EVERY "$CKPT_EVERY" 1
[ -f "$CONFIG" ] || { echo "bench/resilience: config '$CONFIG' is not a file (usage: bench/resilience/run.sh [CONFIG])" >&2; exit 2; }
read -r -a EXTRA <<<"${EXTRA:-}"
if [ -z "${BIN:-}" ]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF >/dev/null
  cmake --build build --target gossipgrad >/dev/null
  BIN=$PWD/build/gossip/gossipgrad
fi
OUT=bench/results/resilience-$(hostname)${TAG:+-$TAG}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
# The batch the runs train with: the dry run of their own options at P ranks (the config's alone
# missed a train.batch in EXTRA, and a refused setting surfaced as an arithmetic error).
if ! dry=$(PMI_SIZE=$P "$BIN" train --config "$CONFIG" --model.name "$MODEL" --model.width "$WIDTH" \
  --train.epochs "$EPOCHS" --train.threads 1 "${EXTRA[@]}" --dry-run 2>&1); then
  echo "bench/resilience: $(gg_refusal "$dry")" >&2
  exit 2
fi
BATCH=$(awk -F' = ' '/^batch = /{print $2; exit}' <<<"$dry")
# Fashion-MNIST's 60,000 training images. A fraction F with steps / F = 0 ran without a single
# failure (fault.mtbf_steps 0 means none) under the name of its strategy and F: refused, as is a
# run with no step; restart checkpoints at least every step.
STEPS=$((60000 / (BATCH * P) * EPOCHS))
((STEPS >= 1)) || { echo "bench/resilience: $P ranks x batch $BATCH leave no step in $EPOCHS epoch(s) of 60000 images" >&2; exit 2; }
for f in "${FRACTIONS[@]}"; do
  ((STEPS / f >= 1)) || {
    echo "bench/resilience: FRACTIONS: F = $f gives MTBF = $STEPS steps / $f = 0, a run without failures (fault.mtbf_steps 0): use F <= $STEPS" >&2
    exit 2
  }
done
CKPT_EVERY=${CKPT_EVERY:-$((STEPS / 8 > 0 ? STEPS / 8 : 1))}
export OMP_NUM_THREADS=1
{
  echo "# $(date -u +%FT%TZ) $(uname -srm), $(nproc --all) cores: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
  echo "# $P ranks (mpirun, oversubscribed where ranks > cores), config $CONFIG, model $MODEL width $WIDTH, $EPOCHS epoch(s) = $STEPS steps, MTBF = steps / (${FRACTIONS[*]}), restart checkpoints every $CKPT_EVERY steps, extra: ${EXTRA[*]:-none}"
  echo "# repeat $REPEAT (median wall time); $(mpichversion 2>/dev/null | head -1 | xargs)"
} >"$OUT.txt"
run() {  # run NAME ARGS...
  local name=$1; shift
  echo "resilience bench: $name" >&2
  mpirun -n "$P" "$BIN" train --config "$CONFIG" --model.name "$MODEL" --model.width "$WIDTH" \
    --train.epochs "$EPOCHS" --train.threads 1 --log.progress false --log.overwrite true \
    --gossip.consensus_every 0 --log.metrics "$TMP/$name.jsonl" "${EXTRA[@]}" "$@" \
    >"$TMP/$name.log" 2>&1 || { tail -5 "$TMP/$name.log" >&2; exit 1; }
}
for r in $(seq 1 "$REPEAT"); do
  run "none-0-$r"
  for f in "${FRACTIONS[@]}"; do
    mtbf=$((STEPS / f))
    for s in restart rollback forward; do
      ckpt=()
      [ "$s" = restart ] && ckpt=(--checkpoint.dir "$TMP/ck-$s-$f-$r" --checkpoint.every "$CKPT_EVERY")
      run "$s-$f-$r" --fault.strategy "$s" --fault.mtbf_steps "$mtbf" "${ckpt[@]}"
    done
  done
done
python3 bench/resilience/summarize.py "$TMP" "$OUT" "$STEPS"
cat "$OUT.md"
