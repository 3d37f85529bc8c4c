#!/usr/bin/env bash
# Virtual ranks are exact: `gossipgrad train --train.virtual_ranks 4` (one process) and the same
# job under `mpirun -n 4` (one thread per rank on both sides) write the same per-rank losses
# (log.losses, the exact %a form) for every step, bit for bit, and the same bytes sent per step
# (metrics: sent_bytes) and the same evaluations (one inside the steps, at the end of the first
# epoch, and one at the end), and every metrics event with the same fields, types and values but
# for timings (the step's loss: rank 0's), in the gossip modes: both (the overlapped weight exchange), model with
# the bf16 wire, error feedback and consensus control (the same steps end in a global average,
# some of the steps but not all), model with the int8 wire and both with int4 wires (error
# feedback; int8 with stochastic rounding), CHOCO's public copies (model + int4 overlapped, gossipgrad + int8), low-rank gossip
# (gossipgrad, rank 1, overlapped), the authors' gossipgrad (weights and momentum, exchanged
# after each update), two peers a step (exponential2: model, and both with int8 gradients), push-sum (model on
# exponential2, gossipgrad on dissemination); allreduce within 1e-5 relative (virtual ranks add in MPICH's recursive-
# doubling order, which makes it exact with Debian's MPICH; another MPI may add otherwise); and
# staleness 1 with every partner on time against mpirun's staleness 0; model_every 3 with
# global_every 50; gossip.hierarchy node on
# two nodes of two (mpirun's simulated by GG_RANKS_PER_NODE). A mixing weight mutated
# in the virtual path alone (0.501 / 0.499) fails it at step 1. Then the lateness model of
# staleness 1 (train.virtual_late), and what virtual ranks do not model is refused in one line,
# exit 2.
set -euo pipefail
BIN="$1"; ROOT="$2"; MPIEXEC="$3"; STEPS="${4:-100}"
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
export OMP_NUM_THREADS=1
# The first 1,600 training and 500 test images of Fashion-MNIST: 50 steps an epoch at 4 x 8, so
# 60 steps train on after an evaluation (the average model swapped into the network and out
# again), and each run loads and evaluates in a fraction of a second.
common=(train --config "$ROOT/configs/laptop.ini" --model.width 8 --train.batch 8
        --train.threads 1 --train.max_steps "$STEPS" --log.progress false
        --gossip.consensus_every 0 --train.rank_eval_samples 0 --data.source "idx:$TMP/small")
python3 "$ROOT/tests/gossip/cli/fmnist_subset.py" "$TMP/small" 1600 500
cases=(
  "both|--gossip.mode both"
  "model-bf16-ef-cc|--gossip.mode model --gossip.model_wire bf16 --gossip.error_feedback true --gossip.consensus_bound 2e-6"
  "gossipgrad|--gossip.mode gossipgrad --gossip.overlap_model false"
  # The quantized wires (gossip.wire / model_wire int8, int4) with error feedback.
  "model-int8-ef|--gossip.mode model --gossip.model_wire int8 --gossip.error_feedback true"
  "both-int4-ef|--gossip.mode both --gossip.wire int4 --gossip.model_wire int4 --gossip.error_feedback true"
  # Stochastic rounding: the draws keyed by (seed, rank, step, bucket) alike on both sides.
  "model-int8-sr|--gossip.mode model --gossip.model_wire int8 --gossip.rounding stochastic"
  # CHOCO's public copies: overlapped model + int4, and gossipgrad + int8 (weights and momentum).
  "model-int4-choco|--gossip.mode model --gossip.model_wire int4 --gossip.choco true --gossip.rotate false"
  "gossipgrad-int8-choco|--gossip.mode gossipgrad --gossip.overlap_model false --gossip.model_wire int8 --gossip.choco true --gossip.rotate false --gossip.schedule hypercube"
  # Low-rank gossip (PowerGossip): gossipgrad, rank 1, overlapped, the weights' and momentum's factors.
  "gossipgrad-lowrank|--gossip.mode gossipgrad --gossip.low_rank 1 --gossip.schedule hypercube --gossip.rotate false"
  "allreduce|--gossip.mode allreduce"
  # Two peers a step (gossip.schedule exponential2, over p2p under mpirun): the weights, and the
  # gradients on the int8 wire with the weights in fp32.
  "model-exp2|--gossip.mode model --gossip.overlap_model false --gossip.schedule exponential2"
  "both-exp2-int8|--gossip.mode both --gossip.overlap_model false --gossip.schedule exponential2 --gossip.wire int8 --gossip.error_feedback true"
  # Push-sum (gossip.rule push-sum, a weight behind each bucket): on two peers a step, and the
  # weights and momentum on dissemination.
  "model-pushsum-exp2|--gossip.mode model --gossip.overlap_model false --gossip.schedule exponential2 --gossip.rule push-sum"
  "gossipgrad-pushsum|--gossip.mode gossipgrad --gossip.overlap_model false --gossip.rule push-sum"
  # Staleness 1 with every partner on time (train.virtual_late 0) mixes as staleness 0 does.
  "stale-on-time|--gossip.mode both --gossip.overlap_model false|--gossip.staleness 1"
  # The weights every 3rd step, an exact global average every 50.
  "every|--gossip.mode model --gossip.model_every 3 --gossip.global_every 50|"
  # Two nodes of two: mpirun's nodes simulated (GG_RANKS_PER_NODE), the virtual ranks' logical.
  "hierarchy|--gossip.mode grad --gossip.hierarchy node|--network.ranks_per_node 2"
)
for c in "${cases[@]}"; do
  name=${c%%|*}; rest=${c#*|}; read -r -a opts <<<"${rest%%|*}"
  vopts=(); [[ $rest == *"|"* ]] && read -r -a vopts <<<"${rest#*|}"
  nodes=(); [ "$name" = hierarchy ] && nodes=(env GG_RANKS_PER_NODE=2)
  "${nodes[@]}" "$MPIEXEC" -n 4 "$BIN" "${common[@]}" "${opts[@]}" --log.losses "$TMP/$name/real/loss" \
    --log.metrics "$TMP/$name-real.jsonl" >"$TMP/$name-real.out" 2>&1 ||
    { cat "$TMP/$name-real.out"; exit 1; }
  "$BIN" "${common[@]}" "${opts[@]}" "${vopts[@]}" --train.virtual_ranks 4 \
    --log.losses "$TMP/$name/virtual/loss" --log.metrics "$TMP/$name-virtual.jsonl" \
    >"$TMP/$name-virtual.out" 2>&1 || { cat "$TMP/$name-virtual.out"; exit 1; }
  grep -q "4 VIRTUAL ranks" "$TMP/$name-virtual.out"
  tol=0; [ "$name" = allreduce ] && tol=1e-5
  python3 - "$TMP/$name" "$STEPS" "$tol" "$name" "$TMP/$name-virtual.jsonl" "$TMP/$name-real.jsonl" <<'PY'
import json, sys
root, steps, tol, name, metrics, real_metrics = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4], sys.argv[5], sys.argv[6]
worst = 0.0
for r in range(4):
    real = [l.split() for l in open(f"{root}/real/loss.{r}")]
    virt = [l.split() for l in open(f"{root}/virtual/loss.{r}")]
    assert len(real) == len(virt) == steps, (name, r, len(real), len(virt))
    for (s1, a), (s2, b) in zip(real, virt):
        assert s1 == s2
        if tol == 0:
            assert a == b, f"{name}: rank {r} step {s1}: real loss {float.fromhex(a)!r} virtual {float.fromhex(b)!r}"
        else:
            x, y = float.fromhex(a), float.fromhex(b)
            worst = max(worst, abs(x - y) / abs(x))
            assert abs(x - y) <= tol * abs(x), f"{name}: rank {r} step {s1}: {x!r} vs {y!r}"
events = [json.loads(l) for l in open(metrics)]
assert all(e.get("virtual") is True for e in events), "an event without virtual: true"
# The bytes a rank sends each step: the virtual count against rank 0's transports' count.
sent = lambda evs: [e["sent_bytes"] for e in evs if e["event"] == "step"]
real_events = [json.loads(l) for l in open(real_metrics)]
assert sent(events) == sent(real_events), f"{name}: sent bytes differ: {sent(events)[:4]} vs {sent(real_events)[:4]}"
# Consensus control (the -cc case): the same steps end in a global average, some but not all.
averaged = lambda evs: [e["step"] for e in evs if e["event"] == "step" and e["consensus_average"]]
assert averaged(events) == averaged(real_events), f"{name}: global averages at {averaged(events)[:5]} vs {averaged(real_events)[:5]}"
# The evaluations of the ranks' average model: the same steps and top-1.
evals = lambda evs: [(e["step"], e["top1"]) for e in evs if e["event"] == "eval"]
assert tol > 0 or evals(events) == evals(real_events), f"{name}: evaluations {evals(events)} vs {evals(real_events)}"
# Training goes on after an evaluation (every 50 steps), in every case.
assert len(evals(events)) >= 2 and evals(events)[0][0] < steps, f"{name}: evaluations {evals(events)}"
# Every event of the real run, with the same fields, types and values (timings aside; staleness 1
# on time against staleness 0 counts lateness where the real run does not); the virtual run's
# own fields come beside them.
timing = {"images_per_s", "step_s", "comm_s", "wall_s", "data_wait_s", "shuffle_s", "exposed_comm_share"}
own = {"step": {"loss_mean", "loss_min", "loss_max"}, "start": {"memory_estimate_bytes"},
       "summary": {"memory_estimate_bytes", "peak_memory_bytes", "sent_bytes_per_step",
                   "late_buckets", "unmixed_buckets"}}
if name == "stale-on-time":
    timing |= {"late_buckets", "unmixed_buckets"}
assert [e["event"] for e in events] == [e["event"] for e in real_events], \
    f"{name}: events {[e['event'] for e in events][:6]} vs {[e['event'] for e in real_events][:6]}"
for v, r in zip(events, real_events):
    extra = set(v) - set(r) - {"virtual"} - own.get(v["event"], set())
    assert set(r) <= set(v) and not extra, f"{name}: {v['event']}: missing {set(r) - set(v)}, extra {extra}"
    for k in set(r) - timing:
        a, b = r[k], v[k]
        assert type(a) == type(b), f"{name}: {v['event']} {k}: {type(a).__name__} vs {type(b).__name__}"
        if tol > 0 and isinstance(a, float):
            assert abs(a - b) <= tol * abs(a), f"{name}: {v['event']} step {v.get('step')} {k}: {a!r} vs {b!r}"
        else:
            assert a == b, f"{name}: {v['event']} step {v.get('step')} {k}: {a!r} vs {b!r}"
if name.endswith("-cc"):
    assert 0 < len(averaged(events)) < steps, f"{name}: {len(averaged(events))} global averages in {steps} steps"
print(f"{name}: 4 ranks x {steps} steps, " +
      ("bit-identical" if tol == 0 else f"largest relative difference {worst:.2e} (<= {tol:g})"))
PY
done

# The lateness model of staleness 1 (train.virtual_late F): the same draws every run, about F of
# rank 0's bucket exchanges late, all of them with F = 1 (the first step's unmixed: nothing came
# before it), and with gossip.late skip the late ones left unmixed.
late_run() { # NAME OPTIONS...
  local name=$1; shift
  "$BIN" "${common[@]}" --gossip.mode both --gossip.overlap_model false --gossip.staleness 1 \
    --train.virtual_ranks 4 "$@" --log.losses "$TMP/$name/loss" --log.metrics "$TMP/$name.jsonl" \
    >"$TMP/$name.out" 2>&1 || { cat "$TMP/$name.out"; exit 1; }
}
late_run late-a --train.virtual_late 0.3
late_run late-b --train.virtual_late 0.3
late_run late-all --train.virtual_late 1
late_run late-skip --train.virtual_late 1 --gossip.late skip
python3 - "$TMP" "$STEPS" <<'PY'
import json, sys
tmp, steps = sys.argv[1], int(sys.argv[2])
for r in range(4):
    assert open(f"{tmp}/late-a/loss.{r}").read() == open(f"{tmp}/late-b/loss.{r}").read(), f"rank {r}: not reproducible"
def counts(name):
    ev = [json.loads(l) for l in open(f"{tmp}/{name}.jsonl")]
    st = [e for e in ev if e["event"] == "step"]
    return [e["late_buckets"] for e in st], [e["unmixed_buckets"] for e in st], ev[-1]
late, unmixed, summary = counts("late-all")
per_step = unmixed[0]  # step 0: nothing came before, every bucket unmixed
assert per_step >= 2 and late[0] == 0 and all(n == per_step for n in late[1:]) and sum(unmixed[1:]) == 0, (late[:3], unmixed[:3])
assert summary["late_buckets"] == 4 * per_step * (steps - 1), summary
late, unmixed, _ = counts("late-skip")
assert sum(late) == 0 and all(n == per_step for n in unmixed), (late[:3], unmixed[:3])
late, unmixed, _ = counts("late-a")
share = sum(late) / (per_step * steps)
assert 0.2 < share < 0.4, f"virtual_late 0.3: {share:.3f} of rank 0's buckets late"
print(f"lateness model: reproducible; {share:.3f} late at 0.3; all late at 1 ({per_step} buckets a step); skip leaves them unmixed")
PY
grep -q "train.virtual_late models late partners" <("$BIN" "${common[@]}" --train.virtual_late 0.5 2>&1 || true) ||
  { echo "train.virtual_late without virtual ranks and staleness 1 was not refused"; exit 1; }

# What virtual ranks do not model: one line naming it, exit 2, nothing run.
refused() {
  local want="$1"; shift
  set +e; out=$("$@" 2>&1); rc=$?; set -e
  [ "$rc" = 2 ] || { echo "expected exit 2, got $rc: $*"; echo "$out"; exit 1; }
  [ "$(echo "$out" | grep -c "error:")" = 1 ] && echo "$out" | grep -q -- "$want" ||
    { echo "expected one line naming '$want': $out"; exit 1; }
}
refused "launch it without mpirun" "$MPIEXEC" -n 2 "$BIN" "${common[@]}" --train.virtual_ranks 4
refused "must divide the virtual ranks" "$BIN" "${common[@]}" --train.virtual_ranks 4 \
  --gossip.mode grad --gossip.hierarchy node --network.ranks_per_node 3
refused "data.shuffle" "$BIN" "${common[@]}" --train.virtual_ranks 4 --data.shuffle ids
refused "checkpoints" "$BIN" "${common[@]}" --train.virtual_ranks 4 --checkpoint.dir "$TMP/ck"
refused "hypercube" "$BIN" "${common[@]}" --train.virtual_ranks 6 --gossip.schedule hypercube
refused "without supervise" env GG_EMERGENCY_DIR="$TMP/em" "$BIN" "${common[@]}" \
  --train.virtual_ranks 4
[ ! -e "$TMP/em" ]
[ ! -e "$TMP/ck" ]
echo "virtual ranks: refusals ok"
