#!/usr/bin/env bash
# Fresh machine -> dependencies, Release build, and the main job: 2 MPI ranks train resnet8 on
# Fashion-MNIST with configs/laptop.ini. Extra arguments are passed to `gossipgrad train`.
set -euo pipefail
cd "$(dirname "$0")"
. scripts/checks.sh
gg_int RANKS "${RANKS:-2}" 1 4096
./scripts/deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF >/dev/null
cmake --build build --target gossipgrad
RUN="runs/quickstart-$(date +%Y%m%d-%H%M%S)"
RANKS="${RANKS:-2}"
# One core per rank when there are enough: the ranks' compute threads never share a core, which
# keeps partners in step (less waiting in the exchange).
BIND=()
if [ "$RANKS" -le "$(nproc)" ]; then BIND=(-bind-to core); fi
echo "quickstart: mpirun -n $RANKS ${BIND[*]} build/gossip/gossipgrad train --config configs/laptop.ini --log.metrics $RUN/metrics.jsonl --checkpoint.dir $RUN/checkpoint $*"
mpirun -n "$RANKS" "${BIND[@]}" build/gossip/gossipgrad train --config configs/laptop.ini \
  --log.metrics "$RUN/metrics.jsonl" --checkpoint.dir "$RUN/checkpoint" "$@"
python3 - "$RUN/metrics.jsonl" <<'PY'
import json, sys
events = [json.loads(line) for line in open(sys.argv[1])]
evals = [e for e in events if e["event"] == "eval"]
if evals:
    print(f"quickstart: final test top-1 {100 * evals[-1]['top1']:.2f}% after {evals[-1]['epoch']} epochs"
          f" (from {sys.argv[1]})")
else:
    print(f"quickstart: not evaluated (the run stopped before its first evaluation; {sys.argv[1]})")
# Exposed communication: time the steps waited for the exchange over their total, from step 50
# (the first steps build primitives and fill the loader's queue).
steps = [e for e in events if e["event"] == "step" and e["step"] >= 50]
if steps:
    share = sum(e["comm_s"] for e in steps) / sum(e["step_s"] for e in steps)
    print(f"quickstart: exposed communication {100 * share:.2f}% of step time (steps 50+)")
PY
