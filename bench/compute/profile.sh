#!/usr/bin/env bash
# bench/compute/profile.sh: where a training step of the oneDNN backend spends its time, from
# oneDNN's own timing of every primitive it executes (ONEDNN_VERBOSE=1, oneDNN 2.x). Runs
# gg_bench_compute for each setting and writes bench/results/compute-profile-<host>.md: the
# milliseconds per step by primitive kind (convolution forward / backward-data /
# backward-weights, batch norm, sum, ...) and the reorders split by what they move (weights
# into a primitive's layout, weight gradients back to the flat buffer's, activations), with each
# one's share of the primitives' total. The step's wall time is printed beside it: host work
# (loss, NaN checks, running statistics) is the difference.
# Usage: bench/compute/profile.sh [MODEL:BATCH:RES:THREADS:PRECISION ...]
#   default: resnet50:16:64:2:bf16 resnet50:16:64:2:fp32 resnet50:16:224:2:fp32
#   resnet50:16:224:2:bf16
# Environment: STEPS (profiled steps after one warm-up step, default 2), BUILD (default build).
set -euo pipefail
cd "$(dirname "$0")/../.."
SETTINGS=("${@:-resnet50:16:64:2:bf16 resnet50:16:64:2:fp32 resnet50:16:224:2:fp32 resnet50:16:224:2:bf16}")
read -r -a SETTINGS <<<"${SETTINGS[*]}"
STEPS=${STEPS:-2}
BUILD=${BUILD:-build}
if [ ! -x "$BUILD/bench/gg_bench_compute" ]; then
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGG_BENCH=ON >/dev/null
  cmake --build "$BUILD" --target gg_bench_compute
fi
OUT=bench/results/compute-profile-$(hostname)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
{
  echo "# oneDNN primitive time per training step ($(date -u +%F), $(hostname), $(nproc) cores)"
  echo
  echo "Command: \`bench/compute/profile.sh ${SETTINGS[*]}\` (STEPS=$STEPS after 1 warm-up step;"
  echo "ONEDNN_VERBOSE=1 times each primitive, which adds a little to every call)."
} >"$OUT.md"
for s in "${SETTINGS[@]}"; do
  IFS=: read -r model batch res threads precision <<<"$s"
  echo "profile.sh: $model batch $batch ${res}px $threads threads $precision" >&2
  ONEDNN_VERBOSE=1 OMP_NUM_THREADS=$threads "$BUILD/bench/gg_bench_compute" --model "$model" \
    --batch "$batch" --res "$res" --threads "$threads" --steps "$STEPS" --warmup 1 \
    --precision "$precision" >"$TMP/verbose.txt" 2>"$TMP/err.txt"
  /usr/bin/python3 - "$TMP/verbose.txt" "$STEPS" "$batch" "$s" >>"$OUT.md" <<'PY'
import collections, sys
path, steps, batch, setting = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
lines = open(path).read().splitlines()
execs = [l.split(",") for l in lines if l.startswith("onednn_verbose,exec,")]
result = [l for l in lines if l.startswith("gossipgrad-onednn,")]
if not execs or not result:
    sys.exit(f"profile.sh: no oneDNN timings for {setting} (is oneDNN built with verbose?)")
per_step = len(execs) // (steps + 1)  # every step executes the same primitives
execs = execs[-per_step * steps:]     # the warm-up step's first executions are left out
total = collections.Counter()
for f in execs:
    prim, prop, descs, shape, ms = f[3], f[5], f[6], f[-2], float(f[-1])
    if prim == "reorder":
        # "src_f32::blocked:ABcd16b16a:f0 dst_f32::blocked:abcd:f0": the format tags. Weights
        # block dimension a (output channels); activations never block a (the batch).
        src, dst = [d.split(":")[3] for d in descs.split(" ")[:2]]
        weights = "A" in src or "A" in dst or (src.islower() and dst.islower() and
                                               not shape.startswith(batch + "x"))
        if not weights:
            key = "reorder: activations"
        elif dst.islower() and not src.islower():
            key = "reorder: weight gradients to the flat buffer's layout"
        else:
            key = "reorder: weights into the primitive's layout"
    else:
        key = f"{prim} {prop}".replace(" undef", "")
    total[key] += ms / steps
prims = sum(total.values())
step_s = float(result[0].split(",")[6])
print(f"\n## {setting.replace(':', ' ')}\n")
print(f"Step (median, timed by gg_bench_compute): {step_s * 1e3:.0f} ms; oneDNN primitives: "
      f"{prims:.0f} ms.\n")
print("| primitive | ms per step | share of primitives |")
print("|---|---|---|")
for k, v in total.most_common():
    print(f"| {k} | {v:.1f} | {100 * v / prims:.1f}% |")
PY
done
cat "$OUT.md"
echo "profile.sh: wrote $OUT.md" >&2
