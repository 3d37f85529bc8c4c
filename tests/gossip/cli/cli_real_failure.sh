#!/usr/bin/env bash
# A real failure, from outside: one rank of a supervised 4-rank Fashion-MNIST run is SIGKILLed
# mid-run with kill -9. Every rank's saver (a process of its own holding the rank's state of
# its last completed step in shared memory) writes that state, the dead rank's included; the
# supervisor relaunches the job from them at its size ("restore"). The run completes with at most
# one step redone, within 15 s of the kill, a top-1 within 0.5% of the failure-free run's, and
# the metrics record the failure. Then a corrupted emergency state: the supervisor says so in
# one line and restarts from the newest full checkpoint. And a rank lost with its state under
# supervise --replace-lost (CHOCO's public copies on): the job goes on at its size.
set -euo pipefail
BIN="$1"; ROOT="$2"; MPIEXEC="$3"
TMP=$(mktemp -d); trap 'kill -9 $(pgrep -f "$TMP/") 2>/dev/null || true; [ -n "${GG_KEEP_TMP:-}" ] && echo "kept $TMP" || rm -rf "$TMP"' EXIT
cd "$TMP"
export OMP_NUM_THREADS=1
fail() { echo "FAIL: $*"; exit 1; }
. "$ROOT/tests/gossip/cli/job_watch.sh"
RUN=(train --config "$ROOT/configs/laptop.ini" --data.dir /usr/share/datasets/fashion-mnist
     --model.width 4 --train.threads 1 --train.warmup_epochs 0 --train.epochs 1
     --train.eval_batch 1000 --log.progress false --gossip.consensus_every 0
     --gossip.timeout_s 60)
# The runs that compare top-1 train 150 of the epoch's 234 steps, the others 100: every kill and
# restart happens by step 110, and what follows it only has to complete.
LONG=(--train.max_steps 150); SHORT=(--train.max_steps 100)
py() { /usr/bin/python3 -c "$@"; }
summary() { grep '"event":"summary"' "$1" | tail -1 | sed 's/.*"top1":\([0-9.]*\).*/\1/'; }

# 1. The failure-free run.
timeout 120 "$MPIEXEC" -n 4 "$BIN" "${RUN[@]}" "${LONG[@]}" --log.metrics base.jsonl \
  > base.log 2>&1 ||
  fail "failure-free run: $(tail -5 base.log)"
base=$(summary base.jsonl)

# 2. Rank 2 SIGKILLed before step 80 of 150. (Every victim below stalls itself first, before a
# step the test names, and is killed stopped: a running one's kill raced the job's end.)
timeout 150 "$BIN" supervise --max-restarts 2 -- "$MPIEXEC" -n 4 "$BIN" "${RUN[@]}" "${LONG[@]}" \
  --checkpoint.dir "$TMP/ck" --checkpoint.every 50 --fault.stall 2:80 --log.metrics m.jsonl \
  > out.log 2> err.log &
sup=$!
victim=$(stalled_rank "$TMP/ck" 2) || fail "rank 2 did not stall"
killed_at=$(date +%s.%N)
kill -9 "$victim"
wait $sup || fail "supervise exited $?: $(tail -8 err.log)"
grep -q -- "-disable-auto-cleanup" err.log || fail "no failure notice asked of hydra"
grep -q "rank 2's process ended first: 4 of 4 rank states saved (lost: none); 4 ranks continue" \
  err.log || fail "no relaunch from the saved states: $(cat err.log)"
grep -q "the job completed after 1 restart(s)" err.log || fail "did not complete"
[ "$(grep -c 'emergency state after step [0-9]* written to' err.log)" = 4 ] ||
  fail "not every rank's state was saved: $(cat err.log)"
fault=$(grep '"event":"fault"' m.jsonl) || fail "no fault event in the metrics"
read -r redone since rank strategy after < <(py "
import json; e = json.loads('''$fault''')
print(e['steps_redone'], e['t_unix'] - $killed_at, e['rank'], e['strategy'], e['ranks_after'])")
top1=$(summary m.jsonl)
echo "real failure: rank $rank killed, strategy $strategy ($after ranks after), $redone step(s)" \
  "redone, training again $(printf %.1f "$since") s after the kill; top-1 $top1 vs $base" \
  "failure-free"
[ "$rank" = 2 ] && [ "$strategy" = restore ] && [ "$after" = 4 ] || fail "fault event: $fault"
[ "$redone" -le 1 ] || fail "$redone steps redone"
py "import sys; sys.exit(0 if $since < 15 else 1)" || fail "$since s from the kill to training"
py "import sys; sys.exit(0 if abs($top1 - $base) <= 0.005 else 1)" ||
  fail "top-1 $top1 is not within 0.5% of the failure-free $base"
[ ! -e ck/emergency ] || fail "emergency states left behind after the run completed"
! pgrep -f "_emergency-saver $TMP/" > /dev/null || fail "a saver outlived the run"

# 3. A second death during the recovery: rank 1 SIGKILLed before step 60, then rank 0 of the
# relaunch as soon as it runs (before or after its first step): the job still completes, from the
# states.
timeout 150 "$BIN" supervise --max-restarts 3 -- "$MPIEXEC" -n 4 "$BIN" "${RUN[@]}" "${SHORT[@]}" \
  --checkpoint.dir "$TMP/ck3" --checkpoint.every 50 --fault.stall 1:60 --log.metrics m3.jsonl \
  > out3.log 2> err3.log &
sup=$!
victim=$(stalled_rank "$TMP/ck3" 1) || fail "rank 1 did not stall"
kill -9 "$victim"
for _ in $(seq 200); do grep -q "attempt 1: " err3.log && break; sleep 0.05; done
second=""
for _ in $(seq 200); do
  second=$(rank_pid "$TMP/ck3 .*resume" 0 || true); [ -n "$second" ] && break; sleep 0.05
done
[ -n "$second" ] || fail "the relaunch's rank 0 not found: $(cat err3.log)"
kill -9 "$second"
wait $sup || fail "second death: supervise exited $?: $(tail -8 err3.log)"
grep -q "the job completed after 2 restart(s)" err3.log || fail "second death: $(cat err3.log)"
grep -q "relaunching from the states in .* again\|rank states saved" <(sed -n '/attempt 1 failed/p' err3.log) ||
  fail "the second relaunch did not start from emergency states: $(cat err3.log)"
echo "real failure: a second death during the recovery: $(grep 'attempt 1 failed' err3.log | cut -c1-160)"

# 4. A corrupt emergency state. The supervisor is stopped while the job fails, so that the state
# can be damaged before it looks (the job runs in a process group of its own, its survivors save
# their states and wait for the supervisor).
timeout 150 "$BIN" supervise --max-restarts 2 -- "$MPIEXEC" -n 4 "$BIN" "${RUN[@]}" "${SHORT[@]}" \
  --checkpoint.dir "$TMP/ck2" --checkpoint.every 50 --fault.stall 1:60 --log.metrics m2.jsonl \
  > out2.log 2> err2.log &
sup=$!
victim=$(stalled_rank "$TMP/ck2" 1) || fail "rank 1 did not stall"
# $sup is timeout's pid: SIGSTOP to it would stop timeout alone (it forwards only the signals it
# can catch), and the supervisor would race the damage below. Its only child is the supervisor.
supv=$(pgrep -P "$sup") || fail "the supervisor under timeout not found"
kill -STOP "$supv"
[[ $(ps -o stat= -p "$supv") == T* ]] || fail "the supervisor did not stop"
kill -9 "$victim"
for _ in $(seq 300); do
  [ "$(ls ck2/emergency/attempt-0/rank-*.bin 2>/dev/null | wc -l)" = 4 ] &&
    ! compgen -G "ck2/emergency/attempt-0/*.saving" > /dev/null && break
  sleep 0.1
done
[ "$(ls ck2/emergency/attempt-0/rank-*.bin | wc -l)" = 4 ] || fail "the savers wrote no states"
py "
f = open('ck2/emergency/attempt-0/rank-00003.bin', 'r+b'); f.seek(100); b = f.read(1)
f.seek(100); f.write(bytes([b[0] ^ 0x40]))"
kill -CONT "$supv"
wait $sup || fail "corrupt state: supervise exited $?: $(tail -8 err2.log)"
[ "$(grep -c 'rank-00003.bin: checksum mismatch (corrupt or truncated): restarting from the newest full checkpoint instead' err2.log)" = 1 ] ||
  fail "no one-line fallback: $(cat err2.log)"
grep -q "resumed from $TMP/ck2/ckpt-000000000050 at step 50" out2.log ||
  fail "not resumed from the newest full checkpoint: $(grep resumed out2.log)"
grep -q "the job completed after 1 restart(s)" err2.log || fail "corrupt state: did not complete"

# 5. supervise --replace-lost: rank 2 and its saver SIGKILLed together before step 80 (its state is
# lost, as with a lost machine): the job goes on at 4 ranks, rank 2's slot starting from the
# state of the rank it last sent to. With CHOCO's public copies, which a pair holds alike on both
# ends: rank 2's partners drop theirs as its slot starts again from none (kept, the pairs mixed
# mismatched copies and the ranks drifted apart).
CHOCO=(--gossip.mode model --gossip.model_wire int4 --gossip.choco true --gossip.rotate false)
timeout 120 "$MPIEXEC" -n 4 "$BIN" "${RUN[@]}" "${LONG[@]}" "${CHOCO[@]}" --log.metrics base5.jsonl \
  > base5.log 2>&1 || fail "failure-free CHOCO run: $(tail -5 base5.log)"
base=$(summary base5.jsonl)
timeout 150 "$BIN" supervise --max-restarts 2 --replace-lost -- "$MPIEXEC" -n 4 "$BIN" \
  "${RUN[@]}" "${LONG[@]}" "${CHOCO[@]}" --checkpoint.dir "$TMP/ck5" --checkpoint.every 50 \
  --fault.stall 2:80 --log.metrics m5.jsonl \
  > out5.log 2> err5.log &
sup=$!
victim=$(stalled_rank "$TMP/ck5" 2) || fail "replace: rank 2 did not stall"
saver=$(pgrep -f "_emergency-saver $TMP/ck5/emergency/attempt-0 2\$") ||
  fail "replace: rank 2's saver not found: $(pgrep -af _emergency-saver)"
killed_at=$(date +%s.%N)
kill -9 "$saver" "$victim"
wait $sup || fail "replace: supervise exited $?: $(tail -8 err5.log)"
grep -q "3 of 4 rank states saved (lost: 2); 4 ranks continue at step [0-9]* from them (replace" \
  err5.log || fail "replace: no relaunch at 4 ranks: $(cat err5.log)"
grep -q "the job completed after 1 restart(s)" err5.log || fail "replace: did not complete"
fault=$(grep '"event":"fault"' m5.jsonl) || fail "replace: no fault event in the metrics"
read -r redone rank strategy after since < <(py "
import json; e = json.loads('''$fault''')
print(e['steps_redone'], e['rank'], e['strategy'], e['ranks_after'], e['t_unix'] - $killed_at)")
[ "$rank" = 2 ] && [ "$strategy" = replace ] && [ "$after" = 4 ] && [ "$redone" -le 1 ] ||
  fail "replace: fault event: $fault"
top1=$(summary m5.jsonl)
echo "real failure, replace: rank 2 and its state lost, $redone step(s) redone, 4 ranks again" \
  "$(printf %.1f "$since") s after the kill; top-1 $top1 vs $base failure-free"
# Within 3 points: the lost slot starts again from another rank's state, so the run's path
# depends on the step the kill lands on, which load moves (a clean-clone ./test.sh at -j2 got
# 0.7173 against 0.7309, alone 0.732); the defect this guards against (mismatched CHOCO copies)
# ended at chance.
py "import sys; sys.exit(0 if abs($top1 - $base) <= 0.03 else 1)" ||
  fail "replace: top-1 $top1 is not within 3 points of the failure-free $base"
echo "real failure: ok"
