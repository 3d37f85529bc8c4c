#!/usr/bin/env bash
# The gossip transports across real (namespace) nodes of the cluster in a box: the MPI gossip
# test (tests/gossip/comm/mpi_gossip.cpp) on 2 nodes with 1 and 3 ranks per node and on 3 nodes
# with 1 and 2 ranks per node. In each job every transport that can cross nodes (p2p, rma,
# auto) delivers exactly (mine + partner's) / 2 and follows the simulator step by step; shm is
# refused on every rank with its one-line error; and each transport's own counters show that
# every peer's buckets went where they should: auto over shm to the ranks of this node only and
# over p2p to the other nodes only. Here the script also checks that the job saw the expected
# number of nodes, the refusal line, and auto's totals (shm only where a node has 2+ ranks).
# Everything is torn down also when the test fails. Exit 77 (skip) without root/CAP_NET_ADMIN.
#
# usage: cluster_gossip_test.sh CLUSTER_SH MPI_GOSSIP_BINARY
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=tests/cluster/lib.sh
. "$HERE/lib.sh"
cluster_setup "$1" g
BIN=$2
export OMP_NUM_THREADS=1

# gossip NODES PPN: the MPI gossip test as NODES * PPN ranks, PPN per node
gossip() {
    local nodes=$1 ppn=$2 np=$(($1 * $2)) out
    out=$TMP/gossip-$nodes-$ppn.out
    cluster_run 240 "$out" -- -n "$np" -ppn "$ppn" -- "$BIN"
    grep -qx "gossip exchange on $np ranks, $nodes nodes: PASS" "$out" ||
        { cat "$out" >&2; fail "$nodes nodes x $ppn: no PASS line for $np ranks on $nodes nodes"; }
    grep -q "^shm across nodes *refused: the shm transport needs every rank on one node" "$out" ||
        { cat "$out" >&2; fail "$nodes nodes x $ppn: shm was not refused across nodes"; }
    local shm rma p2p
    read -r shm rma p2p < <(sed -n 's/^auto\/counters  *buckets sent: shm \([0-9]*\), rma \([0-9]*\), p2p \([0-9]*\)$/\1 \2 \3/p' "$out")
    [[ -n ${p2p:-} ]] || { cat "$out" >&2; fail "$nodes nodes x $ppn: no auto/counters line"; }
    ((p2p > 0 && rma == 0)) || fail "$nodes nodes x $ppn: auto sent p2p $p2p, rma $rma buckets"
    if ((ppn == 1)); then
        ((shm == 0)) || fail "$nodes nodes x 1: auto sent $shm buckets over shm with one rank per node"
    else
        ((shm > 0)) || fail "$nodes nodes x $ppn: auto sent nothing over shm"
    fi
    log "$nodes nodes x $ppn ranks: p2p, rma and auto exact, shm refused; auto buckets: shm $shm, p2p $p2p"
}

log "2 nodes (prefix $P)"
cluster_up --nodes 2 --rate none --delay 0 --jitter 0
gossip 2 1
gossip 2 3
cluster_down

log "3 nodes"
cluster_up --nodes 3 --rate none --delay 0 --jitter 0
gossip 3 1
gossip 3 2
cluster_down
log "passed in $((SECONDS - CLUSTER_START)) s"
