#!/usr/bin/env bash
# gossip.mode = gossipgrad (the authors' GossipGraD: weights and SGD momentum mixed with the
# partner after the update), added as one registry line (gossip/config/algorithms.cpp): at p = 3
# it trains, sends twice the bytes of `model` (the momentum travels with the weights), differs
# from `model` (at p = 3 mixing the momentum changes the numbers), and a run stopped at step 10
# and resumed gives the uninterrupted run's losses bit for bit, overlapped (the momentum's
# correction in flight at the checkpoint) and not.
set -euo pipefail
BIN="$1"; ROOT="$2"; MPIEXEC="$3"
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
cd "$TMP"
export OMP_NUM_THREADS=1
fail() { echo "FAIL: $*"; for f in *.log; do echo "== $f"; tail -4 "$f"; done; exit 1; }
RUN=(train --config "$ROOT/configs/laptop.ini" --model.name cnn --model.width 4
     --train.epochs 1 --train.eval_batch 2000 --train.threads 1 --log.progress false
     --gossip.consensus_every 0 --gossip.timeout_s 30 --train.max_steps 20)
run() {  # NAME ARGS...
  local name="$1"; shift
  timeout 120 "$MPIEXEC" -n 3 "$BIN" "${RUN[@]}" --log.metrics "$name.jsonl" "$@" \
    > "$name.log" 2>&1 || fail "$name: exit $?"
}
losses() { python3 -c 'import json,sys
for l in open(sys.argv[1]):
  j = json.loads(l)
  if j["event"] == "step": print(j["step"], repr(j["loss"]), j["sent_bytes"])' "$1"; }
run model --gossip.mode model
for overlap in true false; do
  run "gg-$overlap" --gossip.mode gossipgrad --gossip.overlap_model "$overlap"
  run "stop-$overlap" --gossip.mode gossipgrad --gossip.overlap_model "$overlap" \
    --checkpoint.dir "ck-$overlap" --train.stop_at 10 || true
  run "resumed-$overlap" --gossip.mode gossipgrad --gossip.overlap_model "$overlap" \
    --checkpoint.dir "ck-$overlap" --checkpoint.resume auto
  # Steps 10..19 of the resumed run equal the uninterrupted run's.
  diff <(losses "gg-$overlap.jsonl" | awk '$1 >= 10 {print $1, $2}') \
       <(losses "resumed-$overlap.jsonl" | awk '{print $1, $2}') \
    || fail "overlap $overlap: the resumed run's losses differ from the uninterrupted run's"
  [ "$(losses "resumed-$overlap.jsonl" | wc -l)" = 10 ] || fail "overlap $overlap: resumed steps"
done
python3 - model.jsonl gg-true.jsonl <<'PY' || fail "bytes or losses"
import json, math, sys
def steps(p):
    return [j for j in map(json.loads, open(p)) if j["event"] == "step"]
model, gg = steps(sys.argv[1]), steps(sys.argv[2])
assert len(model) == len(gg) == 20, (len(model), len(gg))
for m, g in zip(model, gg):
    assert g["sent_bytes"] == 2 * m["sent_bytes"], (m["step"], m["sent_bytes"], g["sent_bytes"])
assert sum(m["sent_bytes"] for m in model) > 0
assert all(math.isfinite(g["loss"]) for g in gg)
assert gg[-1]["loss"] < gg[0]["loss"], (gg[0]["loss"], gg[-1]["loss"])
assert any(m["loss"] != g["loss"] for m, g in zip(model, gg)), "gossipgrad equals model"
print("gossipgrad: twice model's bytes per step, loss", gg[0]["loss"], "->", gg[-1]["loss"])
PY
# One rank (no mpirun) has no partner: no mode mixes or sends anything, so the losses are
# allreduce's bit for bit (a lossy wire used to mix the rank with its own rounded copy).
one() {  # one NAME ARGS...
  local name="$1"; shift
  timeout 120 "$BIN" "${RUN[@]}" --log.metrics "one-$name.jsonl" "$@" > "one-$name.log" 2>&1 ||
    fail "one rank, $name: exit $?"
}
one allreduce --gossip.mode allreduce
one gg --gossip.mode gossipgrad --gossip.model_wire int4 --gossip.choco true --gossip.rotate false
one both --gossip.mode both --gossip.wire int8 --gossip.model_wire int4 \
  --gossip.error_feedback true --gossip.rounding stochastic
for m in gg both; do
  diff <(losses one-allreduce.jsonl | awk '{print $1, $2}') \
       <(losses "one-$m.jsonl" | awk '{print $1, $2}') ||
    fail "one rank, $m: the losses differ from allreduce's"
  [ "$(losses "one-$m.jsonl" | awk '{s += $3} END {print s}')" = 0 ] ||
    fail "one rank, $m: bytes sent"
done
echo "PASS: gossipgrad mixes weights and momentum, resumes exactly, overlapped or not; one rank mixes nothing"
