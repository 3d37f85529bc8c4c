#!/usr/bin/env bash
# Full checkpoints under mpirun: resume is exact (2N steps == N, checkpoint, N more: every rank's
# state file identical byte for byte) with the default gossip mode and the shuffle off, ids and
# bytes, also across epoch boundaries; resume at another rank count (2 -> 3, 4 -> 2); a corrupt
# or partial newest checkpoint is skipped and the previous one used (still exact); bad input
# (every checkpoint corrupt, another model, an invalid config) exits non-zero with one line and
# leaves the checkpoints untouched; the NaN guard restores and continues (or stops with one line);
# a hung partner is reported after gossip.timeout_s instead of hanging.
set -euo pipefail
BIN="$1"; ROOT="$2"; MPIEXEC="$3"
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
cd "$TMP"
export OMP_NUM_THREADS=1
fail() { echo "FAIL: $*"; exit 1; }
# 2000 synthetic samples, batch 32: 31 steps per epoch at 2 ranks; 80 steps cross two epochs.
RUN=(train --config "$ROOT/configs/laptop.ini" --data.source synthetic:1x28x28:10:2000
     --data.prefetch 2 --model.width 4 --train.batch 32 --train.threads 1 --train.epochs 3
     --log.progress false --gossip.consensus_every 0 --checkpoint.every 20)
# MAX=N train P ARGS...: P ranks, N steps (default 80).
train() { local p=$1; shift; "$MPIEXEC" -n "$p" "$BIN" "${RUN[@]}" --train.max_steps "${MAX:-80}" "$@"; }
same_states() {  # same_states DIR_A DIR_B STEP: every rank file of ckpt-STEP identical
  local a b n=0
  for a in "$1"/ckpt-$(printf %012d "$3")/rank-*.bin; do
    b="$2/${a#"$1"/}"
    cmp -s "$a" "$b" || fail "$a and $b differ"
    n=$((n + 1))
  done
  [ "$n" -ge 2 ] || fail "no rank files in $1 at step $3"
}

for shuffle in off ids bytes; do
  train 2 --data.shuffle $shuffle --checkpoint.dir A$shuffle --log.metrics a$shuffle.jsonl > a.log
  # Stopped at 40 as if preempted, resumed to 80 (the learning-rate schedule spans 80 in both).
  train 2 --data.shuffle $shuffle --checkpoint.dir B$shuffle --log.metrics b$shuffle.jsonl \
    --train.stop_at 40 > b1.log
  grep -q "stopped after step 40" b1.log || fail "no stop message"
  train 2 --data.shuffle $shuffle --checkpoint.dir B$shuffle --log.metrics b$shuffle.jsonl \
    --checkpoint.resume auto > b2.log
  grep -q "resumed from B$shuffle/ckpt-000000000040 at step 40" b2.log || fail "not resumed"
  same_states A$shuffle B$shuffle 60
  same_states A$shuffle B$shuffle 80
  # checkpoint.keep = 3 by default
  [ "$(ls -d A$shuffle/ckpt-* | wc -l)" = 3 ] || fail "keep 3: $(ls A$shuffle)"
  echo "exact resume with shuffle $shuffle: ok"
done

# The newest checkpoint corrupt, the one before it partial: the one before that is used, and
# the run still ends bit for bit where the uninterrupted one did.
cp -r Aids C
printf 'x' | dd of=C/ckpt-000000000080/rank-00001.bin bs=1 seek=200 conv=notrunc 2>/dev/null
rm C/ckpt-000000000070/MANIFEST.json 2>/dev/null || rm C/ckpt-000000000060/MANIFEST.json
ls C
train 2 --data.shuffle ids --checkpoint.dir C --log.metrics c.jsonl --checkpoint.resume auto \
  > c.log 2> c.err
grep -q "skipping checkpoint C/ckpt-000000000080: .*checksum mismatch" c.err || fail "corrupt"
grep -q "MANIFEST.json is missing" c.err || fail "partial not reported"
grep -q "resumed from C/ckpt-000000000040 at step 40" c.log || fail "previous one not used"
same_states Aids C 80
echo "corrupt and partial checkpoints skipped, the previous one used: ok"

# Bad input never touches existing checkpoints.
cp -r Aids D
for f in D/ckpt-*/rank-*.bin; do truncate -s -7 "$f"; done
sum_before=$(find D -type f -not -name run.lock -exec md5sum {} + | sort)
set +e
train 2 --data.shuffle ids --checkpoint.dir D --log.metrics d.jsonl --checkpoint.resume auto \
  > d.log 2> d.err
rc=$?
set -e
[ $rc -ne 0 ] || fail "all-corrupt resume exited 0"
grep -q "error: checkpoint.resume: no valid checkpoint in D (every one is corrupt or incomplete)" \
  d.err || fail "no clear error: $(cat d.err)"
[ "$(grep -c 'error:' d.err)" -ge 1 ]
set +e
train 2 --data.shuffle ids --checkpoint.dir Aids --log.metrics e.jsonl --checkpoint.resume auto \
  --model.batch_norm false > e.log 2> e.err
rc_model=$?
train 2 --data.shuffle ids --checkpoint.dir Aids --log.metrics f.jsonl --checkpoint.resume auto \
  --train.lr -1 > f.log 2> f.err
rc_config=$?
"$BIN" train --config "$ROOT/configs/laptop.ini" --checkpoint.resume nowhere > g.log 2> g.err
rc_missing=$?
set -e
[ $rc_model = 2 ] && [ "$(wc -l < e.err)" = 1 ] || fail "model mismatch: $rc_model $(cat e.err)"
grep -q "Aids/ckpt-000000000080 holds another model than this run builds: model.batch_norm true there, false here" e.err ||
  fail "model mismatch: no line naming the setting: $(cat e.err)"
[ $rc_config = 2 ] && [ "$(wc -l < f.err)" = 1 ] || fail "bad config: $rc_config"
[ $rc_missing = 2 ] && grep -q "checkpoint.resume = nowhere is not a folder" g.err
[ "$(find D -type f -not -name run.lock -exec md5sum {} + | sort)" = "$sum_before" ] || fail "D was touched"
same_states Aids Bids 80
echo "bad input: one line, non-zero exit, checkpoints untouched: ok"

# Another rank count: 2 -> 3 and 4 -> 2, with the shuffle on (samples reassigned).
cp -r Aids R3
MAX=0 train 3 --data.shuffle ids --checkpoint.dir R3 --log.metrics r3.jsonl \
  --checkpoint.resume auto > r3.log
grep -q "resumed from R3/ckpt-000000000080 (2 ranks, step 80) at 3 ranks" r3.log || fail "2->3"
grep -q '"ranks": 3' R3/ckpt-*/MANIFEST.json || fail "no 3-rank checkpoint"
MAX=25 train 4 --data.shuffle bytes --checkpoint.dir R4 --log.metrics r4.jsonl > r4.log
MAX=60 train 2 --data.shuffle bytes --checkpoint.dir R4 --log.metrics r4.jsonl \
  --checkpoint.resume auto > r2.log
grep -q "resumed from R4/ckpt-000000000025 (4 ranks, step 25) at 2 ranks" r2.log || fail "4->2"
grep -q '"ranks": 2' R4/ckpt-000000000060/MANIFEST.json || fail "no 2-rank checkpoint"
echo "resume at another rank count: ok"

# NaN guard: rank 0's weights become NaN at step 25; every rank goes back to its snapshot.
train 2 --log.metrics n.jsonl --guard.snapshot_every 10 --fault.nan 25 --checkpoint.dir N > n.log
grep -q '"event":"guard","lr_scale":0.5,"restored_step":20,"restores":1,"step":25' n.jsonl ||
  fail "no guard event: $(grep guard n.jsonl)"
grep -q '"event":"summary"' n.jsonl || fail "the run did not complete"
if grep '"event":"step"' n.jsonl | grep -q '"loss":null'; then fail "a NaN loss was logged"; fi
set +e
train 2 --log.metrics n0.jsonl --guard.nan_retries 0 --fault.nan 25 --checkpoint.dir N0 \
  > n0.log 2> n0.err
rc=$?
set -e
[ $rc = 1 ] && grep -q "the loss became non-finite at step 25; lower train.lr" n0.err ||
  fail "guard off: $rc $(cat n0.err)"
# guard.lag 1: the agreement on step 25 runs behind step 26, which restores the same snapshot
# (step 26's record says so) or stops with the same line.
train 2 --log.metrics nl.jsonl --guard.snapshot_every 10 --fault.nan 25 --guard.lag 1 \
  --checkpoint.dir NL > nl.log
grep -q '"event":"guard","lr_scale":0.5,"restored_step":20,"restores":1,"step":25' nl.jsonl ||
  fail "lag 1: no guard event: $(grep guard nl.jsonl)"
grep -q '"event":"summary"' nl.jsonl || fail "lag 1: the run did not complete"
set +e
train 2 --log.metrics nl0.jsonl --guard.nan_retries 0 --fault.nan 25 --guard.lag 1 \
  --checkpoint.dir NL0 > nl0.log 2> nl0.err
rc=$?
set -e
[ $rc = 1 ] && grep -q "the loss became non-finite at step 25; lower train.lr" nl0.err ||
  fail "lag 1, guard off: $rc $(cat nl0.err)"
echo "NaN guard: ok"

# A hung partner (SIGSTOP) is reported within gossip.timeout_s, naming rank, step and bucket.
set +e
timeout 120 "$MPIEXEC" -n 2 "$BIN" "${RUN[@]}" --log.metrics t.jsonl --checkpoint.dir T \
  --train.max_steps 80 --fault.stall 1:15 --gossip.timeout_s 2 > t.log 2> t.err
rc=$?
set -e
[ $rc -ne 0 ] && [ $rc -ne 124 ] || fail "timeout: exit $rc"
grep -q "rank 0 waited more than 2 s for rank 1 at step 15, bucket" t.err ||
  fail "no timeout message: $(cat t.err)"
echo "partner timeout: ok"

# A job that died during its first full checkpoint left a folder without a manifest: auto
# starts afresh; a fresh run without resume or overwrite refuses a folder with full checkpoints.
mkdir -p P/ckpt-000000000020 && echo partial > P/ckpt-000000000020/rank-00000.bin
MAX=20 train 2 --checkpoint.dir P --log.metrics p.jsonl --checkpoint.resume auto > p.log
grep -q "no checkpoint in P yet: starting from step 0" p.log || fail "partial-only folder"
verify=$(cat P/ckpt-000000000020/MANIFEST.json | grep -c '"step": 20')
[ "$verify" = 1 ] || fail "no new checkpoint at 20"
set +e
MAX=20 train 2 --checkpoint.dir P --log.metrics p2.jsonl > p2.log 2> p2.err
rc=$?
set -e
[ $rc = 2 ] && grep -q "already holds a checkpoint" p2.err || fail "fresh run over checkpoints"
echo "partial first checkpoint, refused fresh run: ok"
