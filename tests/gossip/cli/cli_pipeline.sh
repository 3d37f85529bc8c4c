#!/usr/bin/env bash
# gossip.pipeline_weights: the weights exchanged after the update (overlap_model = false), each
# bucket waited for in the next forward just before the first layer that reads it; with no
# gradient exchange each bucket is also updated and sent as soon as backward has its gradients.
# What is mixed does not change: under mpirun -n 4 every rank's loss at every step (log.losses,
# exact %a) and the bytes sent (counted when they leave) are those of the same run without
# pipelining, for the weights alone (fp32, p2p), gradients and weights (both), the weights and
# momentum on the int4 wire through CHOCO's public copies (gossipgrad), the weights every third
# step (model_every 3) and low-rank gossip; a stopped and resumed pipelined run ends in the same
# state files as an uninterrupted one; emulated compute waits for the weights bucket by bucket;
# and what contradicts it is refused in one line (exit 2): overlap_model = true, staleness 1,
# simulate.
set -euo pipefail
BIN="$1"; ROOT="$2"; MPIEXEC="$3"
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
cd "$TMP"
export OMP_NUM_THREADS=1
fail() { echo "FAIL: $*"; for f in *.log; do echo "== $f"; tail -4 "$f"; done; exit 1; }
RUN=(train --config "$ROOT/configs/laptop.ini" --data.source synthetic:1x28x28:10:2000
     --model.width 4 --train.batch 16 --train.threads 1 --log.progress false
     --log.overwrite true --gossip.consensus_every 0 --gossip.overlap_model false)

same() { # name options...: 4 ranks, 30 steps, without and with pipelining
  local name=$1
  shift
  for p in false true; do
    "$MPIEXEC" -n 4 "$BIN" "${RUN[@]}" "$@" --train.max_steps 30 --gossip.pipeline_weights $p \
      --log.losses "$name-$p/loss" --log.metrics "$name-$p.jsonl" > "$name-$p.log" 2>&1 ||
      fail "$name, pipeline_weights $p"
  done
  diff -r "$name-false" "$name-true" > /dev/null || fail "$name: the losses differ"
  [ "$(ls "$name-true" | wc -l)" = 4 ] || fail "$name: not every rank wrote its losses"
  /usr/bin/python3 - "$name-false.jsonl" "$name-true.jsonl" <<'PY' || fail "$name: bytes differ"
import json, sys
sent = [[e["sent_bytes"] for e in map(json.loads, open(p)) if e["event"] == "step"] for p in sys.argv[1:]]
# Pipelined, the weights travel behind the next step's forward (or, with no gradient exchange,
# behind the step's own backward): a step's metrics count what has left by its end, and by the
# last step every round but the last has left.
plain, piped = sent
assert len(plain) == len(piped) == 30 and max(plain) > 0, sent
assert sum(plain) - plain[-1] <= sum(piped) <= sum(plain), sent
PY
  echo "$name: the same losses and bytes, pipelined or not"
}
same model-p2p --gossip.mode model --gossip.transport p2p
same both --gossip.mode both
same gossipgrad-int4-choco --gossip.mode gossipgrad --gossip.model_wire int4 --gossip.choco true \
  --gossip.rotate false
same model-every3 --gossip.mode model --gossip.model_every 3
same lowrank --gossip.mode gossipgrad --gossip.low_rank 1 --gossip.schedule hypercube \
  --gossip.rotate false

# Resume: the checkpoint holds the weights as mixed after the update.
R=("${RUN[@]}" --gossip.mode model --gossip.pipeline_weights true --checkpoint.every 4
   --train.max_steps 16)
"$MPIEXEC" -n 2 "$BIN" "${R[@]}" --checkpoint.dir A > A.log 2>&1 || fail "uninterrupted run"
"$MPIEXEC" -n 2 "$BIN" "${R[@]}" --checkpoint.dir B --train.stop_at 8 > B1.log 2>&1 ||
  fail "stopped run"
"$MPIEXEC" -n 2 "$BIN" "${R[@]}" --checkpoint.dir B --checkpoint.resume auto > B2.log 2>&1 ||
  fail "resumed run"
grep -q "at step 8" B2.log || fail "not resumed at step 8"
for f in A/ckpt-000000000016/rank-*.bin; do
  cmp -s "$f" "B/${f#A/}" || fail "$f and B/${f#A/} differ"
done
echo "exact resume: ok"

# Emulated compute: forward waits for each bucket of the weights.
"$MPIEXEC" -n 2 "$BIN" "${RUN[@]}" --gossip.mode model --gossip.pipeline_weights true \
  --emulate.forward_ms 20 --emulate.backward_ms 40 --train.max_steps 10 --log.metrics emu.jsonl \
  > emu.log 2>&1 || fail "emulated compute"
grep -q '"event": *"summary"' emu.jsonl || fail "emulated compute: no summary"

# Refused in one line, before training.
refused() { # what expected-text options...
  local what=$1 want=$2 out rc=0
  shift 2
  out=$("$BIN" "$@" 2>&1) || rc=$?
  [ "$rc" = 2 ] || fail "$what: exit $rc, not 2: $out"
  [ "$(printf '%s\n' "$out" | wc -l)" = 1 ] || fail "$what: not one line: $out"
  grep -q -- "$want" <<<"$out" || fail "$what: '$out' does not say '$want'"
}
refused "with overlap_model true" "set gossip.overlap_model = false" train --config \
  "$ROOT/configs/laptop.ini" --gossip.pipeline_weights true --dry-run
refused "with staleness 1" "gossip.staleness = 1 never waits" "${RUN[@]}" --gossip.mode model \
  --gossip.pipeline_weights true --gossip.staleness 1 --dry-run
refused "in simulate" "gossip.pipeline_weights" simulate --config "$ROOT/configs/laptop.ini" \
  --ranks 4 --gossip.overlap_model false --gossip.pipeline_weights true
echo "refusals: ok"
