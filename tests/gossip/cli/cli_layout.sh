#!/usr/bin/env bash
# `gossipgrad layout` on one host: the nodes and node-local ranks come from MPI (not from
# SLURM_LOCALID and friends, not from the GG_RANKS_PER_NODE test hook), a config's intended ranks
# per node and GPUs are checked with one warning line each, and usage errors exit 2 with one line.
#
# usage: cli_layout.sh path/to/gossipgrad source-root mpiexec
set -uo pipefail
BIN=$1 ROOT=$2 MPIEXEC=$3
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fail=0
bad() { echo "FAIL: $*" && fail=1; }

# run NAME CMD...: stdout to TMP/NAME.out, stderr to TMP/NAME.err, exit code in RC
run() {
  local name=$1
  shift
  RC=0
  timeout -k 5 60 "$@" >"$TMP/$name.out" 2>"$TMP/$name.err" || RC=$?
}
has() { grep -qx -- "$2" "$TMP/$1" || bad "$1: no line '$2' in: $(cat "$TMP/$1")"; }

run one "$BIN" layout
[[ $RC == 0 ]] || bad "layout without mpirun exited $RC: $(cat "$TMP/one.err")"
has one.out "layout: 1 node, 1 rank, 1 rank per node"

SLURM_LOCALID=3 LOCAL_RANK=3 OMPI_COMM_WORLD_LOCAL_RANK=3 run two "$MPIEXEC" -n 2 "$BIN" layout
[[ $RC == 0 ]] || bad "mpirun -n 2 layout exited $RC: $(cat "$TMP/two.err")"
has two.out "layout: 1 node, 2 ranks, 2 ranks per node"
grep -qx "node 0 .*: 2 ranks (global/local): 0/0 1/1; cpus per rank [0-9]*" "$TMP/two.out" ||
  bad "expected one node with ranks 0/0 1/1: $(cat "$TMP/two.out")"
[[ ! -s $TMP/two.err ]] || bad "layout without a config warned: $(cat "$TMP/two.err")"

# The test hook that fakes nodes for training does not fake them here; it is named.
GG_RANKS_PER_NODE=1 run hook "$MPIEXEC" -n 2 "$BIN" layout
has hook.out "layout: 1 node, 2 ranks, 2 ranks per node"
grep -q "warning: GG_RANKS_PER_NODE=1 is set" "$TMP/hook.err" || bad "no warning about GG_RANKS_PER_NODE: $(cat "$TMP/hook.err")"

run laptop "$MPIEXEC" -n 2 "$BIN" layout --config "$ROOT/configs/laptop.ini"
has laptop.out "config $ROOT/configs/laptop.ini: matches (2 ranks per node)"
[[ ! -s $TMP/laptop.err ]] || bad "laptop.ini at 2 ranks warned: $(cat "$TMP/laptop.err")"

run p100 "$MPIEXEC" -n 2 "$BIN" layout --config "$ROOT/configs/p100-ib.ini"
[[ $RC == 0 ]] || bad "layout with a mismatching config exited $RC"
has p100.err "gossipgrad: warning: 2 ranks per node, but $ROOT/configs/p100-ib.ini intends 4 (network.ranks_per_node)"
! grep -q "matches" "$TMP/p100.out" || bad "p100-ib.ini at 2 ranks on one node 'matches'"

# One rank per GPU: 2 ranks on this node and however many GPUs it has (none, or not 2) warn.
run cuda "$MPIEXEC" -n 2 "$BIN" layout --config "$ROOT/configs/laptop.ini" --train.backend cuda
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
if [[ $ngpu != 2 ]]; then
  [[ $(grep -c "train.backend cuda" "$TMP/cuda.err") == 1 ]] ||
    bad "2 ranks, $ngpu GPUs, backend cuda: expected one warning: $(cat "$TMP/cuda.err")"
fi

run threads "$MPIEXEC" -n 2 "$BIN" layout --config "$ROOT/configs/laptop.ini" --train.threads 1024
grep -q "warning: node 0 .*: a rank may run on [0-9]* CPUs, but .* runs train.threads = 1024" "$TMP/threads.err" ||
  bad "train.threads beyond the CPUs: no warning: $(cat "$TMP/threads.err")"

# Usage errors: exit 2, one line, from rank 0 only.
for args in "--config /nonexistent.ini" "--no-such-option 1" "--network.ranks_per_node x"; do
  # shellcheck disable=SC2086
  run err "$MPIEXEC" -n 2 "$BIN" layout $args
  [[ $RC == 2 && $(wc -l <"$TMP/err.err") == 1 ]] ||
    bad "layout $args: expected exit 2 with one line, got $RC: $(cat "$TMP/err.err")"
  grep -q "^gossipgrad: error: " "$TMP/err.err" || bad "layout $args: $(cat "$TMP/err.err")"
done
run help "$BIN" layout --help
if [[ $RC != 0 ]] || ! grep -q "^usage: mpirun -n P gossipgrad layout" "$TMP/help.out"; then bad "layout --help"; fi

[[ $fail == 0 ]] && echo "ok: gossipgrad layout"
exit $fail
