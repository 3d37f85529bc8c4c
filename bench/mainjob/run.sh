#!/usr/bin/env bash
# bench/mainjob: the main job against PyTorch DDP on the same CPU. Alternating in rounds (gossipgrad,
# then each DDP variant, then again), so that the machine's state falls on all alike:
#   gossipgrad  quickstart.sh's command exactly: mpirun -n 2 (-bind-to core when the machine has
#               2 cores or more) build/gossip/gossipgrad train --config configs/laptop.ini
#               --log.metrics DIR/gossipgrad-rN/metrics.jsonl --checkpoint.dir
#               DIR/gossipgrad-rN/checkpoint, plus --train.epochs / --train.max_steps /
#               --train.seed when given
#   ddp         the same recipe under PyTorch DDP over gloo (bench/mainjob/ddp_resnet8.py, launched
#               by the same mpirun and binding; it reads every setting from what gossipgrad's
#               --dry-run resolved, DIR/settings.ini; its docstring lists what matches and what
#               does not), contiguous NCHW
#   ddp+cl      the same with the model and the inputs in channels_last
# DDP's best is the variant with the higher median images/s.
#
# The figures: images/s is gossipgrad's summary images_per_s (metrics.jsonl, event "summary"):
# the global batch times the steps over the sum of rank 0's step times, evaluation and checkpoints
# left out, the first steps, data waits and the exchange counted; DDP's is measured the same way.
# Top-1 is the final evaluation (after the last step, the ranks' average model, the 10,000 test
# images). wall s is the whole mpirun command as timed here (start-up, data loading, the
# per-epoch evaluations and the checkpoint included). The tail loss is the mean training loss of
# rank 0's last 50 steps (or fewer), for comparing short runs.
#
# usage: bench/mainjob/run.sh [--epochs E] [--max-steps S] [--seed N] [--rounds R] [--out DIR]
#                             [--variants "ddp ddp+cl"] [--timeout SECONDS]
# Defaults: laptop.ini's 12 epochs, no step limit, 2 rounds, both DDP variants, 3600 s per run
# (each run under `timeout`), DIR bench/results/mainjob-$(hostname). --epochs, --max-steps and
# --seed go to both sides alike. TORCH: 2.15 (default; bench/torch_env.sh's pinned virtual environment,
# installed on first use) or debian (/usr/bin/python3 with Debian's torch 1.13, history).
# GG_BIN: the gossipgrad to run (default build/gossip/gossipgrad).
# Writes DIR/points.csv (one row per run), DIR/summary.md (machine, versions, commands, medians
# over the rounds, the ratio gossipgrad / DDP's best images/s and the top-1 difference),
# DIR/commands.txt, and each run's folder (log, metrics or result.json). A DIR holding runs of
# other settings (epochs, steps, gossipgrad binary and its oneDNN, torch, MPICH) is refused before
# anything runs (their medians would pool); rounds go on from the folder's last. Every bad input:
# one line on stderr, exit 2; a failed run: the others run, the script exits 1 naming it.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
cd "$ROOT"
. scripts/checks.sh
die() { echo "run.sh: $*" >&2; exit 2; }
need() { [[ $# -ge 2 && -n $2 ]] || die "$1 needs a value (see --help)"; }
EPOCHS="" MAX_STEPS="" SEED="" ROUNDS=2 OUT="" VARIANTS="ddp ddp+cl" TIMEOUT=3600
while (($#)); do
  case $1 in
  --epochs) need "$@" && EPOCHS=$2 && shift 2 ;;
  --max-steps) need "$@" && MAX_STEPS=$2 && shift 2 ;;
  --seed) need "$@" && SEED=$2 && shift 2 ;;
  --rounds) need "$@" && ROUNDS=$2 && shift 2 ;;
  --out) need "$@" && OUT=$2 && shift 2 ;;
  --variants) need "$@" && VARIANTS=$2 && shift 2 ;;
  --timeout) need "$@" && TIMEOUT=$2 && shift 2 ;;
  -h | --help) sed -n '2,/^set -euo/{/^#/s/^# \{0,1\}//p}' "${BASH_SOURCE[0]}" && exit 0 ;;
  *) die "unknown argument '$1' (see --help)" ;;
  esac
done
[[ -z $EPOCHS ]] || gg_int --epochs "$EPOCHS" 1 10000
[[ -z $MAX_STEPS ]] || gg_int --max-steps "$MAX_STEPS" 1 100000000
[[ -z $SEED ]] || gg_int --seed "$SEED" 0 2147483647
gg_int --rounds "$ROUNDS" 1 100
gg_int --timeout "$TIMEOUT" 10 86400
read -r -a VARS <<<"$VARIANTS"
((${#VARS[@]})) || die "--variants is empty: name ddp, ddp+cl or both"
seen=" "
for v in "${VARS[@]}"; do
  [[ $v == ddp || $v == ddp+cl ]] || die "--variants: unknown variant '$v'; known: ddp, ddp+cl"
  [[ $seen != *" $v "* ]] || die "--variants: '$v' twice"
  seen+="$v "
done
OUT=${OUT:-$ROOT/bench/results/mainjob-$(hostname)}
[[ ! -e $OUT || -d $OUT ]] || die "--out $OUT is not a folder"
if [[ -d $OUT && ! -f $OUT/settings.txt ]] && [[ -n $(ls -A "$OUT") ]]; then
  die "--out $OUT holds files but no settings.txt (not a run.sh folder): use another --out"
fi
gg_torch_check
BIN=${GG_BIN:-build/gossip/gossipgrad}
[[ -x $BIN ]] || die "no gossipgrad at $BIN: build it first (./quickstart.sh or cmake --build build --target gossipgrad) or set GG_BIN"
DATA=/usr/share/datasets/fashion-mnist
[[ -f $DATA/train-images-idx3-ubyte.gz ]] || die "no Fashion-MNIST in $DATA (apt-get install dataset-fashion-mnist)"
command -v mpirun >/dev/null || die "no mpirun (apt-get install mpich)"

# The recipe both sides run: what gossipgrad resolves for 2 ranks (it refuses bad values itself).
EXTRA=()
[[ -z $EPOCHS ]] || EXTRA+=(--train.epochs "$EPOCHS")
[[ -z $MAX_STEPS ]] || EXTRA+=(--train.max_steps "$MAX_STEPS")
[[ -z $SEED ]] || EXTRA+=(--train.seed "$SEED")
ERR=$(mktemp)
trap 'rm -f "$ERR"' EXIT
rc=0
resolved=$(PMI_SIZE=2 PMI_RANK=0 timeout 120 "$BIN" train --config configs/laptop.ini "${EXTRA[@]}" --dry-run 2>"$ERR") || rc=$?
if ((rc)) || [[ $resolved != *"[train]"* ]]; then
  why=$(gg_refusal "$(cat "$ERR")")
  die "gossipgrad refuses the recipe${EXTRA[*]:+ with ${EXTRA[*]}}: ${why:-$BIN train --dry-run exited $rc without resolved settings}"
fi

PY=$(gg_torch_python)
TORCH_VERSION=$("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null) ||
  die "TORCH=${TORCH:-2.15}: $PY does not import torch (Debian: apt-get install python3-torch)"
ONEDNN_LIB=$(ldd "$BIN" 2>/dev/null | awk '/libdnnl/ {print $3; exit}' || true)
if [[ -n $ONEDNN_LIB ]]; then ONEDNN_LIB=$(readlink -f "$ONEDNN_LIB"); else ONEDNN_LIB="not found by ldd"; fi
MPICH=$(mpirun --version 2>/dev/null | awk '/Version:/ {print $2; exit}')

# One folder, one setting: each method's median pools every row of points.csv, which carries no
# settings of its own.
settings="recipe: configs/laptop.ini ${EXTRA[*]} at 2 ranks, resolved settings sha256 $(sha256sum <<<"$resolved" | cut -c1-16)
gossipgrad: $BIN (oneDNN $ONEDNN_LIB)
torch: $TORCH_VERSION ($PY)
mpich: $MPICH"
if [[ -f $OUT/settings.txt ]]; then
  prev=$(cat "$OUT/settings.txt")
  if [[ $prev != "$settings" ]]; then
    was=$(diff <(echo "$prev") <(echo "$settings") | sed -n 's/^< //p' | head -1 || true)
    is=$(diff <(echo "$prev") <(echo "$settings") | sed -n 's/^> //p' | head -1 || true)
    die "$OUT holds runs of '$was', not '$is': their medians would pool; use another --out"
  fi
fi
BIND=()
if ((2 <= $(nproc))); then BIND=(-bind-to core); fi
mkdir -p "$OUT"
[[ -f $OUT/settings.txt ]] || echo "$settings" >"$OUT/settings.txt"
echo "$resolved" >"$OUT/settings.ini"
CSV=$OUT/points.csv
[[ -f $CSV ]] || echo "method,round,images_per_s,top1_pct,wall_s,steps,loss_tail,threads,run" >"$CSV"
echo "$(date -u +%FT%TZ) ${TORCH:+TORCH=$TORCH }${GG_BIN:+GG_BIN=$GG_BIN }bench/mainjob/run.sh ${EPOCHS:+--epochs $EPOCHS }${MAX_STEPS:+--max-steps $MAX_STEPS }${SEED:+--seed $SEED }--rounds $ROUNDS --variants '$VARIANTS' --timeout $TIMEOUT --out $OUT" >>"$OUT/commands.txt"

now() { date +%s.%N; }
FAILED=()
record() { # method run-folder wall figures-json-line
  local method=$1 dir=$2 wall=$3 line=$4
  python3 - "$CSV" "$method" "$round" "$wall" "$(basename "$dir")" "$line" <<'PY'
import json, sys
csv, method, rnd, wall, run, line = sys.argv[1:]
f = json.loads(line)
top1 = "" if f["top1"] is None else f"{100 * f['top1']:.2f}"
with open(csv, "a") as out:
    out.write(f"{method},{rnd},{f['images_per_s']:.1f},{top1},{float(wall):.1f},{f['steps']},"
              f"{f['loss_tail']:.4f},{f['threads']},{run}\n")
print(f"run.sh: round {rnd} {method:10s} {f['images_per_s']:8.1f} img/s  top-1 "
      f"{top1 or '-'}%  {float(wall):.1f} s")
PY
}
failed() { # name dir why
  echo "run.sh: $1 round $round failed: $3 (see $2/log.txt)" >&2
  FAILED+=("$1-r$round")
}

run_gossipgrad() {
  local dir=$OUT/gossipgrad-r$round t0 rc=0 line
  mkdir -p "$dir"
  local cmd=(mpirun -n 2 "${BIND[@]}" "$BIN" train --config configs/laptop.ini
    --log.metrics "$dir/metrics.jsonl" --checkpoint.dir "$dir/checkpoint" "${EXTRA[@]}")
  echo "${cmd[*]}" >"$dir/command.txt"
  t0=$(now)
  timeout --kill-after=30 "$TIMEOUT" "${cmd[@]}" >"$dir/log.txt" 2>&1 || rc=$?
  local wall
  wall=$(awk -v a="$t0" -v b="$(now)" 'BEGIN { print b - a }')
  if ((rc)); then failed gossipgrad "$dir" "exit $rc$( ((rc == 124)) && echo " (over --timeout $TIMEOUT s)")"; return 0; fi
  if ! line=$(python3 - "$dir/metrics.jsonl" <<'PY'
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1])]
s = [e for e in ev if e["event"] == "summary"][-1]
start = [e for e in ev if e["event"] == "start"][0]
loss = [e["loss"] for e in ev if e["event"] == "step"][-50:]
print(json.dumps({"images_per_s": s["images_per_s"], "top1": s["top1"], "steps": s["steps"],
                  "loss_tail": sum(loss) / len(loss), "threads": start["threads"]}))
PY
  ); then failed gossipgrad "$dir" "no summary in $dir/metrics.jsonl"; return 0; fi
  record gossipgrad "$dir" "$wall" "$line"
}

run_ddp() { # variant
  local variant=$1 dir=$OUT/$1-r$round t0 rc=0 line
  mkdir -p "$dir"
  local cmd=(mpirun -n 2 "${BIND[@]}" "$PY" bench/mainjob/ddp_resnet8.py --settings "$OUT/settings.ini"
    --store "$dir/store" --json-out "$dir/result.json" --timeout-s "$TIMEOUT")
  [[ $variant != ddp+cl ]] || cmd+=(--channels-last)
  echo "${cmd[*]}" >"$dir/command.txt"
  rm -f "$dir/store"
  t0=$(now)
  timeout --kill-after=30 "$TIMEOUT" "${cmd[@]}" >"$dir/log.txt" 2>&1 || rc=$?
  local wall
  wall=$(awk -v a="$t0" -v b="$(now)" 'BEGIN { print b - a }')
  if ((rc)); then failed "$variant" "$dir" "exit $rc$( ((rc == 124)) && echo " (over --timeout $TIMEOUT s)"): $(tail -n 1 "$dir/log.txt")"; return 0; fi
  if ! line=$(python3 - "$dir/result.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
loss = r["losses"][-50:]
print(json.dumps({"images_per_s": r["images_per_s"], "top1": r["top1"], "steps": r["steps"],
                  "loss_tail": sum(loss) / len(loss), "threads": r["threads"]}))
PY
  ); then failed "$variant" "$dir" "no result in $dir/result.json"; return 0; fi
  record "$variant" "$dir" "$wall" "$line"
}

# Rounds go on from the folder's last (rows in points.csv, or run folders a failed run left).
first=$( (awk -F, 'NR > 1 { print $2 }' "$CSV"; ls "$OUT" | sed -n 's/.*-r\([0-9][0-9]*\)$/\1/p') |
  sort -n | tail -1)
first=$((${first:-0} + 1))
for ((round = first; round < first + ROUNDS; round++)); do
  run_gossipgrad
  for v in "${VARS[@]}"; do run_ddp "$v"; done
done

# The summary over every round in the folder.
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)
flags=$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -xE 'avx2|avx512f|avx512_bf16|amx_[a-z0-9]+' | sort -u | xargs)
onednn_pkg=$(dpkg-query -S "$ONEDNN_LIB" 2>/dev/null | cut -d: -f1-2 | head -1 || true)
[[ -z $onednn_pkg ]] || onednn_pkg="$onednn_pkg $(dpkg-query -W -f '${Version}' "$onednn_pkg" 2>/dev/null || true)"
commit=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
git -C "$ROOT" diff --quiet HEAD -- gossip kernels shuffle partners 2>/dev/null || commit+=" (with uncommitted changes)"
export MJ_CPU="$cpu, $(nproc) cores" MJ_FLAGS="${flags:-none of them}" MJ_KERNEL="$(uname -srm)" \
  MJ_TORCH="$TORCH_VERSION ($PY)" MJ_MPICH="${MPICH:-unknown} ($(dpkg-query -W -f '${Package} ${Version}' libmpich12 2>/dev/null || echo 'no Debian package'))" \
  MJ_ONEDNN="$ONEDNN_LIB${onednn_pkg:+ (Debian $onednn_pkg)}" MJ_COMMIT="$commit" MJ_BIN="$BIN" \
  MJ_BIND="${BIND[*]:-none}" MJ_EXTRA="${EXTRA[*]}" MJ_PY="$PY"
python3 - "$CSV" "$OUT/summary.md" "$OUT/settings.ini" "$OUT/commands.txt" <<'PY'
import collections, configparser, csv, os, statistics, sys
csv_path, md_path, ini_path, commands_path = sys.argv[1:]
E = os.environ
rows = list(csv.DictReader(open(csv_path)))
by = collections.defaultdict(list)
for r in rows:
    by[r["method"]].append(r)
def med(rs, key):
    v = [float(r[key]) for r in rs if r[key] != ""]
    return statistics.median(v) if v else None
stats = {m: {"n": len(rs), "ips": med(rs, "images_per_s"), "top1": med(rs, "top1_pct"),
             "wall": med(rs, "wall_s"), "loss": med(rs, "loss_tail")} for m, rs in by.items()}
ddp = {m: s for m, s in stats.items() if m.startswith("ddp")}
best = max(ddp, key=lambda m: ddp[m]["ips"]) if ddp else None
gg = stats.get("gossipgrad")
cp = configparser.ConfigParser(interpolation=None)
cp.read(ini_path)
t = cp["train"]
fmt = lambda v, f: "-" if v is None else f.format(v)
L = ["# The main job: gossipgrad against PyTorch DDP (gloo), same recipe, same CPU", "",
     "bench/mainjob/run.sh; every round of this folder (one row per run: points.csv).", "",
     "## Machine and versions", "",
     f"- CPU: {E['MJ_CPU']}; ISA flags: {E['MJ_FLAGS']} (of avx2, avx512f, avx512_bf16, amx_*)",
     f"- kernel: {E['MJ_KERNEL']}",
     f"- gossipgrad: {E['MJ_BIN']}, checkout {E['MJ_COMMIT']}; oneDNN {E['MJ_ONEDNN']}",
     f"- PyTorch: {E['MJ_TORCH']}, DDP over gloo",
     f"- MPICH: {E['MJ_MPICH']}; binding {E['MJ_BIND']}", "",
     "## Recipe", "",
     f"configs/laptop.ini{' ' + E['MJ_EXTRA'] if E['MJ_EXTRA'] else ''} as gossipgrad resolves it "
     f"for 2 ranks (settings.ini): resnet8 width {cp['model']['width']}, Fashion-MNIST, batch "
     f"{t['batch']} per rank, {t['epochs']} epochs{', at most ' + t['max_steps'] + ' steps' if t['max_steps'] != '0' else ''}, "
     f"lr {t['lr']} x global batch / {t['base_batch']}, warm-up {t['warmup_epochs']} epochs then "
     f"cosine to 0, SGD momentum {t['momentum']} (nesterov {t['nesterov']}), weight decay "
     f"{t['weight_decay']} on every parameter, augmentation {cp['data']['augment']}, seed {t['seed']}, threads "
     f"{t['threads']} (0: cores / ranks). DDP side: bench/mainjob/ddp_resnet8.py (its docstring: "
     "what matches and what differs). images/s: training images over the sum of rank 0's step "
     "times, evaluation and checkpoints left out; top-1: after the last step; wall s: the whole "
     "mpirun command.", "",
     "## Commands", "", "```"]
L += [l.rstrip("\n") for l in open(commands_path)]
L += ["```", "", "Each method's command, as in its first round here (round N writes to *-rN):", "",
      "```"]
seen = set()
for r in rows:
    if r["method"] in seen:
        continue
    seen.add(r["method"])
    folder = os.path.join(os.path.dirname(csv_path), r["run"])
    try:
        L.append(open(os.path.join(folder, "command.txt")).read().strip())
    except OSError:
        pass
L += ["```", "", "## Results (medians over rounds)", "",
      "| method | rounds | images/s | top-1 % | wall s | tail loss |", "|---|---|---|---|---|---|"]
for m in sorted(stats, key=lambda m: (m != "gossipgrad", m)):
    s = stats[m]
    tag = " (DDP's best)" if m == best and len(ddp) > 1 else ""
    L.append(f"| {m}{tag} | {s['n']} | {fmt(s['ips'], '{:.1f}')} | {fmt(s['top1'], '{:.2f}')} | "
             f"{fmt(s['wall'], '{:.1f}')} | {fmt(s['loss'], '{:.4f}')} |")
L.append("")
if gg and best:
    b = ddp[best]
    ratio = gg["ips"] / b["ips"]
    diff = None if gg["top1"] is None or b["top1"] is None else gg["top1"] - b["top1"]
    L.append(f"**gossipgrad / DDP's best ({best}): {ratio:.2f}x images/s; top-1 difference "
             f"{fmt(diff, '{:+.2f}')} points** (gossipgrad {fmt(gg['top1'], '{:.2f}')}%, {best} "
             f"{fmt(b['top1'], '{:.2f}')}%).")
    for m, s in sorted(ddp.items()):
        if m != best:
            L.append(f"Against {m}: {gg['ips'] / s['ips']:.2f}x.")
    print(f"run.sh: gossipgrad / DDP's best ({best}): {ratio:.2f}x images/s, top-1 difference "
          f"{fmt(diff, '{:+.2f}')} points (medians over {gg['n']} / {b['n']} rounds)")
threads = sorted({int(r["threads"]) for r in rows})
if threads and max(threads) > 1 and E["MJ_BIND"] != "none":
    L += ["", f"Note: {max(threads)} compute threads per rank, each rank bound to one core "
          "(-bind-to core): train.threads 0 divides all of this machine's cores among the ranks "
          "on it, not the cores a rank is bound to, on both sides alike; the ranks' threads "
          "share one core each."]
L += ["", "## Every run", "",
      "| method | round | images/s | top-1 % | wall s | steps | tail loss | threads/rank |",
      "|---|---|---|---|---|---|---|---|"]
for r in rows:
    L.append(f"| {r['method']} | {r['round']} | {r['images_per_s']} | {r['top1_pct'] or '-'} | "
             f"{r['wall_s']} | {r['steps']} | {r['loss_tail']} | {r['threads']} |")
open(md_path, "w").write("\n".join(L) + "\n")
print(f"run.sh: {md_path}")
PY
if ((${#FAILED[@]})); then
  echo "run.sh: ${#FAILED[@]} run(s) failed: ${FAILED[*]} (their logs in $OUT)" >&2
  exit 1
fi
