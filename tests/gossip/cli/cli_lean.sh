#!/usr/bin/env bash
# Lean gossip options end to end under mpirun with 2 ranks:
# - gossip.model_every k: the weights travel only in the steps that follow every k-th update
#   (overlapped) or in every k-th step (not overlapped), counted exactly in the step metrics'
#   sent_bytes; the gradients of `both` still every step;
# - resume is exact with model_every 4, also from a checkpoint taken while a weight exchange was
#   due (every rank's state file identical byte for byte to an uninterrupted run's);
# - gossip.late = skip: with a 3x straggler (emulated compute) the fast rank never mixes a
#   bucket from the step before (late_buckets 0) and counts the ones it left unmixed, while
#   late = previous mixes them late;
# - resume is exact with the int4 / int8 wires and error feedback (the residues are saved), and
#   with stochastic rounding (keyed draws, no state), gossip.choco (the public copies are saved)
#   and gossip.low_rank (the factors are saved), and the metrics of a stopped and resumed run
#   count the same bytes as an uninterrupted run's;
# - gossip.consensus_bound: the same global averages, and the same state files, resumed or not.
set -euo pipefail
BIN="$1"; ROOT="$2"; MPIEXEC="$3"
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
cd "$TMP"
export OMP_NUM_THREADS=1
fail() { echo "FAIL: $*"; for f in *.log; do echo "== $f"; tail -4 "$f"; done; exit 1; }
RUN=(train --config "$ROOT/configs/laptop.ini" --data.source synthetic:1x28x28:10:2000
     --model.width 4 --train.batch 32 --train.threads 1 --train.epochs 3
     --log.progress false --log.overwrite true --gossip.consensus_every 0)
train() { "$MPIEXEC" -n 2 "$BIN" "${RUN[@]}" "$@"; }

# Bytes per step. both: gradients every step; weights (as many floats) of the update of step
# s travel during step s + 1, for every s with (s + 1) % k == 0. model without overlap: the
# weights of every k-th step, during that step.
train --train.max_steps 12 --gossip.mode both --log.metrics both1.jsonl > both1.log 2>&1 ||
  fail "both, model_every 1"
train --train.max_steps 12 --gossip.mode both --gossip.model_every 4 \
  --log.metrics both4.jsonl > both4.log 2>&1 || fail "both, model_every 4"
train --train.max_steps 12 --gossip.mode model --gossip.overlap_model false \
  --gossip.model_every 3 --log.metrics model3.jsonl > model3.log 2>&1 || fail "model, model_every 3"
/usr/bin/python3 - <<'PY' || fail "bytes per step"
import json
def run(path):
    ev = [json.loads(l) for l in open(path)]
    steps = [e for e in ev if e["event"] == "step"]
    params = [e for e in ev if e["event"] == "summary"][0]["params"]
    assert len(steps) == 12, len(steps)
    return [e["sent_bytes"] for e in steps], 4 * params
got, w = run("both1.jsonl")
assert got == [w] + [2 * w] * 11, (got, w)
got, w = run("both4.jsonl")
want = [2 * w if s in (4, 8) else w for s in range(12)]
assert got == want, (got, want)
got, w = run("model3.jsonl")
want = [w if (s + 1) % 3 == 0 else 0 for s in range(12)]
assert got == want, (got, want)
print(f"sent bytes per step as expected ({w} bytes of weights or gradients)")
PY

# Exact resume with model_every 4: 16 steps in one go, and 8 + 8 (the weights of step 7's
# update were due when the checkpoint at step 8 was taken).
LEAN=(--gossip.mode both --gossip.model_every 4 --checkpoint.every 4 --train.max_steps 16)
train "${LEAN[@]}" --checkpoint.dir A --log.metrics a.jsonl > a.log 2>&1 || fail "uninterrupted"
train "${LEAN[@]}" --checkpoint.dir B --log.metrics b.jsonl --train.stop_at 8 > b1.log 2>&1 ||
  fail "stopped run"
train "${LEAN[@]}" --checkpoint.dir B --log.metrics b.jsonl --checkpoint.resume auto \
  > b2.log 2>&1 || fail "resumed run"
grep -q "at step 8" b2.log || fail "not resumed at step 8"
n=0
for a in A/ckpt-000000000016/rank-*.bin; do
  cmp -s "$a" "B/${a#A/}" || fail "$a and B/${a#A/} differ"
  n=$((n + 1))
done
[ "$n" = 2 ] || fail "$n rank files at step 16"
echo "exact resume with model_every 4: ok"

# Resume is exact: a run stopped after step 8 and resumed writes, at step 16, the same state
# files as an uninterrupted one (checkpoints every 4 steps settle the overlapped exchange).
exact_resume() { # what A B options...: uninterrupted in A, stopped and resumed in B
  local what=$1 a=$2 b=$3 f
  shift 3
  train "$@" --checkpoint.every 4 --train.max_steps 16 --checkpoint.dir "$a" \
    --log.metrics "$a.jsonl" > "$a.log" 2>&1 || fail "$what: uninterrupted run"
  train "$@" --checkpoint.every 4 --train.max_steps 16 --checkpoint.dir "$b" \
    --log.metrics "$b.jsonl" --train.stop_at 8 > "${b}1.log" 2>&1 || fail "$what: stopped run"
  train "$@" --checkpoint.every 4 --train.max_steps 16 --checkpoint.dir "$b" \
    --log.metrics "$b.jsonl" --checkpoint.resume auto > "${b}2.log" 2>&1 ||
    fail "$what: resumed run"
  grep -q "at step 8" "${b}2.log" || fail "$what: not resumed at step 8"
  for f in "$a"/ckpt-000000000016/rank-*.bin; do
    cmp -s "$f" "$b/${f#"$a"/}" || fail "$what: $f and $b/${f#"$a"/} differ"
  done
  # The bytes too: the exchange the stopped run settled at its checkpoint is counted once, by
  # the resumed run's first step, as the uninterrupted run's step 9 counts it.
  local sent
  sent=$(sent_bytes "$a.jsonl")
  [[ $sent -gt 0 && $sent == "$(sent_bytes "$b.jsonl")" ]] ||
    fail "$what: $sent bytes sent in one go, $(sent_bytes "$b.jsonl") stopped and resumed"
  echo "exact resume with $what: ok ($sent bytes either way)"
}
sent_bytes() { # the sum of the step records' sent_bytes in a metrics file
  /usr/bin/python3 -c '
import json, sys
print(sum(r.get("sent_bytes") or 0 for r in map(json.loads, open(sys.argv[1]))
          if r.get("event") == "step"))' "$1"
}
# The lossy wires' error-feedback residues are part of a rank's state: int4 gradients and int8
# weights.
exact_resume "int4 / int8 wires and error feedback" F G --gossip.mode both --gossip.wire int4 \
  --gossip.model_wire int8 --gossip.error_feedback true
# Stochastic rounding keeps no state: its draws are keyed by (seed, rank, step, bucket).
exact_resume "int4 with stochastic rounding" L M --gossip.mode model --gossip.model_wire int4 \
  --gossip.error_feedback true --gossip.rounding stochastic
# CHOCO's public copies too: gossipgrad (the weights' and the momentum's copies), int4, overlapped.
exact_resume "CHOCO's public copies (gossipgrad, int4)" H I --gossip.mode gossipgrad \
  --gossip.model_wire int4 --gossip.choco true --gossip.rotate false
# Low-rank gossip's factors too: gossipgrad (the weights' and the momentum's), rank 1, overlapped.
exact_resume "low-rank gossip's factors (gossipgrad, rank 1)" J K --gossip.mode gossipgrad \
  --gossip.low_rank 1 --gossip.schedule hypercube --gossip.rotate false

# Consensus control: resume is exact across the global averages it takes. The bound is the
# median of the estimates of a run whose bound is never reached, so that some checks average
# and some do not; checkpoints every 4 steps settle the overlapped exchange in both runs.
CC=(--gossip.mode model --checkpoint.every 4 --train.max_steps 16)
train "${CC[@]}" --gossip.consensus_bound 1e300 --checkpoint.dir E --log.metrics est.jsonl \
  > est.log 2>&1 ||
  fail "consensus estimates"
bound=$(/usr/bin/python3 -c '
import json, statistics
e = [json.loads(l)["consensus_estimate"] for l in open("est.jsonl") if "\"event\":\"step\"" in l]
print(statistics.median([v for v in e if v]))')
train "${CC[@]}" --gossip.consensus_bound "$bound" --checkpoint.dir C --log.metrics c.jsonl \
  > c.log 2>&1 || fail "consensus control, uninterrupted"
# Stopped just before the first step whose check averages: the resumed run must carry over what
# the stopped run's last checkpoint measured (the settled weight exchange) to decide alike.
stop=$(/usr/bin/python3 -c '
import json
print(min(e["step"] for e in map(json.loads, open("c.jsonl")) if e["event"] == "step" and e["consensus_average"]))')
train "${CC[@]}" --gossip.consensus_bound "$bound" --checkpoint.dir D --log.metrics d.jsonl \
  --train.stop_at "$stop" > d1.log 2>&1 || fail "consensus control, stopped run"
train "${CC[@]}" --gossip.consensus_bound "$bound" --checkpoint.dir D --log.metrics d.jsonl \
  --checkpoint.resume auto > d2.log 2>&1 || fail "consensus control, resumed run"
for a in C/ckpt-000000000016/rank-*.bin; do
  cmp -s "$a" "D/${a#C/}" || fail "consensus control: $a and D/${a#C/} differ"
done
/usr/bin/python3 - <<'PY' || fail "consensus control averages"
import json
def averaged(path):
    return [e["step"] for e in map(json.loads, open(path)) if e["event"] == "step" and e["consensus_average"]]
c, d = averaged("c.jsonl"), averaged("d.jsonl")
assert 0 < len(c) < 15 and c[0] > 0, c
assert c == d, (c, d)
summary = [json.loads(l) for l in open("c.jsonl") if '"event":"summary"' in l][0]
assert summary["consensus_averages"] == len(c), summary
print(f"consensus control: global averages after steps {c}, the same resumed at step {c[0]}")
PY

# Late partners: rank 1 computes 3x slower; staleness 1 never waits for it.
SLOW=(--gossip.mode grad --gossip.staleness 1 --guard.lag 1 --train.max_steps 10
      --emulate.forward_ms 10 --emulate.backward_ms 20 --emulate.update_ms 2 --emulate.slow 1:3)
train "${SLOW[@]}" --gossip.late previous --log.metrics prev.jsonl > prev.log 2>&1 ||
  fail "late = previous"
train "${SLOW[@]}" --gossip.late skip --log.metrics skip.jsonl > skip.log 2>&1 ||
  fail "late = skip"
/usr/bin/python3 - <<'PY' || fail "lateness counts"
import json
def counts(path):
    steps = [json.loads(l) for l in open(path) if '"event":"step"' in l]
    assert len(steps) == 10, len(steps)
    return sum(e["late_buckets"] for e in steps), sum(e["unmixed_buckets"] for e in steps)
prev, skip = counts("prev.jsonl"), counts("skip.jsonl")
print(f"rank 0 (fast) late/unmixed buckets in 10 steps: previous {prev}, skip {skip}")
assert skip[0] == 0, skip        # skip never mixes last step's bucket
assert skip[1] > 0, skip         # ... and leaves the ones not here unmixed
assert prev[0] > 0, prev         # previous mixes them late instead
PY
# What the model or the data decide is refused before the first step, in one line: a low rank
# at which no weight matrix gains (every one would travel whole), a stop after the last step.
refused() {  # refused WHAT EXPECTED ARGS...
  local what="$1" want="$2" rc=0; shift 2
  train "$@" --log.metrics r.jsonl > r.log 2> r.err || rc=$?
  [ $rc = 2 ] && [ "$(grep -c error r.err)" = 1 ] && grep -qF "$want" r.err ||
    fail "$what: exit $rc: $(cat r.err)"
}
refused "low rank 64" "gossip.low_rank = 64 compresses no weight matrix of resnet8" \
  --gossip.mode model --gossip.low_rank 64 --gossip.schedule hypercube --gossip.rotate false
refused "stop after the end" "train.stop_at = 500 is not before the run's last step (93 steps)" \
  --checkpoint.dir never --train.stop_at 500
[ ! -e never ] || fail "the refused run made its checkpoint folder"
echo "PASS: model_every bytes, exact resume (also with error feedback), consensus control, late = skip, refusals"
