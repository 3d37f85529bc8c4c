#!/usr/bin/env bash
# bench/compute/profile.sh: where a training step of the oneDNN backend spends its time, from
# oneDNN's own timing of every primitive it executes (ONEDNN_VERBOSE=1, oneDNN 2.x or 3.x). Runs
# gg_bench_compute for each setting and writes bench/results/compute-profile-<host>.md: the
# milliseconds per step by primitive kind (convolution forward / backward-data /
# backward-weights, batch norm, sum, ...) and the reorders split by what they move (weights
# into a primitive's layout, weight gradients back to the flat buffer's, activations), with each
# one's share of the primitives' total. The step's wall time is printed beside it: host work
# (loss, NaN checks, running statistics) is the difference. A second table puts each convolution
# pass of the step beside the same shape timed alone (gg_bench_peak --model, the floor's layers)
# and lists the largest gaps. With TORCH=2.15 (default) or debian, PyTorch eager in channels_last
# (torch_bench.py --channels-last, bf16 under autocast) is profiled the same way: 2.15 runs its
# convolutions on its own oneDNN 3.13, Debian's 1.13 on the same 2.6 library as gossipgrad, so the
# two convolution totals say how much of a lead is left to win outside them. PyTorch's per-step
# figures are the difference of a run of 1 + STEPS and a run of 1 + 3 * STEPS steps, divided by
# 2 * STEPS (its first step differs).
# Usage: bench/compute/profile.sh [MODEL:BATCH:RES:THREADS:PRECISION ...]
#   default: resnet50:16:64:2:bf16 resnet50:16:64:2:fp32 resnet50:16:224:2:fp32
#   resnet50:16:224:2:bf16
# Environment: STEPS (profiled steps after one warm-up step, default 2), BUILD (default build),
#   TORCH (2.15, the default, or debian: the PyTorch profiled beside; 0: gossipgrad only), NAME
#   (the results' file name without .md, default compute-profile-<host>).
set -euo pipefail
cd "$(dirname "$0")/../.."
SETTINGS=("${@:-resnet50:16:64:2:bf16 resnet50:16:64:2:fp32 resnet50:16:224:2:fp32 resnet50:16:224:2:bf16}")
read -r -a SETTINGS <<<"${SETTINGS[*]}"
STEPS=${STEPS:-2}
TORCH=${TORCH:-2.15}
. scripts/checks.sh
gg_int STEPS "$STEPS" 1
[ "$TORCH" = 0 ] || gg_torch_check
gg_name NAME "${NAME:=compute-profile-$(hostname)}"
# After every check: the 2.15 environment is a 5 GB install on first use.
TORCH_PY=""
[ "$TORCH" = 0 ] || TORCH_PY=$(gg_torch_python)
BUILD=${BUILD:-build}
. bench/compute/common.sh
build_bench "$BUILD" gg_bench_compute gg_bench_peak
OUT=bench/results/$NAME
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
{
  echo "# oneDNN primitive time per training step ($(date -u +%F), $(hostname), $(nproc) cores)"
  echo
  echo "Machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); oneDNN capped to" \
    "${ONEDNN_MAX_CPU_ISA:-none}, PyTorch's ATen to ${ATEN_CPU_CAPABILITY:-none}."
  echo
  echo "Command: \`bench/compute/profile.sh ${SETTINGS[*]}\` (STEPS=$STEPS after 1 warm-up step;"
  echo "ONEDNN_VERBOSE=1 times each primitive, which adds a little to every call)."
} >"$TMP/report.md"  # moved over $OUT.md once every setting ran: a failure keeps the old one
# quiet WHAT COMMAND...: runs COMMAND with its stderr set aside; when it fails, says so in one line
# with the command's own reason (common.sh's tool_reason) and exits with its status (it used to
# exit silently).
quiet() {
  local what=$1 rc=0
  shift
  "$@" 2>"$TMP/err.txt" || rc=$?
  if [ "$rc" != 0 ]; then
    echo "profile.sh: $what failed for $s (exit $rc): $(tool_reason "$TMP/err.txt")" >&2
    exit "$rc"
  fi
}
for s in "${SETTINGS[@]}"; do
  IFS=: read -r model batch res threads precision <<<"$s"
  echo "profile.sh: $model batch $batch ${res}px $threads threads $precision" >&2
  quiet gg_bench_compute env ONEDNN_VERBOSE=1 OMP_NUM_THREADS="$threads" \
    "$BUILD/bench/gg_bench_compute" --model "$model" --batch "$batch" --res "$res" \
    --threads "$threads" --steps "$STEPS" --warmup 1 --precision "$precision" >"$TMP/verbose.txt"
  # The same convolution shapes timed alone (the floor's layers), for the per-layer table.
  quiet gg_bench_peak env OMP_NUM_THREADS="$threads" "$BUILD/bench/gg_bench_peak" --model "$model" \
    --res "$res" --batch "$batch" --threads "$threads" --precision "$precision" --seconds 0.05 \
    >"$TMP/alone.csv"
  : >"$TMP/torch1.txt"
  : >"$TMP/torch2.txt"
  if [ -n "$TORCH_PY" ]; then
    for k in 1 2; do
      quiet torch_bench.py env ONEDNN_VERBOSE=1 OMP_NUM_THREADS="$threads" \
        OPENBLAS_NUM_THREADS="$threads" "$TORCH_PY" bench/compute/torch_bench.py \
        --model "$model" --batch "$batch" --res "$res" --threads "$threads" \
        --steps $(((2 * k - 1) * STEPS)) --warmup 1 --channels-last --precision "$precision" \
        >"$TMP/torch$k.txt"
    done
  fi
  /usr/bin/python3 - "$TMP" "$STEPS" "$batch" "$s" >>"$TMP/report.md" <<'PY'
import collections, csv, re, sys
tmp, steps, batch, setting = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]


def execs_of(path):
    # oneDNN 2.x: "onednn_verbose,exec,cpu,PRIM,IMPL,PROP,DESCS,ATTRS,AUX,SHAPE,MS"; 3.x inserts
    # "v1,primitive," after the first field: read as 2.x's.
    lines = open(path).read().splitlines()
    v3 = "onednn_verbose,v1,primitive,exec,"
    return ([l.split(",") for l in lines if l.startswith("onednn_verbose,exec,")] +
            [["onednn_verbose"] + l[len(v3) - 5:].split(",") for l in lines if l.startswith(v3)],
            [l for l in lines if "," in l and not l.startswith("onednn_verbose")])


def format_tag(desc):
    # 2.x "src_f32::blocked:ABcd16b16a:f0", 3.x "src:f32::blocked:ABcd16b16a::f0"
    parts = desc.split(":")
    return parts[parts.index("blocked") + 1] if "blocked" in parts else parts[3]


def tally(execs):
    total = collections.Counter()
    for f in execs:
        total[key_of(f)] += float(f[-1])
    return total


def key_of(f):
    prim, prop, descs, shape = f[3], f[5], f[6], f[-2]
    if prim == "reorder":
        # "src_f32::blocked:ABcd16b16a:f0 dst_f32::blocked:abcd:f0": the format tags. Weights
        # block dimension a (output channels); activations never block a (the batch).
        src, dst = [format_tag(d) for d in descs.split(" ")[:2]]
        weights = "A" in src or "A" in dst or (src.islower() and dst.islower() and
                                               not shape.startswith(batch + "x"))
        if not weights:
            return "reorder: activations"
        if dst.islower() and not src.islower():
            return "reorder: weight gradients to the flat buffer's layout"
        return "reorder: weights into the primitive's layout"
    return f"{prim} {prop}".replace(" undef", "")


execs, result = execs_of(f"{tmp}/verbose.txt")
result = [l for l in result if l.startswith("gossipgrad-onednn,")]
if not execs or not result:
    sys.exit(f"profile.sh: no oneDNN timings for {setting} (is oneDNN built with verbose?)")
per_step = len(execs) // (steps + 1)  # every step executes the same primitives
timed = execs[-per_step * steps:]  # the warm-up step's first executions are left out
total = tally(timed)
total = collections.Counter({k: v / steps for k, v in total.items()})
prims = sum(total.values())
step_s = float(result[0].split(",")[6])
print(f"\n## {setting.replace(':', ' ')}\n")
print(f"Step (median, timed by gg_bench_compute): {step_s * 1e3:.0f} ms; oneDNN primitives: "
      f"{prims:.0f} ms.\n")
print("| primitive | ms per step | share of primitives |")
print("|---|---|---|")
for k, v in total.most_common():
    print(f"| {k} | {v:.1f} | {100 * v / prims:.1f}% |")
# Each convolution pass in the step against the same shape timed alone (gg_bench_peak --model:
# the fastest of its repeats, warm caches): the layers where the step loses most to the floor.
alone = {}
for r in csv.DictReader(open(f"{tmp}/alone.csv")):
    m = re.match(r"conv c(\d+) k(\d+) (\d+)x\d+ r(\d+) s(\d+)", r["layer"])
    if m:
        alone[tuple(map(int, m.groups()))] = {
            p: int(r["count"]) * float(r[p + "_ms"])
            for p in ("forward", "backward_data", "backward_weights")}
layers = collections.Counter()
for f in timed:
    m = re.search(r"ic(\d+)oc(\d+)_ih(\d+)oh\d+kh(\d+)sh(\d+)", f[-2])
    if f[3] == "convolution" and m:
        layers[(tuple(map(int, m.groups())), f[5].replace("_training", ""))] += float(f[-1]) / steps
gaps = sorted(((v - alone[k][p], k, p, v) for (k, p), v in layers.items()
               if k in alone and p in alone[k]), reverse=True)
if gaps:
    print(f"\nConvolutions in the step against the same shapes alone (gg_bench_peak --model), the "
          f"{min(8, len(gaps))} largest gaps; all convolutions: {sum(layers.values()):.0f} ms in "
          f"the step, {sum(sum(v.values()) for v in alone.values()):.0f} ms alone:\n")
    print("| layer (in, out, size, kernel, stride) | pass | ms in the step | ms alone | gap |")
    print("|---|---|---|---|---|")
    for gap, k, p, v in gaps[:8]:
        print(f"| c{k[0]} k{k[1]} {k[2]}px r{k[3]} s{k[4]} | {p} | {v:.1f} | {v - gap:.1f} "
              f"| {gap:+.1f} |")
(short, short_rows), (long, long_rows) = (execs_of(f"{tmp}/torch{k}.txt") for k in (1, 2))
torch_rows = [l for l in long_rows if l.startswith("pytorch-")]
if not torch_rows:
    sys.exit(0)  # TORCH=0
a, b = tally(short), tally(long)
theirs = {k: (b[k] - a[k]) / (2 * steps) for k in b}
conv = lambda t: sum(v for k, v in t.items() if k.startswith("convolution"))
torch_step = float(torch_rows[0].split(",")[6]) * 1e3
print(f"\nPyTorch ({torch_rows[0].split(',')[0]}, eager channels_last), per step: "
      f"{torch_step:.0f} ms (median of its {3 * steps}-step run); oneDNN primitives "
      f"{sum(theirs.values()):.0f} ms, of which convolutions {conv(theirs):.0f} ms "
      + "(" + ", ".join(f"{k.split(' ', 1)[1]} {theirs.get(k, 0):.0f}" for k in
                        ("convolution forward_training", "convolution backward_data",
                         "convolution backward_weights")) + "). "
      f"gossipgrad's convolutions: {conv(total):.0f} ms. A step 1.5x PyTorch's would take at most "
      f"{torch_step / 1.5:.0f} ms: {torch_step / 1.5 - conv(total):.0f} ms beside gossipgrad's "
      f"convolutions (it spends {step_s * 1e3 - conv(total):.0f}).")
PY
done
mv "$TMP/report.md" "$OUT.md"
cat "$OUT.md"
echo "profile.sh: wrote $OUT.md" >&2
