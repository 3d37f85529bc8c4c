#!/usr/bin/env bash
# Every refusal of an option combination happens before MPI starts in a one-process run: run
# here without mpirun and with PMI_PORT pointing at no launcher (MPI_Init would fail there with
# MPICH's own lines and exit 15), each combination must end with gossipgrad's one line and exit
# 2. (Several ranks under a launcher agree on the same checks' verdict over MPI instead, so that
# an MPMD part with other options cannot leave the others waiting in MPI_Init: cli_agree.sh.)
set -uo pipefail
BIN="$1"; ROOT="$2"
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
cd "$TMP"
fail=0
# refused RANKS PATTERN -- OPTIONS...
refused() {
  local ranks="$1" pattern="$2"; shift 3
  PMI_PORT=127.0.0.1:1 PMI_RANK=0 PMI_SIZE="$ranks" timeout 60 \
    "$BIN" train --config "$ROOT/configs/laptop.ini" --log.progress false "$@" >out 2>&1
  local rc=$? lines; lines=$(wc -l <out)
  if [ "$rc" -ne 2 ] || [ "$lines" -ne 1 ] || ! grep -q "^gossipgrad: error: .*$pattern" out; then
    echo "FAIL ($ranks ranks) $*: exit $rc, $lines lines:"; cat out; fail=1
  else
    echo "ok: $* -> $(cat out)"
  fi
}
refused 1 "gossip.wire = bf16 is the gradients' wire" -- --gossip.mode model --gossip.wire bf16
refused 1 "gossip.model_wire = bf16 is the weights' wire" -- --gossip.mode grad \
  --gossip.model_wire bf16
refused 1 "allreduce always waits" -- --gossip.mode allreduce --gossip.staleness 1
refused 1 "set gossip.overlap_model = false" -- --gossip.mode both --gossip.staleness 1
refused 1 "gossip.late = skip is for buckets" -- --gossip.late skip
refused 1 "gossip.model_every spaces out" -- --gossip.mode grad --gossip.model_every 2
refused 1 "gossip.hierarchy = node mixes gradients only" -- --gossip.hierarchy node
refused 1 "gossip.hierarchy = node sends fp32" -- --gossip.hierarchy node --gossip.mode grad \
  --gossip.wire bf16
refused 1 "train.precision = bf16 needs train.backend" -- --train.precision bf16 \
  --train.backend reference
refused 1 "checkpoint.every = 5 needs checkpoint.dir" -- --checkpoint.every 5
refused 1 "fault.kill" -- --fault.kill 5:3
refused 1 "out of range" -- --gossip.staleness 2
# Issue 52 row 7: options the run cannot honour, refused like gossip.model_every above.
for mode in grad allreduce; do
  refused 1 "gossip.pipeline_weights = true waits" -- --gossip.mode $mode \
    --gossip.overlap_model false --gossip.pipeline_weights true
done
refused 1 "gossip.global_every = 5 averages" -- --gossip.mode allreduce --gossip.global_every 5
refused 1 "virtual_ranks = 4: gossip.transport = rma" -- --train.virtual_ranks 4 \
  --gossip.transport rma
refused 1 "virtual_ranks = 4: gossip.threading = concurrent" -- --train.virtual_ranks 4 \
  --gossip.threading concurrent
# The check itself can fail: the same environment makes MPI_Init fail for an accepted config.
PMI_PORT=127.0.0.1:1 PMI_RANK=0 PMI_SIZE=1 timeout 60 "$BIN" train --config "$ROOT/configs/laptop.ini" \
  --train.max_steps 1 --log.progress false >out 2>&1
rc=$?
if [ "$rc" -eq 0 ] || [ "$rc" -eq 2 ] || ! grep -q "MPI_Init" out; then
  echo "FAIL: an accepted config did not reach a failing MPI_Init (exit $rc):"; cat out; fail=1
else
  echo "ok: an accepted config reaches MPI_Init, which fails here (exit $rc)"
fi
exit $fail
