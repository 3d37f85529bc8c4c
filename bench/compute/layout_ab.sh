#!/usr/bin/env bash
# bench/compute/layout_ab.sh: what keeping the weights in oneDNN's blocked layout buys, as
# gossipgrad train does by default (train.weight_layout = native), against the plain layout
# reordered every step. Alternates `gg_bench_compute --layout plain` and `--layout native` REPEATS
# times per setting and prints, per layout, the minimum, 10th percentile and median of every
# timed step of all its runs (this VM's speed drifts between runs; the low percentiles show the
# cost of the work itself best), and the median over the repeats of one variant's median step over
# the other's in the same repeat (the pairs run back to back, so drift between repeats cancels).
# With OLD=<a build directory>, alternates that build's
# gg_bench_compute ("old") and BUILD's ("new") instead, both in the native layout: a change's step
# against the step before it, run the same way (build the old one with bench/compute/common.sh's
# build_bench in a worktree of the old commit).
# Usage: bench/compute/layout_ab.sh [MODEL:BATCH:RES:THREADS:PRECISION ...]
#   default: resnet50:16:64:2:fp32 resnet50:16:64:2:bf16 resnet50:16:224:2:fp32
# Environment: REPEATS (default 3), STEPS (timed steps per run, default 15), BUILD (default build),
#   OLD (a second build to alternate with BUILD; default none: the two layouts).
set -euo pipefail
cd "$(dirname "$0")/../.."
SETTINGS=("${@:-resnet50:16:64:2:fp32 resnet50:16:64:2:bf16 resnet50:16:224:2:fp32}")
read -r -a SETTINGS <<<"${SETTINGS[*]}"
REPEATS=${REPEATS:-3}
STEPS=${STEPS:-15}
. scripts/checks.sh
gg_int REPEATS "$REPEATS" 1
gg_int STEPS "$STEPS" 1
BUILD=${BUILD:-build}
OLD=${OLD:-}
VARIANTS=(plain native)
if [ -n "$OLD" ]; then
  if [ ! -x "$OLD/bench/gg_bench_compute" ]; then
    echo "layout_ab.sh: OLD = '$OLD' holds no bench/gg_bench_compute: build it there first" >&2
    exit 2
  fi
  VARIANTS=(old new)
fi
. bench/compute/common.sh
build_bench "$BUILD" gg_bench_compute
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
echo "# $(date -u +%FT%TZ) $(hostname), $(nproc) cores; repeats=$REPEATS steps=$STEPS warmup=3"
echo "${OLD:+old: $OLD, new: $BUILD}"
echo "| setting | $([ -n "$OLD" ] && echo build || echo layout) | steps | min s | p10 s | median s" \
  "| ${VARIANTS[1]} / ${VARIANTS[0]}, each repeat's run medians paired: median (range) |"
echo "|---|---|---|---|---|---|---|"
for s in "${SETTINGS[@]}"; do
  IFS=: read -r model batch res threads precision <<<"$s"
  : >"$TMP/steps"
  for ((r = 1; r <= REPEATS; r++)); do
    for layout in "${VARIANTS[@]}"; do
      echo "layout_ab.sh: $s $layout run $r/$REPEATS" >&2
      bin=$BUILD layout_arg=$layout
      [ "$layout" = old ] && bin=$OLD
      [ -n "$OLD" ] && layout_arg=native
      # gg_bench_compute reports every step on stderr ("step i/n t s"); the warm-up ones are left
      # out. A run it refuses ends the script with its reason in one line (it ended silently).
      rc=0
      OMP_NUM_THREADS=$threads "$bin/bench/gg_bench_compute" --model "$model" --batch "$batch" \
        --res "$res" --threads "$threads" --steps "$STEPS" --warmup 3 --precision "$precision" \
        --layout "$layout_arg" 2>"$TMP/err" >/dev/null || rc=$?
      if [ "$rc" != 0 ]; then
        echo "layout_ab.sh: gg_bench_compute failed for $s ($layout, exit $rc):" \
          "$(tool_reason "$TMP/err")" >&2
        exit "$rc"
      fi
      tr '\r' '\n' <"$TMP/err" | grep -o 'step [0-9]*/[0-9]* [0-9.]*' |
        awk -v l="$layout" -v r="$r" '{ split($2, a, "/"); if (a[1] > 3) print l, $3, r }' \
          >>"$TMP/steps"
    done
  done
  /usr/bin/python3 - "$TMP/steps" "$s" "${VARIANTS[@]}" <<'PY'
import statistics, sys
times, runs = {}, {}
for line in open(sys.argv[1]):
    layout, t, r = line.split()
    times.setdefault(layout, []).append(float(t))
    runs.setdefault((layout, r), []).append(float(t))
first, second = sys.argv[3:5]
# Each repeat's second variant over its first, run back to back: the VM's drift between repeats
# cancels in the pair.
pairs = sorted(statistics.median(runs[(second, r)]) / statistics.median(runs[(first, r)])
               for (l, r) in runs if l == first and (second, r) in runs)
for layout in sys.argv[3:]:
    v = sorted(times.get(layout, []))
    if not v:
        sys.exit(f"layout_ab.sh: no steps for {sys.argv[2]} {layout}")
    pair = (f"{statistics.median(pairs):.3f} ({pairs[0]:.3f}-{pairs[-1]:.3f})"
            if layout == second and pairs else "")
    print(f"| {sys.argv[2]} | {layout} | {len(v)} | {v[0]:.3f} | {v[len(v) // 10]:.3f} | "
          f"{statistics.median(v):.3f} | {pair} |")
PY
done
