#!/usr/bin/env bash
# Real compute on the cluster in a box: ResNet-18 on the real Fashion-MNIST, one rank per node,
# N namespace nodes (cluster.sh) whose links run at RATE Mbit/s, every step computed for real
# (oneDNN for gossipgrad, PyTorch's CPU kernels for DDP), nothing emulated or dilated. The
# methods, alternating in rounds so that the VM's state falls on all alike:
#   model+int4+choco+sr+pipeline  the same rule as model+int4+choco with stochastic rounding
#                    (gossip.rounding), the weights mixed before the next forward bucket by
#                    bucket (gossip.overlap_model false, gossip.pipeline_weights): the rule whose
#                    top-1 bench/results reports at p = 8 and 128
#   model+int4+choco  gossipgrad, mode model, the weights' difference on the int4 wire to CHOCO's
#                     public copies (gossip.choco, dissemination without rotation)
#   model+int4        the same wire with error feedback (dissemination with rotation)
#   model+bf16        the weights on the bf16 wire with error feedback
#   ddp, ddp+cl, ddp+fp16  PyTorch DDP over gloo (ddp_train.py): contiguous, channels_last, and
#                     channels_last with DDP's fp16_compress_hook
# This VM has 2 cores for all N ranks: each rank computes on 2/N of a core and the links' TCP
# traffic takes CPU too, so the figures are this testbed's, not a cluster's; the ratio between
# methods is what it measures.
#
# usage: bench/cluster/real.sh [--nodes N] [--rate MBIT] [--steps S] [--rounds R] [--out DIR]
# Defaults: 4 nodes, 1000 Mbit/s, 20 measured steps (3 of warm-up), 2 rounds,
# bench/results/cluster-real-$(hostname). GG_REAL_METHODS: the methods to run, in that order
# (default: all of the above). GG_BIN: the gossipgrad to run (default
# build/gossip/gossipgrad). TORCH: DDP's PyTorch, 2.15 (the default: bench/torch_env.sh's pinned
# environment) or debian (Debian's python3-torch 1.13, the rows before 2026-11-29). Writes DIR/points.csv (method, round, median step s) and the runs;
# prints the medians over rounds and each method's ratio to DDP's best. A DIR holding points of
# other --nodes, --rate, --steps or TORCH is refused (their medians would pool); rounds go on from its
# last.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
NODES=4 RATE=1000 STEPS=20 ROUNDS=2 OUT=$ROOT/bench/results/cluster-real-$(hostname)
die() { echo "real.sh: $*" >&2; exit 2; }
while (($#)); do
    case $1 in
    --nodes) NODES=${2:?--nodes needs a count} && shift 2 ;;
    --rate) RATE=${2:?--rate needs Mbit/s} && shift 2 ;;
    --steps) STEPS=${2:?--steps needs a count} && shift 2 ;;
    --rounds) ROUNDS=${2:?--rounds needs a count} && shift 2 ;;
    --out) OUT=${2:?--out needs a folder} && shift 2 ;;
    -h | --help) sed -n '2,/^set -euo/{/^#/s/^# \{0,1\}//p}' "${BASH_SOURCE[0]}" && exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
    esac
done
for v in NODES RATE STEPS ROUNDS; do
    [[ ${!v} =~ ^[1-9][0-9]{0,5}$ ]] || die "--${v,,} ${!v}: a whole number >= 1"
done
((NODES >= 2)) || die "--nodes $NODES: at least 2"
ALL="model+int4+choco+sr+pipeline model+int4+choco ddp+cl model+int4 ddp model+bf16 ddp+fp16"
read -r -a METHODS <<<"${GG_REAL_METHODS:-$ALL}"
((${#METHODS[@]})) || die "GG_REAL_METHODS is empty: name methods from: $ALL"
for m in "${METHODS[@]}"; do
    [[ " $ALL " == *" $m "* ]] || die "GG_REAL_METHODS: unknown method '$m'; known: $ALL"
done
# One folder, one setting: a method's median pools every row of points.csv, which carries no
# nodes, rate or steps (a second invocation at another --rate was pooled under the same name).
settings="TORCH=${TORCH:-2.15} --nodes $NODES --rate $RATE --steps $STEPS"
if [[ -f $OUT/points.csv ]]; then
    # A line from before TORCH was recorded ran Debian's 1.13.
    prev=$(sed -n 's/.*real\.sh \(--nodes [0-9]* --rate [0-9]* --steps [0-9]*\).*/\1/p' "$OUT/commands.txt" 2>/dev/null | tail -n 1)
    torch=$(sed -n 's/.*TORCH=\([0-9a-z.]*\) .*real\.sh .*/\1/p' "$OUT/commands.txt" 2>/dev/null | tail -n 1)
    [[ -z $prev ]] || prev="TORCH=${torch:-debian} $prev"
    [[ -z $prev || $prev == "$settings" ]] ||
        die "$OUT holds points of $prev: their medians would pool with $settings; use another --out"
fi
BIN=${GG_BIN:-$ROOT/build/gossip/gossipgrad}
[[ -x $BIN ]] || die "no gossipgrad at $BIN: build it first (cmake --build build) or set GG_BIN"
DATA=/usr/share/datasets/fashion-mnist
[[ -f $DATA/train-images-idx3-ubyte.gz ]] || die "no Fashion-MNIST in $DATA (apt-get install fashion-mnist)"
. "$ROOT/scripts/checks.sh"
gg_torch_check
TORCH_PY=""
for m in "${METHODS[@]}"; do [[ $m == ddp* ]] && TORCH_PY=$(gg_torch_python) && break; done
CLUSTER=$HERE/cluster.sh
PREFIX=${GG_REAL_PREFIX:-ggr$$}
mkdir -p "$OUT"
CSV=$OUT/points.csv
[[ -f $CSV ]] || echo "method,round,median_step_s,file" >"$CSV"
echo "${GG_BIN:+GG_BIN=$GG_BIN }TORCH=${TORCH:-2.15} bench/cluster/real.sh --nodes $NODES --rate $RATE --steps $STEPS --rounds $ROUNDS" >>"$OUT/commands.txt"
cleanup() { "$CLUSTER" --prefix "$PREFIX" down >/dev/null 2>&1 || true; }
trap cleanup EXIT
trap 'exit 130' INT TERM
"$CLUSTER" --prefix "$PREFIX" up --nodes "$NODES" --rate "${RATE}mbit" --delay 0 --jitter 0 >/dev/null
THREADS=1

gossip() { # name options...
    local name=$1 file=$OUT/$1-r$round.jsonl
    shift
    "$CLUSTER" --prefix "$PREFIX" run -n "$NODES" -ppn 1 -- "$BIN" train \
        --config "$ROOT/configs/laptop.ini" --model.name resnet18 --train.batch 32 \
        --train.threads $THREADS --data.augment false --train.max_steps $((STEPS + 3)) \
        --train.eval_batch 1000 --train.epochs 1 --gossip.consensus_every 0 \
        --gossip.timeout_s 600 --log.progress false --log.metrics "$file" --log.overwrite true \
        "$@" >"$OUT/$name-r$round.log" 2>&1 ||
        { echo "real.sh: $name failed (see $OUT/$name-r$round.log)" >&2; FAILED+=("$name-r$round"); return 0; }
    local med
    med=$(/usr/bin/python3 -c '
import json, statistics, sys
s = [e["step_s"] for e in map(json.loads, open(sys.argv[1])) if e.get("event") == "step"][3:]
print(f"{statistics.median(s):.4f}")' "$file")
    echo "$name,$round,$med,$(basename "$file")" >>"$CSV"
    printf 'real.sh: round %s %-18s %s s\n' "$round" "$name" "$med"
}

ddp() { # name options...
    local name=$1 file=$OUT/$1-r$round.json
    shift
    "$CLUSTER" --prefix "$PREFIX" run -n "$NODES" -ppn 1 -- "$TORCH_PY" "$HERE/ddp_train.py" \
        --data "$DATA" --batch 32 --threads $THREADS --steps "$STEPS" --warmup 3 \
        --master-addr 10.213.0.1 --ifname "$PREFIX-eth" --json-out "$file" "$@" \
        >"$OUT/$name-r$round.log" 2>&1 ||
        { echo "real.sh: $name failed (see $OUT/$name-r$round.log)" >&2; FAILED+=("$name-r$round"); return 0; }
    local med
    med=$(/usr/bin/python3 -c 'import json, sys; print("%.4f" % json.load(open(sys.argv[1]))["median_step_s"])' "$file")
    echo "$name,$round,$med,$(basename "$file")" >>"$CSV"
    printf 'real.sh: round %s %-18s %s s\n' "$round" "$name" "$med"
}

method() { # name
    local choco=(--gossip.mode model --gossip.model_wire int4 --gossip.choco true --gossip.rotate false)
    case $1 in
    model+int4+choco) gossip "$1" "${choco[@]}" ;;
    model+int4+choco+sr+pipeline)
        gossip "$1" "${choco[@]}" --gossip.rounding stochastic --gossip.overlap_model false \
            --gossip.pipeline_weights true ;;
    model+int4) gossip "$1" --gossip.mode model --gossip.model_wire int4 --gossip.error_feedback true ;;
    model+bf16) gossip "$1" --gossip.mode model --gossip.model_wire bf16 --gossip.error_feedback true ;;
    ddp) ddp "$1" ;;
    ddp+cl) ddp "$1" --channels-last ;;
    ddp+fp16) ddp "$1" --channels-last --compress fp16 ;;
    *) die "GG_REAL_METHODS: unknown method '$1'" ;;
    esac
}
FAILED=()  # points that failed: the others run, the script ends non-zero naming them
# Rounds go on from the folder's last (a second invocation wrote its round 1 over the first's
# files, whose rows stayed in points.csv, now naming other runs).
first=$(awk -F, 'NR > 1 && $2 + 0 > m { m = $2 + 0 } END { print m + 1 }' "$CSV")
for ((round = first; round < first + ROUNDS; round++)); do
    for m in "${METHODS[@]}"; do method "$m"; done
done
/usr/bin/python3 - "$CSV" <<'PY'
import collections, csv, statistics, sys
rows = collections.defaultdict(list)
for r in csv.DictReader(open(sys.argv[1])):
    rows[r["method"]].append(float(r["median_step_s"]))
med = {m: statistics.median(v) for m, v in rows.items()}
best_ddp = min((v for m, v in med.items() if m.startswith("ddp")), default=None)
for m, v in sorted(med.items(), key=lambda kv: kv[1]):
    ratio = f"{best_ddp / v:.2f}x DDP's best" if best_ddp else ""
    print(f"real.sh: {m:18s} median {v:.3f} s over {len(rows[m])} rounds  {ratio}")
PY
if ((${#FAILED[@]})); then
    echo "real.sh: ${#FAILED[@]} point(s) failed: ${FAILED[*]} (their logs in $OUT)" >&2
    exit 1
fi
