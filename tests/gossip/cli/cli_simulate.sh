#!/usr/bin/env bash
# gossipgrad simulate: the JSON has a row per rank count with gossip and both allreduces, gossip's
# step time does not grow with p while the ring's latency term does, compute can come from the
# config, and bad rank lists or schedules are one-line usage errors (exit 2).
set -euo pipefail
BIN="$1"; ROOT="$2"
CFG="$ROOT/configs/laptop.ini"
ARGS=(--model.name resnet50 --train.batch 32 --simulate.forward_ms 100 --simulate.backward_ms 200
  --simulate.update_ms 10 --network.ranks_per_node 4)
"$BIN" simulate --config "$CFG" --ranks 1,2,8,128,4096 --json "${ARGS[@]}" >"${TMPDIR:-/tmp}/sim.$$.json"
python3 - "${TMPDIR:-/tmp}/sim.$$.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["model"] == "resnet50" and d["params"] == 25557032, d["params"]
assert d["compute"]["source"] == "config" and abs(d["compute"]["forward_s"] - 0.1) < 1e-12
rows = {r["ranks"]: r for r in d["rows"]}
assert sorted(rows) == [1, 2, 8, 128, 4096]
assert "gossip" not in rows[1]
for p in (2, 8, 128, 4096):
    for k in ("gossip", "ring_allreduce", "rabenseifner_allreduce"):
        s = rows[p][k]
        assert s["step_s"] >= 0.31 - 1e-9 and 0 < s["efficiency"] <= 1, (p, k, s)
# gossip's per-step exchange is one partner whatever p; the ring pays 2(p-1) latencies per bucket
assert rows[4096]["gossip"]["step_s"] < 1.01 * rows[128]["gossip"]["step_s"]
assert rows[4096]["ring_allreduce"]["step_s"] > 1.5 * rows[128]["ring_allreduce"]["step_s"]
print("simulate: gossip eff at 128 / 4096 ranks: %.4f / %.4f, ring %.4f / %.4f" % (
    rows[128]["gossip"]["efficiency"], rows[4096]["gossip"]["efficiency"],
    rows[128]["ring_allreduce"]["efficiency"], rows[4096]["ring_allreduce"]["efficiency"]))
PY
rm -f "${TMPDIR:-/tmp}/sim.$$.json"

# The bf16 wire halves gossip's bytes, never the allreduce columns' (MPI and DDP send fp32);
# weights exchanged after the update (overlap_model false) are exposed, the momentum
# (gossipgrad) doubles them, a global average every H steps adds its share.
sim() { "$BIN" simulate --config "$CFG" --ranks 16 --json "${ARGS[@]}" --network.inter_bandwidth_gbs 0.125 "$@"; }
python3 - "$(sim --gossip.mode model)" "$(sim --gossip.mode model --gossip.model_wire bf16)" \
  "$(sim --gossip.mode model --gossip.overlap_model false)" \
  "$(sim --gossip.mode gossipgrad --gossip.overlap_model false)" \
  "$(sim --gossip.mode model --gossip.overlap_model false --gossip.global_every 10)" <<'PY'
import json, sys
fp32, bf16, exposed, momentum, pga = (json.loads(a)["rows"][0] for a in sys.argv[1:])
assert bf16["ring_allreduce"] == fp32["ring_allreduce"], (bf16["ring_allreduce"], fp32["ring_allreduce"])
assert bf16["gossip"]["comm_s"] < 0.51 * fp32["gossip"]["comm_s"], (bf16["gossip"], fp32["gossip"])
assert exposed["gossip"]["exposed_s"] > 0.99 * exposed["gossip"]["comm_s"] > 0
assert fp32["gossip"]["exposed_s"] < exposed["gossip"]["exposed_s"]
assert abs(momentum["gossip"]["exposed_s"] - 2 * exposed["gossip"]["exposed_s"]) < 1e-9
assert pga["gossip"]["step_s"] > exposed["gossip"]["step_s"]
print("simulate: wires, overlap, momentum and global averages priced")
PY
out=$("$BIN" simulate --config "$CFG" --ranks 16 "${ARGS[@]}" --gossip.mode model --gossip.consensus_bound 0.01 2>&1) &&
  { echo "simulate with consensus_bound was not refused"; exit 1; }
echo "$out" | grep -q "give gossip.global_every" || { echo "consensus_bound refusal: $out"; exit 1; }
"$BIN" simulate --config "$CFG" --ranks 2,16 "${ARGS[@]}" | grep -q "rabens"
for bad in "--ranks 2,x" "--ranks 0" "--ranks 6 --gossip.schedule hypercube" "--network.inter_bandwidth_gbs 0 --ranks 2" ""; do
  set +e
  # shellcheck disable=SC2086
  out=$("$BIN" simulate --config "$CFG" $bad "${ARGS[@]}" 2>&1)
  rc=$?
  set -e
  [ "$rc" -eq 2 ] || { echo "simulate $bad: exit $rc, expected 2: $out"; exit 1; }
  [ "$(printf '%s\n' "$out" | wc -l)" -eq 1 ] || { echo "simulate $bad: not one line: $out"; exit 1; }
done
echo "simulate: errors ok"

# Every shipped cluster config validates (paths of other machines only warn) and simulates.
for cfg in "$ROOT"/configs/*.ini; do
  "$BIN" train --config "$cfg" --dry-run >/dev/null 2>"${TMPDIR:-/tmp}/dry.$$" ||
    { echo "dry-run of $cfg failed: $(cat "${TMPDIR:-/tmp}/dry.$$")"; exit 1; }
  "$BIN" simulate --config "$cfg" --ranks 2,64 --json --simulate.forward_ms 50 \
    --simulate.backward_ms 100 >/dev/null || { echo "simulate with $cfg failed"; exit 1; }
done
rm -f "${TMPDIR:-/tmp}/dry.$$"
echo "configs: $(ls "$ROOT"/configs/*.ini | wc -l) validate and simulate"
