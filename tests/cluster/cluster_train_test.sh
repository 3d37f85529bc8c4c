#!/usr/bin/env bash
# A short real Fashion-MNIST training (configs/laptop.ini, the default transport auto) on 2
# namespace nodes x 2 ranks (auto: shm within a node, p2p across) ends within 0.5% top-1
# (absolute) of the same run on 1 node x 4 ranks (auto: shm only). The final top-1 comes from
# each run's metrics "summary" event. Everything is torn down also when the test fails. Exit 77
# (skip) without root/CAP_NET_ADMIN or without the data set.
#
# The two runs do the same arithmetic (the transports move the same bytes), so their top-1 agree
# to every printed digit at any length: 100 steps (default) tell as much as more.
#
# usage: cluster_train_test.sh CLUSTER_SH GOSSIPGRAD ROOT [STEPS]
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=tests/cluster/lib.sh
. "$HERE/lib.sh"
cluster_setup "$1" r
BIN=$2
ROOT=$3
STEPS=${4:-100}
export OMP_NUM_THREADS=1
[[ -e /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]] || {
    echo "skip: Fashion-MNIST not in /usr/share/datasets/fashion-mnist"
    exit 77
}

cluster_up --nodes 2 --rate none --delay 0 --jitter 0

# train NAME PPN: 4 ranks, PPN per node (4: all on node 0)
train() {
    local name=$1 ppn=$2 t0=$SECONDS
    cluster_run 240 "$TMP/$name.out" -- -n 4 -ppn "$ppn" -- "$BIN" train \
        --config "$ROOT/configs/laptop.ini" --train.threads 1 --train.max_steps "$STEPS" \
        --log.progress false --log.metrics "$TMP/$name.jsonl"
    log "$name: $(grep '^done' "$TMP/$name.out") [$((SECONDS - t0)) s]"
}
train nodes2x2 2
train node1x4 4

python3 - "$TMP/nodes2x2.jsonl" "$TMP/node1x4.jsonl" <<'PY'
import json, sys
def summary(path):
    events = [e for e in map(json.loads, open(path)) if e["event"] == "summary"]
    assert len(events) == 1, f"{path}: {len(events)} summary events"
    return events[0]
a, b = summary(sys.argv[1]), summary(sys.argv[2])
for s in (a, b):
    assert s["ranks"] == 4, f"summary of {s['ranks']} ranks, expected 4"
print(f"top-1: 2 nodes x 2 ranks {100 * a['top1']:.2f}%, 1 node x 4 ranks {100 * b['top1']:.2f}%, "
      f"difference {100 * (a['top1'] - b['top1']):+.2f}%")
assert abs(a["top1"] - b["top1"]) <= 0.005, "the 2-node run is more than 0.5% from the 1-node run"
PY
cluster_down
log "passed in $((SECONDS - CLUSTER_START)) s"
