#!/usr/bin/env bash
# The checkpoint folder is checked before training, not at the first write after it (issue 15):
# an unwritable folder, a read-only or full file system and an unwritable timeline folder exit 2
# (and metrics that fill the disk end the run with one line)
# with one line before any step; a second run in a folder that a run is using exits 2 and leaves
# the first run's files alone; the lock goes with the run, so a resume in the folder works.
set -euo pipefail
BIN="$1"; ROOT="$2"; MPIEXEC="$3"
TMP=$(mktemp -d)
MOUNTS=()
cleanup() {
  pkill -KILL -f "$TMP" 2>/dev/null || true
  for m in "${MOUNTS[@]}"; do umount "$m" 2>/dev/null || true; done
  rm -rf "$TMP"
}
trap cleanup EXIT
cd "$TMP"
export OMP_NUM_THREADS=1
fail() { echo "FAIL: $*"; for f in *.log; do echo "== $f"; tail -4 "$f"; done; exit 1; }
RUN=(train --config "$ROOT/configs/laptop.ini" --data.source synthetic:1x28x28:10:2048
     --model.width 16 --train.threads 1 --train.epochs 100 --log.interval 0.5
     --gossip.consensus_every 0)
# name, message, options: the run must exit 2 before its first step, with the message.
refused() {
  local name=$1 msg=$2; shift 2
  local rc=0
  "$MPIEXEC" -n 2 "$BIN" "${RUN[@]}" --log.metrics "$TMP/$name.jsonl" "$@" > "$name.log" 2>&1 ||
    rc=$?
  [ "$rc" = 2 ] || fail "$name: exit $rc, not 2"
  grep -q "$msg" "$name.log" || fail "$name: no line saying '$msg'"
  grep -q "^step " "$name.log" && fail "$name: it trained before refusing"
  echo "$name: $(grep 'error' "$name.log" | head -1)"
}
refused proc "checkpoint.dir = /proc/gossipgrad-ck: /proc is not a folder\|cannot write in /proc" \
  --checkpoint.dir /proc/gossipgrad-ck
refused timeline "log.timeline = /proc/gossipgrad.json: cannot write in /proc" \
  --log.timeline /proc/gossipgrad.json

# Read-only and full file systems: tmpfs mounts (root only; skipped elsewhere).
mkdir ro full
if mount -t tmpfs -o size=1m,ro tmpfs "$TMP/ro" 2>/dev/null; then
  MOUNTS+=("$TMP/ro")
  refused readonly "cannot write in $TMP/ro: Read-only file system" --checkpoint.dir "$TMP/ro/ck"
  mount -t tmpfs -o size=1m tmpfs "$TMP/full" && MOUNTS+=("$TMP/full")
  refused full "MB free; one checkpoint of this run needs about" --checkpoint.dir "$TMP/full/ck"
  # Metrics on a file system that fills up: the run fails with one line, not exit 0 without them.
  mkdir tiny && mount -t tmpfs -o size=12k tmpfs "$TMP/tiny" && MOUNTS+=("$TMP/tiny")
  rc=0
  "$MPIEXEC" -n 2 "$BIN" "${RUN[@]}" --train.max_steps 400 --log.metrics "$TMP/tiny/m.jsonl" \
    > tiny.log 2>&1 || rc=$?
  [ "$rc" != 0 ] || fail "metrics on a full disk: exit 0"
  grep -q "cannot write the metrics file $TMP/tiny/m.jsonl" tiny.log || fail "metrics: no line"
else
  echo "readonly, full: skipped (cannot mount a tmpfs here)"
fi

# Two runs, one folder: the second is refused while the first trains; the first is untouched.
"$MPIEXEC" -n 2 "$BIN" "${RUN[@]}" --checkpoint.dir "$TMP/ck" --checkpoint.every 20 \
  --log.metrics "$TMP/a.jsonl" > a.log 2>&1 &
a=$!
for _ in $(seq 1200); do grep -q "^step " a.log 2>/dev/null && break; sleep 0.1; done
grep -q "^step " a.log || fail "run a did not start"
refused second "checkpoint.dir = $TMP/ck is in use by another run (pid" \
  --checkpoint.dir "$TMP/ck" --log.overwrite true
kill -TERM "$a"
# The ranks exit 143; what mpirun reports after a forwarded signal is hydra's choice (sometimes 0),
# so the stop is judged by the run's own line and by the resume below.
wait "$a" || true
grep -q "stopped by SIGTERM" a.log || fail "run a did not stop cleanly"
[ "$(grep -c '"event":"start"' a.jsonl)" = 1 ] || fail "run a's metrics were touched"
# The lock went with run a: a resume in the same folder runs.
"$MPIEXEC" -n 2 "$BIN" "${RUN[@]}" --train.max_steps 100 --checkpoint.dir "$TMP/ck" \
  --checkpoint.resume auto --log.metrics "$TMP/c.jsonl" > c.log 2>&1 ||
  fail "resume after run a: exit $?"
grep -q "resumed" c.log || fail "run c did not resume"
echo "PASS: checkpoint folders are checked and locked before training"
