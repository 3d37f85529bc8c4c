#!/usr/bin/env bash
# Node loss on the cluster in a box: a supervised Fashion-MNIST run on 3 namespace nodes x 1 rank
# loses node 2 mid-epoch. HOW = kill: every process in its namespace (hydra's proxy, the rank, the
# rank's saver) is SIGKILLed at once, as a crashed machine would lose them; the other ranks'
# savers write their states. HOW = cut: its link goes down (ip link set ... down), every process
# alive; every rank's partner times out (gossip.timeout_s 10) and saves, and the launcher's
# notice, which the supervisor then sends, reaches nodes 0 and 1 only: node 2 counts as lost.
# Either way the supervisor relaunches the job on the 2 remaining nodes from their states
# (forward recovery: the lost rank's samples re-sharded), with at most one step redone, and the
# run completes. Everything is torn down also when the test fails. Exit 77 (skip) without
# root/CAP_NET_ADMIN or without the data set.
#
# usage: real_failure_node_test.sh CLUSTER_SH GOSSIPGRAD ROOT [kill|cut]
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=tests/cluster/lib.sh
. "$HERE/lib.sh"
cluster_setup "$1" f
BIN=$2
ROOT=$3
HOW=${4:-kill}
[[ $HOW == kill || $HOW == cut ]] || fail "HOW must be kill or cut, not '$HOW'"
TIMEOUT=30
[[ $HOW == cut ]] && TIMEOUT=10
export OMP_NUM_THREADS=1
[[ -e /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]] || {
    echo "skip: Fashion-MNIST not in /usr/share/datasets/fashion-mnist"
    exit 77
}
cluster_up --nodes 3 --rate none --delay 0 --jitter 0

# The job's launcher: hydra across this cluster's nodes (cluster.sh run). Its name says hydra, so
# supervise asks it for failure notices (-disable-auto-cleanup) and lowers its -n on a relaunch.
cat >"$TMP/mpiexec.hydra-cluster" <<EOF
#!/usr/bin/env bash
opts=()
while [[ \$# -gt 0 && \$1 == -* ]]; do
    case \$1 in
    -n | -np | -ppn) opts+=("\$1" "\$2") && shift 2 ;;
    *) opts+=("\$1") && shift ;;
    esac
done
exec "$CLUSTER" run "\${opts[@]}" -ppn 1 -- "\$@"
EOF
chmod +x "$TMP/mpiexec.hydra-cluster"

last_step() {
    { grep '"event":"step"' "$1" 2>/dev/null || true; } | tail -1 | grep -o '"step":[0-9]*' |
        sed 's/.*://' || true
}

# 220 of the epoch's 312 steps (in steps of 3 ranks; about 240 more at 2 ranks after the loss at
# step 60): enough to train past 70% top-1.
TRAIN=(train --config "$ROOT/configs/laptop.ini" --data.dir /usr/share/datasets/fashion-mnist
    --model.width 4 --train.threads 1 --train.warmup_epochs 0 --train.epochs 1
    --train.max_steps 220 --train.eval_batch 1000 --log.progress false --gossip.consensus_every 0
    --gossip.timeout_s "$TIMEOUT")
# kill: rank 2 stalls itself before step 61 (SIGSTOP), so that the node dies at a known step
# however loaded the machine is (a kill of a running node raced the job's end). cut: the node
# runs on, as its rank must time out by itself; the cut comes after step 60 of 220.
[[ $HOW == kill ]] && TRAIN+=(--fault.stall 2:61)
timeout -k 5 240 "$BIN" supervise --max-restarts 2 -- "$TMP/mpiexec.hydra-cluster" -n 3 \
    "$BIN" "${TRAIN[@]}" --checkpoint.dir "$TMP/ck" --checkpoint.every 50 \
    --log.metrics "$TMP/m.jsonl" >"$TMP/out.log" 2>"$TMP/err.log" &
sup=$!
for _ in $(seq 900); do
    s=$(last_step "$TMP/m.jsonl")
    [[ -n $s && $s -ge 60 ]] && break
    kill -0 $sup 2>/dev/null || fail "the job ended before step 60: $(tail -5 "$TMP/err.log")"
    sleep 0.1
done
[[ -n $s && $s -ge 60 ]] || fail "step 60 not reached in 90 s"
node=$P-n2
stalled() {
    ps -o stat=,args= -p "$(ip netns pids "$node" | paste -sd,)" | grep -q "^T.*gossipgrad train"
}
if [[ $HOW == kill ]]; then
    for _ in $(seq 600); do stalled && break; sleep 0.1; done
    stalled || fail "rank 2 did not stall before step 61 in 60 s"
fi
killed_at=$(date +%s.%N)
if [[ $HOW == kill ]]; then
    pids=$(ip netns pids "$node")
    [[ -n $pids ]] || fail "no process in $node"
    log "node loss: killing every process of $node at step $s: $(echo $pids | wc -w) processes"
    # shellcheck disable=SC2086 # one pid per word
    kill -9 $pids
else
    log "node loss: cutting the link of $node at step $s"
    ip -n "$node" link set "$P-eth" down
fi
wait $sup || fail "supervise exited $?: $(tail -8 "$TMP/err.log")"
grep -q "2 of 3 rank states saved (lost: 2); 2 ranks continue" "$TMP/err.log" ||
    fail "no forward relaunch on the remaining nodes: $(cat "$TMP/err.log")"
grep -q "the job completed after 1 restart(s)" "$TMP/err.log" || fail "did not complete"
if [[ $HOW == cut ]]; then
    grep -q "rank(s) 2 timed out like the others, but the launcher's notice no longer reaches" \
        "$TMP/err.log" || fail "the cut-off node was not found: $(cat "$TMP/err.log")"
fi
python3 - "$TMP/m.jsonl" "$killed_at" "$HOW" <<'PY'
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1])]
faults = [e for e in ev if e["event"] == "fault"]
assert len(faults) == 1, faults
f = faults[0]
assert f["real"] and f["rank"] == 2 and f["strategy"] == "forward", f
assert f["ranks_before"] == 3 and f["ranks_after"] == 2 and f["steps_redone"] <= 1, f
s = [e for e in ev if e["event"] == "summary"][-1]
assert s["ranks"] == 2 and s["top1"] > 0.70, s
print(f"node loss ({sys.argv[3]}): rank 2's node lost at step {f['step']}, {f['steps_redone']} step(s) redone, "
      f"training again on 2 nodes {f['t_unix'] - float(sys.argv[2]):.1f} s after the kill; "
      f"top-1 {s['top1']:.4f}")
PY
cluster_down
log "passed in $((SECONDS - CLUSTER_START)) s"
