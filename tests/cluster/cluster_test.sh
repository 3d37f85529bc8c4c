#!/usr/bin/env bash
# The cluster in a box (bench/cluster/cluster.sh), twice up and down:
#   1. 2 nodes: up, a second up is refused and changes nothing, status, an MPI job with
#      -n 4 -ppn 2 (each node's ranks form one node communicator of 2, on their own host
#      name and network namespace; 8 MiB crosses between the nodes and is checked byte by
#      byte; the environment reaches the ranks), then shape --rate 200mbit and a timed
#      24 MiB transfer between the nodes that must take at least 70% of size/rate; down.
#   2. 3 nodes: up, an MPI job with -n 3 -ppn 1, a process left running in a node as after
#      a crash, down (which ends it), and a second down with nothing to remove.
# After each down, `ip netns list` has nothing of the run's prefix. Everything is torn down
# also when the test fails. Exit 77 (skip) without root/CAP_NET_ADMIN, mpicc or hydra.
#
# usage: cluster_test.sh [path/to/cluster.sh]
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CLUSTER=${1:-$HERE/../../bench/cluster/cluster.sh}
export GG_CLUSTER_PREFIX=ggt$$ # at most 10 characters: pid_max is at most 4194304
P=$GG_CLUSTER_PREFIX
START=$SECONDS

fail() {
    echo "FAIL: $*" >&2
    exit 1
}
log() { echo "[$((SECONDS - START))s] $*"; }

# (ip netns list can complain about a namespace that another run deletes meanwhile)
ours() { { ip netns list 2>/dev/null || true; } | awk '{print $1}' | { grep "^$P-" || true; } | sort | tr '\n' ' '; }

TMP=$(mktemp -d "${TMPDIR:-/tmp}/cluster_test.XXXXXX")
cleanup() {
    local rc=$?
    "$CLUSTER" down >/dev/null 2>&1 || true
    rm -rf "$TMP"
    local left
    left=$(ours)
    if [[ -n $left ]]; then
        echo "FAIL: namespaces of $P left after cleanup: $left" >&2
        rc=1
    fi
    exit "$rc"
}
trap cleanup EXIT
trap "exit 143" TERM INT HUP

# Skips: cluster.sh says why (exit 77) when it cannot make namespaces.
rc=0
"$CLUSTER" down >/dev/null || rc=$?
[[ $rc == 77 ]] && exit 77
[[ $rc == 0 ]] || fail "cluster.sh down with nothing up exited $rc"
command -v mpicc >/dev/null || {
    echo "skip: mpicc not found"
    exit 77
}

expect_namespaces() { # expected list, sorted, space separated
    local got
    got=$(ours)
    [[ $got == "$1" ]] || fail "namespaces of $P: expected '$1', found '$got'"
}

mpicc -O2 -o "$TMP/mpi_nodes" "$HERE/mpi_nodes.c"

# run_job NP PPN NODES MIB [ONEWAY_MIB]: run mpi_nodes, check the ranks' placement
run_job() {
    local np=$1 ppn=$2 nodes=$3 mib=$4 oneway=${5:-0} out rc=0
    out=$TMP/job.out
    GG_CLUSTER_TEST_ENV=reached$$ timeout -k 5 90 \
        "$CLUSTER" run -n "$np" -ppn "$ppn" -- "$TMP/mpi_nodes" "$mib" "$oneway" >"$out" 2>&1 || rc=$?
    if [[ $rc != 0 ]]; then
        cat "$out" >&2
        [[ $rc == 124 ]] && fail "run -n $np -ppn $ppn did not end within 90 s"
        fail "run -n $np -ppn $ppn exited $rc"
    fi
    grep -qx ok "$out" || { cat "$out" >&2; fail "run -n $np -ppn $ppn: no 'ok' line"; }
    [[ $(grep -c '^rank ' "$out") == "$np" ]] || { cat "$out" >&2; fail "expected $np rank lines"; }
    local r size host netns env node
    declare -A ns_of_node=()
    declare -A node_of_ns=()
    while read -r _ r _ size _ host _ netns _ env; do
        node=$((r / ppn))
        [[ $size == "$ppn" ]] || fail "rank $r: node communicator of $size ranks, expected $ppn"
        [[ $host == "$P-n$node" ]] || fail "rank $r: host name '$host', expected $P-n$node"
        [[ $env == "reached$$" ]] || fail "rank $r: GG_CLUSTER_TEST_ENV is '$env', not passed on"
        if [[ -n ${ns_of_node[$node]:-} ]]; then
            [[ ${ns_of_node[$node]} == "$netns" ]] || fail "rank $r: another network namespace than its node's other ranks"
        else
            [[ -z ${node_of_ns[$netns]:-} ]] || fail "rank $r: node $node shares a network namespace with node ${node_of_ns[$netns]}"
            ns_of_node[$node]=$netns
            node_of_ns[$netns]=$node
        fi
    done < <(grep '^rank ' "$out")
    [[ ${#ns_of_node[@]} == "$nodes" ]] || fail "ranks ran on ${#ns_of_node[@]} nodes, expected $nodes"
    log "run -n $np -ppn $ppn on $nodes nodes: node communicators of $ppn, $mib MiB between nodes checked"
}

# ---- round 1: 2 nodes -----------------------------------------------------------------
log "round 1: up --nodes 2 (prefix $P)"
"$CLUSTER" up --nodes 2 --rate 1gbit
expect_namespaces "$P-n0 $P-n1 $P-sw "
rc=0
err=$("$CLUSTER" up --nodes 3 2>&1) || rc=$?
[[ $rc == 1 && $err == *"already up"* ]] || fail "second up: exit $rc, '$err' (expected exit 1, 'already up')"
[[ $(wc -l <<<"$err") == 1 ]] || fail "second up: more than one line: $err"
expect_namespaces "$P-n0 $P-n1 $P-sw "
status=$("$CLUSTER" status 2>/dev/null)
grep -q "^node $P-n1: $P-eth 10.213.0.2/24" <<<"$status" || fail "status: no line for $P-n1: $status"
grep -q "rate 1Gbit" <<<"$status" || fail "status: no 1Gbit class: $status"
# nothing of the cluster in the root namespace
links=$(ip -o link show)
grep -q "$P-" <<<"$links" && fail "an interface of $P in the root namespace"

run_job 4 2 2 8

"$CLUSTER" shape --rate 200mbit 2>/dev/null
status=$("$CLUSTER" status 2>/dev/null)
grep -q "rate 200Mbit" <<<"$status" || fail "status after shape: no 200Mbit class: $status"
run_job 2 1 2 1 24
read -r _ bytes seconds mbits < <(grep '^oneway ' "$TMP/job.out")
min=$(awk -v b="$bytes" 'BEGIN { printf "%.3f", 0.7 * b * 8 / 200e6 }')
awk -v s="$seconds" -v m="$min" 'BEGIN { exit !(s >= m) }' ||
    fail "24 MiB across a 200mbit link took $seconds s (${mbits} Mbit/s), less than $min s: the shaping does not apply"
log "shaped to 200mbit: $bytes bytes in $seconds s ($mbits Mbit/s; lower bound $min s)"

"$CLUSTER" down
expect_namespaces ""
log "round 1: down, nothing of $P left"

# ---- round 2: 3 nodes -----------------------------------------------------------------
log "round 2: up --nodes 3"
"$CLUSTER" up --nodes 3 --rate 1gbit --delay 0 --jitter 0
expect_namespaces "$P-n0 $P-n1 $P-n2 $P-sw "
run_job 3 1 3 8

# a process left in a node, as after a crashed job: down ends it
ip netns exec "$P-n1" sleep 300 &
sleeper=$!
sleep 0.2
[[ -n $(ip netns pids "$P-n1") ]] || fail "the left-over process is not in $P-n1"
"$CLUSTER" down
expect_namespaces ""
sleep 0.2
kill -0 "$sleeper" 2>/dev/null && fail "down left the process in $P-n1 running"
wait "$sleeper" 2>/dev/null || true
out=$("$CLUSTER" down)
[[ $out == *"nothing to remove"* ]] || fail "second down: '$out'"
expect_namespaces ""
compgen -G "${TMPDIR:-/tmp}/$P-run.*" >/dev/null && fail "run left its temporary folder"
log "round 2: down (a left-over process ended), second down has nothing to remove; passed in $((SECONDS - START)) s"
