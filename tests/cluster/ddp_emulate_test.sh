#!/usr/bin/env bash
# bench/cluster/ddp_emulate.py, the DDP baseline with emulated compute:
#   1. usage errors exit 2 with one line (PowerSGD over several buckets among them); a
#      rendezvous nobody answers exits 1 with one line naming it, within its --timeout-s.
#   2. On a 2-node cluster in a box (cluster.sh, 1gbit links), 2 ranks run real DDP over
#      gloo with resnet50's parameters for 3 measured steps. The JSON says emulated, has
#      resnet50's 25557032 parameters (102228128 gradient bytes) in several DDP buckets that
#      add up to them, 3 step times, and a median step no shorter than the emulated compute
#      nor than 70% of the time the gradient bytes take over the 1gbit link (the shaping
#      applies to DDP's all-reduce); exposed comm and images/s follow from the medians.
# The cluster is torn down also when the test fails. Exit 77 (skip) without root/namespaces,
# hydra, or PyTorch/torchvision for /usr/bin/python3.
#
# usage: ddp_emulate_test.sh [path/to/bench/cluster]
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BENCH=${1:-$HERE/../../bench/cluster}
CLUSTER=$BENCH/cluster.sh
EMULATE=$BENCH/ddp_emulate.py
PY=/usr/bin/python3
export GG_CLUSTER_PREFIX=gge$$ # at most 10 characters: pid_max is at most 4194304
P=$GG_CLUSTER_PREFIX
START=$SECONDS

fail() {
    echo "FAIL: $*" >&2
    exit 1
}
log() { echo "[$((SECONDS - START))s] $*"; }

TMP=$(mktemp -d "${TMPDIR:-/tmp}/ddp_emulate_test.XXXXXX")
cleanup() {
    local rc=$?
    "$CLUSTER" down >/dev/null 2>&1 || true
    rm -rf "$TMP"
    exit "$rc"
}
trap cleanup EXIT
trap "exit 143" TERM INT HUP

if ! [[ -x $PY ]] || ! "$PY" -c "import torch, torchvision, numpy" 2>/dev/null; then
    echo "skip: /usr/bin/python3 has no torch, torchvision or numpy"
    exit 77
fi

# ---- 1. errors, no cluster needed ------------------------------------------------------
# expect_error RC PATTERN ARGS...: exit RC and one line on stderr matching PATTERN
expect_error() {
    local want=$1 pattern=$2 rc=0
    shift 2
    "$@" >"$TMP/out" 2>"$TMP/err" || rc=$?
    [[ $rc == "$want" ]] || fail "$* exited $rc, expected $want: $(cat "$TMP/err")"
    [[ $(wc -l <"$TMP/err") == 1 ]] || fail "$*: not one line on stderr: $(cat "$TMP/err")"
    grep -q -- "$pattern" "$TMP/err" || fail "$*: '$(cat "$TMP/err")' does not say '$pattern'"
}
expect_error 2 "--jitter must be a p99 factor" "$PY" "$EMULATE" --jitter 0.5
expect_error 2 "--slow item '3x'" "$PY" "$EMULATE" --slow 3x
expect_error 2 "unrecognized arguments: --bogus" "$PY" "$EMULATE" --bogus
expect_error 2 "not a torchvision model" "$PY" "$EMULATE" --model nosuchnet
expect_error 2 "names rank 5, but the world has 2" \
    env RANK=0 WORLD_SIZE=2 "$PY" "$EMULATE" --slow 5:2
# The baselines' bound on a step (bench/pylib/step_watchdog.py): a step that never ends stops the
# process with one line, exit 1 (a PowerSGD hang outlived gloo's own timeout).
expect_error 1 "probe: step 1 took more than 0.5 s" "$PY" -c "import sys, time
sys.path.insert(0, '$BENCH/../pylib')
from step_watchdog import StepWatchdog
w = StepWatchdog('probe', 0.5)
w.arm(0)
time.sleep(10)"
# PowerSGD over several buckets: gloo aborts or hangs (torch 1.13 and 2.15): refused up front
expect_error 2 "--compress powersgd needs one bucket: --bucket-cap-mb >= 98" \
    "$PY" "$EMULATE" --compress powersgd
# rank 1 of 2 with no rank 0: the rendezvous fails within its timeout
t0=$SECONDS
expect_error 1 "rendezvous of 2 ranks at 127.0.0.1:1 failed" \
    env RANK=1 WORLD_SIZE=2 "$PY" "$EMULATE" --master-port 1 --timeout-s 2
((SECONDS - t0 < 30)) || fail "a failed rendezvous with --timeout-s 2 took $((SECONDS - t0)) s"
log "usage errors exit 2, a failed rendezvous exits 1, each with one line"

# ---- 2. DDP across 2 nodes -------------------------------------------------------------
rc=0
"$CLUSTER" down >/dev/null || rc=$?
[[ $rc == 77 ]] && exit 77
[[ $rc == 0 ]] || fail "cluster.sh down with nothing up exited $rc"
"$CLUSTER" up --nodes 2 --rate 1gbit 2>/dev/null
rc=0
timeout -k 5 150 "$CLUSTER" run -n 2 -ppn 1 -- "$PY" "$EMULATE" --master-addr 10.213.0.1 \
    --ifname "$P-eth" --forward-ms 20 --backward-ms 40 --update-ms 5 --steps 3 --warmup 1 \
    --batch 32 --json-out "$TMP/ddp.json" >"$TMP/run.out" 2>&1 || rc=$?
[[ $rc == 77 ]] && { cat "$TMP/run.out"; exit 77; }
[[ $rc == 0 ]] || { cat "$TMP/run.out" >&2; fail "the 2-rank run exited $rc"; }
grep -q "^ddp_emulate.py: resnet50 on 2 ranks: median step" "$TMP/run.out" ||
    { cat "$TMP/run.out" >&2; fail "no final line from rank 0"; }

"$PY" - "$TMP/ddp.json" <<'EOF' || fail "the JSON does not hold (above)"
import json, sys

d = json.load(open(sys.argv[1]))
def check(ok, what):
    if not ok:
        sys.exit(f"{what}: {json.dumps({k: v for k, v in d.items() if k != 'step_s'})}")

check(d["emulated"] is True, "emulated is not true")
check(d["model"] == "resnet50" and d["world_size"] == 2, "model or world size")
check(d["param_count"] == 25557032 and d["gradient_bytes"] == 102228128,
      "resnet50 has 25557032 parameters, 102228128 gradient bytes")
check(d["ddp_bucket_cap_mb"] == 25, "DDP's default bucket cap is 25 MB")
b = d["ddp_bucket_bytes"]
check(len(b) > 1 and sum(b) == d["gradient_bytes"], "DDP's buckets hold every gradient byte")
check(len(d["step_s"]) == 3, "3 measured steps")
compute = (20 + 40 + 5) / 1e3
check(abs(d["compute_s"] - compute) < 1e-9, "compute per step is forward+backward+update")
link_s = 0.7 * d["gradient_bytes"] * 8 / 1e9
check(d["median_step_s"] >= max(compute, link_s),
      f"median step shorter than the compute or than {link_s:.3f} s on the link")
check(abs(d["exposed_comm_s"] - (d["median_step_s"] - d["compute_s"])) < 1e-9,
      "exposed comm = median step - compute")
check(abs(d["images_per_s"] - 32 * 2 / d["median_step_s"]) < 1e-6,
      "images/s = batch * world / median step")
print(f"median step {d['median_step_s']:.3f} s, exposed comm {d['exposed_comm_s']:.3f} s, "
      f"buckets {b}")
EOF
"$CLUSTER" down >/dev/null
log "2 ranks on 2 nodes: DDP ran 3 steps over the shaped link, the JSON holds; passed"
