#!/usr/bin/env bash
# gossipgrad supervise against "the planned training is finished, nothing lost" (issue 31):
#   args    every integer option of supervise out of range or malformed: one line naming it, exit 2,
#           no job started (row 12)
#   nodir   a job without checkpoint.dir is refused before it starts; one that sets it in its
#           --config INI is accepted and gets emergency states (row 5); one with neither
#           emergency states nor checkpoint.every is warned of in one line
#   resume  a job launched with --checkpoint.resume CK/ckpt-20 restarts from the newest checkpoint
#           it wrote since, not from step 20 again (row 3)
#   pruned  ... and when ckpt-20 was pruned meanwhile, from the ranks' emergency states, not exit 2
#   forward a rank and its saver killed: the survivor goes on alone and still trains the samples
#           that train.max_steps planned at 2 ranks (row 4)
#   shrink  the same after --shrink-on-failure 3 -> 2 from a checkpoint (row 4)
#   saver   a rank's saver killed: the rank says so in one line and starts a new one, so that its
#           state is saved when it dies later (row 13)
# and siblings:
#   simfwd  a simulated forward recovery (fault.inject, no supervise) trains max_steps' samples too
#   afresh  a fresh job (log.overwrite over an earlier run's checkpoints) that dies before its first
#           checkpoint restarts afresh, not from the earlier run's checkpoint
#   cleanup --emergency-dir naming the checkpoint folder: success removes the states, not the
#           checkpoints
# GG_SECTIONS="forward saver" runs some of them.
set -euo pipefail
BIN="$1"; ROOT="$2"; MPIEXEC="$3"
TMP=$(mktemp -d)
trap 'kill -9 $(pgrep -f "$TMP/") 2>/dev/null || true; [ -n "${GG_KEEP_TMP:-}" ] && echo "kept $TMP" || rm -rf "$TMP"' EXIT
cd "$TMP"
export OMP_NUM_THREADS=1
fail() { echo "FAIL: $*"; exit 1; }
. "$ROOT/tests/gossip/cli/job_watch.sh"
py() { /usr/bin/python3 -c "$@"; }
SECTIONS=" ${GG_SECTIONS:-args nodir resume pruned forward shrink saver simfwd afresh cleanup} "
want() { [[ $SECTIONS == *" $1 "* ]]; }
# 4000 synthetic samples, batch 32: 62 steps per epoch at 2 ranks, 125 at 1, 41 at 3.
CFG="$ROOT/configs/laptop.ini"
T=(train --config "$CFG" --model.name cnn --model.width 4 --log.progress false
   --train.threads 1 --data.source synthetic:1x28x28:10:4000 --data.prefetch 2 --train.batch 32
   --gossip.consensus_every 0 --gossip.timeout_s 60)
field() { grep "\"event\":\"$2\"" "$1" | tail -1 | py "import json,sys; print(json.loads(sys.stdin.read())['$3'])"; }

# Row 12: out of range or malformed values name the option and the range; no job starts.
if want args; then
  JOB=(-- "$MPIEXEC" -n 2 "$BIN" "${T[@]}" --checkpoint.dir ck0)
  check_refused() {  # expected text, supervise options...
    local expect=$1; shift
    rc=0; "$BIN" supervise "$@" "${JOB[@]}" > a.out 2> a.err || rc=$?
    [ "$rc" = 2 ] || fail "supervise $*: exit $rc, not 2: $(cat a.err)"
    [ "$(wc -l < a.err)" = 1 ] || fail "supervise $*: not one line: $(cat a.err)"
    grep -q -- "$expect" a.err || fail "supervise $*: says $(cat a.err), not $expect"
    [ ! -e ck0 ] || fail "supervise $*: the job ran"
  }
  check_refused "--start-timeout = -1 is out of range" --start-timeout -1
  check_refused "--stop-timeout = -5 is out of range" --stop-timeout=-5
  check_refused "--max-restarts = 99999999999999999999 is out of range" --max-restarts 99999999999999999999
  check_refused "--max-restarts = 3x is not a whole number" --max-restarts 3x
  check_refused "--min-ranks = 0 is out of range" --shrink-on-failure --min-ranks 0
  check_refused "--min-ranks 3 is more than the job's 2 ranks" --min-ranks 3
  check_refused "--start-timeout = 2147483648 is out of range" --start-timeout 2147483648
  JOB=(-- "$MPIEXEC" -n 0 "$BIN" "${T[@]}" --checkpoint.dir ck0)  # hydra: exit 0, no rank ran
  check_refused "-n 0 is no rank count"
  JOB=(-- "$MPIEXEC" -np abc "$BIN" "${T[@]}" --checkpoint.dir ck0)
  check_refused "-np abc is no rank count"
  rc=0; "$BIN" supervise --max-restarts > a.out 2> a.err || rc=$?
  [ "$rc" = 2 ] && grep -q -- "--max-restarts needs a value" a.err || fail "no value: $rc $(cat a.err)"
  echo "args: ok"
fi

# Row 5: no checkpoint.dir, refused before the job starts; one set in the INI is seen.
if want nodir; then
  rc=0; "$BIN" supervise -- "$MPIEXEC" -n 2 "$BIN" "${T[@]}" --train.max_steps 5 \
    --log.metrics nd.jsonl > nd.out 2> nd.err || rc=$?
  [ "$rc" = 2 ] || fail "no checkpoint.dir: exit $rc: $(cat nd.err)"
  [ "$(wc -l < nd.err)" = 1 ] && grep -q "the job has no checkpoint.dir" nd.err ||
    fail "no checkpoint.dir: $(cat nd.err)"
  [ ! -e nd.jsonl ] || fail "no checkpoint.dir: the job ran"
  sed 's/^dir =$/dir = ckini/' "$ROOT/configs/laptop.ini" > withdir.ini
  grep -q '^dir = ckini' withdir.ini || fail "no [checkpoint] dir line to set"
  TI=("${T[@]}"); TI[2]=withdir.ini
  "$BIN" supervise -- "$MPIEXEC" -n 2 "$BIN" "${TI[@]}" --train.max_steps 5 \
    --log.metrics ini.jsonl > ini.out 2> ini.err || fail "INI checkpoint.dir: $(tail -3 ini.err)"
  grep -q -- "-disable-auto-cleanup" ini.err || fail "INI checkpoint.dir: no emergency states"
  [ -e ckini/ckpt-000000000005/MANIFEST.json ] || fail "INI checkpoint.dir: no checkpoint"
  # No emergency states and no checkpoint before the end: said before the job runs.
  "$BIN" supervise --emergency-dir none -- "$MPIEXEC" -n 2 "$BIN" "${T[@]}" --train.max_steps 5 \
    --checkpoint.dir cknone --log.metrics none.jsonl > none.out 2> none.err ||
    fail "no checkpoint.every: $(tail -3 none.err)"
  [ "$(grep -c "a restart begins again at step 0; set --checkpoint.every N" none.err)" = 1 ] ||
    fail "no checkpoint.every: not said: $(cat none.err)"
  echo "nodir: ok"
fi

# A run stopped at step 20 (train.stop_at), as the user's starting point for rows 3.
if want resume || want pruned; then
  "$MPIEXEC" -n 2 "$BIN" "${T[@]}" --train.max_steps 300 --checkpoint.dir ck --checkpoint.every 20 \
    --train.stop_at 20 --log.metrics pre.jsonl > pre.out 2>&1 || fail "stop_at run: $(tail -3 pre.out)"
  [ -e ck/ckpt-000000000020/MANIFEST.json ] || fail "no ckpt-20"
  cp -r ck ck2
fi

# Row 3: launched from ck/ckpt-20, rank 1 stalled before step 75 and killed: the restart resumes
# from the newest checkpoint this job wrote (60 or later), not from 20. (Every kill below is of a
# stalled rank: a running one's kill raced the job's end, which a fast machine reached first.)
if want resume; then
  "$BIN" supervise --emergency-dir none -- "$MPIEXEC" -n 2 "$BIN" "${T[@]}" --train.max_steps 300 \
    --checkpoint.dir "$TMP/ck" --checkpoint.every 20 --checkpoint.keep 10 \
    --checkpoint.resume ck/ckpt-000000000020 --fault.stall 1:75 --log.metrics pre.jsonl \
    > r.out 2> r.err &
  sup=$!
  victim=$(stalled_rank "$TMP/ck " 1) || fail "resume: rank 1 did not stall"
  kill -9 "$victim"
  wait $sup || fail "resume: supervise exited $?: $(tail -5 r.err)"
  step=$({ grep -o "resumed from $TMP/ck/ckpt-[0-9]* at step [0-9]*" r.out || true; } | tail -1 |
    sed 's/.* //')
  [ -n "$step" ] && [ "$step" -ge 60 ] ||
    fail "resume: the restart did not resume from the newest checkpoint: $(grep resumed r.out)"
  grep -q "the job completed after 1 restart(s)" r.err || fail "resume: $(tail -3 r.err)"
  echo "resume: restarted from step $step, not 20: ok"
fi

# Row 3, pruned: checkpoint.keep 2 prunes ckpt-20 by step 60 (rank 1 killed before step 75);
# the restore from both ranks' emergency states must not stop at the missing folder (exit 2).
if want pruned; then
  "$BIN" supervise -- "$MPIEXEC" -n 2 "$BIN" "${T[@]}" --train.max_steps 300 \
    --checkpoint.dir "$TMP/ck2" --checkpoint.every 20 --checkpoint.keep 2 \
    --checkpoint.resume ck2/ckpt-000000000020 --fault.stall 1:75 --log.metrics p.jsonl \
    > p.out 2> p.err &
  sup=$!
  victim=$(stalled_rank "$TMP/ck2 " 1) || fail "pruned: rank 1 did not stall"
  wait_step p.jsonl 70
  [ ! -e ck2/ckpt-000000000020 ] || fail "pruned: ckpt-20 still there"
  kill -9 "$victim"
  wait $sup || fail "pruned: supervise exited $?: $(tail -5 p.err)"
  grep -q "2 of 2 rank states saved (lost: none); 2 ranks continue" p.err ||
    fail "pruned: no restore from the states: $(cat p.err)"
  grep -q "the job completed after 1 restart(s)" p.err || fail "pruned: $(tail -3 p.err)"
  echo "pruned: restored from the emergency states: ok"
fi

# Row 4: train.max_steps 300 at 2 ranks plans 300 x 64 = 19,200 samples. Rank 1 and its saver
# killed before step 120: rank 0 goes on alone (32 samples a step) and must still train them.
if want forward; then
  "$BIN" supervise -- "$MPIEXEC" -n 2 "$BIN" "${T[@]}" --train.max_steps 300 \
    --checkpoint.dir "$TMP/ck4" --checkpoint.every 100 --fault.stall 1:120 --log.metrics f.jsonl \
    > f.out 2> f.err &
  sup=$!
  victim=$(stalled_rank "$TMP/ck4" 1) || fail "forward: rank 1 did not stall"
  saver=$(pgrep -f "_emergency-saver $TMP/ck4/emergency/attempt-0 1\$") ||
    fail "forward: rank 1's saver not found"
  kill -9 "$saver" "$victim"
  wait $sup || fail "forward: supervise exited $?: $(tail -5 f.err)"
  grep -q "1 of 2 rank states saved (lost: 1); 1 ranks continue" f.err ||
    fail "forward: no forward recovery: $(cat f.err)"
  failed=$(field f.jsonl fault step); first=$(field f.jsonl fault first_step)
  steps=$(field f.jsonl summary steps)
  samples=$(( failed * 64 + (steps - first) * 32 ))
  echo "forward: failed in step $failed of 2 ranks, went on at step $first of 1 rank, ended" \
    "after step $steps: $samples of 19200 planned samples;" \
    "epochs $(field f.jsonl summary epochs) of $(field f.jsonl summary epochs_planned) planned"
  [ "$samples" -ge 19200 ] && [ "$samples" -le $((19200 + 3 * 64)) ] ||
    fail "forward: $samples samples trained, 19200 planned"
  grep -q "nothing left to train" f.out && fail "forward: nothing left to train"
  grep -q "counts steps of the 2 ranks the job was launched with" f.out ||
    fail "forward: the plan's conversion is not said"
  echo "forward: ok"
fi

# Row 4 with --shrink-on-failure 3 -> 2 from the checkpoint of step 60: max_steps 120 at 3 ranks
# plans 120 x 96 = 11,520 samples.
if want shrink; then
  "$BIN" supervise --shrink-on-failure --emergency-dir none -- "$MPIEXEC" -n 3 "$BIN" "${T[@]}" \
    --train.max_steps 120 --checkpoint.dir ck5 --checkpoint.every 20 --fault.kill 2:70 \
    --log.metrics s.jsonl > s.out 2> s.err || fail "shrink: supervise exited $?: $(tail -5 s.err)"
  read -r old new < <(grep -o "(3 ranks, step [0-9]*) at 2 ranks: .*continuing at step [0-9]*" \
    s.out | sed 's/(3 ranks, step \([0-9]*\)).* \([0-9]*\)$/\1 \2/')
  steps=$(field s.jsonl summary steps)
  samples=$(( old * 96 + (steps - new) * 64 ))
  echo "shrink: resumed step $old of 3 ranks as step $new of 2, ended after step $steps:" \
    "$samples of 11520 planned samples"
  [ "$samples" -ge 11520 ] && [ "$samples" -le $((11520 + 3 * 96)) ] ||
    fail "shrink: $samples samples trained, 11520 planned"
  echo "shrink: ok"
fi

# Row 13: rank 1's saver killed while rank 1 stalls before step 40; rank 1 itself killed at step
# 250 (fault.kill).
if want saver; then
  "$BIN" supervise -- "$MPIEXEC" -n 2 "$BIN" "${T[@]}" --train.max_steps 400 \
    --checkpoint.dir "$TMP/ck6" --checkpoint.every 100 --fault.stall 1:40 --fault.kill 1:250 \
    --log.metrics v.jsonl > v.out 2> v.err &
  sup=$!
  stalled=$(stalled_rank "$TMP/ck6" 1) || fail "saver: rank 1 did not stall"
  saver=$(pgrep -f "_emergency-saver $TMP/ck6/emergency/attempt-0 1\$") ||
    fail "saver: rank 1's saver not found"
  kill -9 "$saver"
  kill -CONT "$stalled"
  wait $sup || fail "saver: supervise exited $?: $(tail -5 v.err)"
  [ "$(grep -c "rank 1: warning: its emergency saver (pid $saver) was killed by signal 9: started a new one" v.err)" = 1 ] ||
    fail "saver: no one-line warning: $(grep -i saver v.err)"
  grep -q "2 of 2 rank states saved (lost: none); 2 ranks continue" v.err ||
    fail "saver: rank 1's state was lost: $(grep 'attempt 0 failed' v.err)"
  echo "saver: ok"
fi
# Sibling of row 4 without supervise: rank 1 leaves before step 30 of 3 ranks (simulated,
# forward); max_steps 100 plans 100 x 96 = 9,600 samples.
if want simfwd; then
  "$MPIEXEC" -n 3 "$BIN" "${T[@]}" --train.max_steps 100 --fault.strategy forward \
    --fault.inject 1:30 --log.metrics sf.jsonl > sf.out 2>&1 || fail "simfwd: $(tail -3 sf.out)"
  first=$({ grep -o "2 survivors carry on at step [0-9]*" sf.out || true; } | sed 's/.* //')
  steps=$(field sf.jsonl summary steps)
  [ -n "$first" ] || fail "simfwd: no forward recovery: $(tail -3 sf.out)"
  samples=$(( 30 * 96 + (steps - first) * 64 ))
  echo "simfwd: 2 survivors from step $first to $steps: $samples of 9600 planned samples"
  [ "$samples" -ge 9600 ] && [ "$samples" -le $((9600 + 3 * 96)) ] ||
    fail "simfwd: $samples samples trained, 9600 planned"
fi

# A fresh run over an earlier run's checkpoint (log.overwrite true), rank 1 killed at step 3, before
# its own first checkpoint: the restart starts afresh, not from the earlier run's step 40.
if want afresh; then
  "$MPIEXEC" -n 2 "$BIN" "${T[@]}" --train.max_steps 40 --checkpoint.dir ck7 \
    --log.metrics old.jsonl > old.out 2>&1 || fail "afresh: the earlier run: $(tail -3 old.out)"
  "$BIN" supervise --emergency-dir none -- "$MPIEXEC" -n 2 "$BIN" "${T[@]}" --train.max_steps 60 \
    --checkpoint.dir ck7 --checkpoint.every 50 --log.overwrite true --fault.kill 1:3 \
    --log.metrics new.jsonl > af.out 2> af.err || fail "afresh: supervise exited $?: $(tail -3 af.err)"
  grep -q "resumed from" af.out && fail "afresh: resumed the earlier run: $(grep resumed af.out)"
  grep -q "the job completed after 1 restart(s)" af.err || fail "afresh: $(tail -3 af.err)"
  [ "$(field new.jsonl summary steps)" = 60 ] || fail "afresh: $(tail -1 new.jsonl)"
  echo "afresh: ok"
fi

# --emergency-dir naming the checkpoint folder itself: the job's success removes this session's
# states, never the checkpoints beside them.
if want cleanup; then
  "$BIN" supervise --emergency-dir ck8 -- "$MPIEXEC" -n 2 "$BIN" "${T[@]}" --train.max_steps 5 \
    --checkpoint.dir ck8 --log.metrics c.jsonl > c.out 2> c.err || fail "cleanup: $(tail -3 c.err)"
  [ -e ck8/ckpt-000000000005/MANIFEST.json ] || fail "cleanup: the checkpoints went with the states"
  [ ! -e ck8/attempt-0 ] || fail "cleanup: the states were left"
  echo "cleanup: ok"
fi
echo "supervise hardening: ok"
