#!/usr/bin/env bash
# Numbers the scripts take from the environment or the command line (issue 31's sibling hunt:
# every integer read from a user): a bad one ends the script at once with one line, exit 2,
# before it installs, builds or runs anything (each call is bounded by `timeout 20`, far below a
# build).
set -uo pipefail
ROOT="$1"
cd "$ROOT"
fail=0
expect() {  # expect NAME PATTERN -- COMMAND...
  local name="$1" pattern="$2"; shift 3
  local out rc
  out=$(timeout 20 "$@" 2>&1); rc=$?
  if [ "$rc" -ne 2 ] || [ "$(printf '%s\n' "$out" | wc -l)" -ne 1 ] || ! grep -q -- "$pattern" <<<"$out"; then
    echo "FAIL: $name: exit $rc:"; printf '%s\n' "$out" | tail -5; fail=1
  else
    echo "ok: $name -> $out"
  fi
}
expect "quickstart RANKS=abc" "RANKS = 'abc'" -- env RANKS=abc ./quickstart.sh
expect "quickstart RANKS=0" "RANKS = '0'" -- env RANKS=0 ./quickstart.sh
expect "compute REPEATS=-1" "REPEATS = '-1'" -- env REPEATS=-1 bench/compute/run.sh
expect "compute STEPS=ten" "STEPS = 'ten'" -- env STEPS=ten bench/compute/run.sh --backend cuda
expect "profile TORCH=2" "TORCH = '2'" -- env TORCH=2 bench/compute/profile.sh
expect "layout_ab STEPS=0" "STEPS = '0'" -- env STEPS=0 bench/compute/layout_ab.sh
expect "layout_ab OLD without a build" "OLD = '/nonexistent' holds no" -- env OLD=/nonexistent bench/compute/layout_ab.sh
expect "compute NAME=../x" "NAME = '../x'" -- env NAME=../x bench/compute/run.sh
expect "profile NAME=a/b" "NAME = 'a/b'" -- env NAME=a/b bench/compute/profile.sh
expect "gpu_device_run BUDGET_S=abc" "BUDGET_S = 'abc'" -- env BUDGET_S=abc bench/compute/gpu_device_run.sh run "${TMPDIR:-/tmp}"
expect "gpu_device_run R50_BATCH=0" "R50_BATCH = '0'" -- env R50_BATCH=0 bench/compute/gpu_device_run.sh run "${TMPDIR:-/tmp}"
expect "apoptosis RANKS=1 x" "RANKS = 'x'" -- env RANKS="1 x" bench/apoptosis/run.sh
expect "convergence EPOCHS=1e3" "EPOCHS = '1e3'" -- env EPOCHS=1e3 bench/convergence/run.sh
expect "convergence ranks -2" "RANKS = '-2'" -- bench/convergence/run.sh 2 -2
expect "scaling WARM above STEPS" "WARM = 50 must be below STEPS = 20" -- env STEPS=20 WARM=50 bench/scaling/run.sh
expect "scaling huge STEPS" "STEPS = '99999999999999999999'" -- env STEPS=99999999999999999999 bench/scaling/run.sh
expect "resilience RANKS=1" "RANKS = '1'" -- env RANKS=1 bench/resilience/run.sh
expect "loader seconds" "SECONDS = 'fast'" -- bench/loader/run.sh fast
expect "study jitter" "GG_STUDY_JITTER = 'lots'" -- env GG_STUDY_JITTER=lots bench/cluster/study.sh
expect "study GG_STUDY_WARMUP=-1" "GG_STUDY_WARMUP = '-1'" -- env GG_BIN=/bin/true GG_COMM_BIN=/bin/true GG_STUDY_WARMUP=-1 bench/cluster/study.sh
expect "study GG_STUDY_STEPS=0" "GG_STUDY_STEPS = '0'" -- env GG_BIN=/bin/true GG_COMM_BIN=/bin/true GG_STUDY_STEPS=0 bench/cluster/study.sh
expect "study GG_STUDY_POINTS" "point '16 abc quiet model'" -- env GG_BIN=/bin/true GG_COMM_BIN=/bin/true GG_STUDY_POINTS="16 abc quiet model" bench/cluster/study.sh
expect "real --rounds 0" "--rounds 0: a whole number >= 1" -- bench/cluster/real.sh --rounds 0
expect "real --nodes x" "--nodes x: a whole number >= 1" -- bench/cluster/real.sh --nodes x
expect "real GG_REAL_METHODS" "unknown method 'foo'" -- env GG_REAL_METHODS=foo bench/cluster/real.sh
expect "ddp_train --steps 0" "--steps and --threads must be >= 1" -- /usr/bin/python3 bench/cluster/ddp_train.py --steps 0
expect "ddp_emulate --powersgd-rank 0" "--powersgd-rank must be >= 1" -- /usr/bin/python3 bench/cluster/ddp_emulate.py --powersgd-rank 0
[ $fail = 0 ] && echo "PASS: the scripts refuse bad numbers in one line before any work"
exit $fail
