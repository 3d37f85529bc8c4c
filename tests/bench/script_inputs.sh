#!/usr/bin/env bash
# Names and points the bench scripts and job scripts take (issue 52, rows 1, 2, 9 and their
# siblings): a name a script does not know, or one that would run something other than what it
# says, or a point the run would refuse, ends the script at once with one line (exit 2) before
# anything runs or is made; a number that would overflow, a host name that would reach mpirun as
# an option, a host that does not answer: one line, exit 2, never a hang (every call is bounded by
# `timeout`); a study whose point failed does not exit 0.
# Usage: script_inputs.sh ROOT GOSSIPGRAD
set -uo pipefail
ROOT="$1"; BIN="$2"
cd "$ROOT"
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
fail=0
expect() {  # expect PATTERN -- COMMAND...: exit 2, one line on stderr holding PATTERN, within 60 s
  local pattern="$1"; shift 2
  local out rc
  out=$(timeout 60 "$@" 2>&1 >/dev/null); rc=$?
  if [ "$rc" -ne 2 ] || [ "$(printf '%s\n' "$out" | wc -l)" -ne 1 ] || ! grep -q -- "$pattern" <<<"$out"; then
    echo "FAIL: $*: exit $rc:"; printf '%s\n' "$out" | tail -5; fail=1
  else
    echo "ok: $out"
  fi
}
export GG_BIN="$BIN"

# bench/scale: no step per epoch (the epoch loop never ended), suffixes that ran another mode
# under their name, a point the dry run refuses; nothing made under bench/results.
before=$(ls bench/results | wc -l)
expect "leaves no step in an epoch" -- env BATCH=4096 MIN_STEPS=10 MODES=both NAME=x bench/scale/run.sh 256
for m in model-choco gossipgrad-choco both-choco; do
  expect "name the wire first" -- env MODES=$m NAME=x bench/scale/run.sh 8
done
for m in grad-choco allreduce-choco grad-nooverlap; do
  expect "act on the weights' gossip" -- env MODES=$m NAME=x bench/scale/run.sh 8
done
expect "would change nothing" -- env MODES=allreduce-global50 NAME=x bench/scale/run.sh 8
expect "would change nothing" -- env MODES=allreduce-ring NAME=x bench/scale/run.sh 8
expect "hypercube's pairs: drop -ring" -- env MODES=model-lowrank1-ring NAME=x bench/scale/run.sh 8
expect "would change nothing" -- env MODES=allreduce-exp2 NAME=x bench/scale/run.sh 8
expect "would change nothing" -- env MODES=allreduce-pushsum NAME=x bench/scale/run.sh 8
# The two-peer schedule with the overlapped weight exchange: the dry run's line.
expect "gossip.overlap_model = false" -- env MODES=model-exp2 NAME=x bench/scale/run.sh 8
expect "mode 'modle': unknown" -- env MODES=modle NAME=x bench/scale/run.sh 8
expect "p = 6, mode model-lowrank1: gossip.schedule: hypercube" -- env MODES=model-lowrank1 NAME=x bench/scale/run.sh 6
[ "$(ls bench/results | wc -l)" = "$before" ] || { echo "FAIL: bench/scale made files before refusing"; fail=1; }

# bench/convergence: a variant it does not know (was skipped without a word), a point the dry run
# refuses at its rank count (was found by mpirun after the earlier variants had run).
expect "unknown variant 'bothh'" -- env VARIANTS="both bothh" bench/convergence/run.sh 2
expect "model-lowrank1 (6 ranks): gossip.schedule: hypercube" -- env VARIANTS=model-lowrank1 NAME=x bench/convergence/run.sh 6
[ ! -e bench/results/convergence-x.runs ] || { echo "FAIL: bench/convergence made its folder before refusing"; fail=1; }

# bench/cluster/study.sh: a method word it does not know (a misspelt wire ran fp32), a tag the
# mode cannot honour, a point the dry run refuses; nothing made.
export GG_COMM_BIN=/bin/true
expect "unknown method 'grad+int2'" -- env GG_STUDY_POINTS="4 1000 quiet grad+int2" bench/cluster/study.sh --out "$TMP/s1"
expect "unknown method 'allreduce+nooverlap'" -- env GG_STUDY_POINTS="4 1000 quiet allreduce+nooverlap" bench/cluster/study.sh --out "$TMP/s1"
expect "unknown method 'ddp+fp8'" -- env GG_STUDY_POINTS="4 1000 quiet ddp+fp8" bench/cluster/study.sh --out "$TMP/s1"
expect "hypercube needs a power-of-two" -- env GG_STUDY_POINTS="6 1000 quiet model+lowrank1+lag" bench/cluster/study.sh --out "$TMP/s1"
expect "exchanges no weights" -- env GG_STUDY_POINTS="4 1000 quiet grad+int4+choco" bench/cluster/study.sh --out "$TMP/s1"
[ ! -e "$TMP/s1" ] || { echo "FAIL: study.sh made its folder before refusing"; fail=1; }
unset GG_COMM_BIN

# bench/compute/run.sh: a setting's model or numbers, before it rewrites its results (an unknown
# model truncated bench/results/compute-*.csv, then ended in a Python traceback).
expect "model 'resnet51' is not one both gossipgrad and torchvision build" -- bench/compute/run.sh resnet51:16:224:2
expect "precision 'fp16' is not one of: fp32 bf16" -- bench/compute/run.sh resnet50:16:224:2:fp16
expect "THREADS of 'googlenet:16:64:99999' = '99999'" -- bench/compute/run.sh googlenet:16:64:99999
expect "precision 'int8' is not one of" -- bench/compute/run.sh --backend cuda resnet50:16:224:int8
[ -z "$(git status --porcelain bench/results)" ] || { echo "FAIL: bench/results changed"; fail=1; }

# bench/comm and bench/scaling: rank counts unchecked (comm) and a failed count silently left out;
# a config that is not a file, and no one-rank run for the simulator (a traceback at the end).
expect "RANKS = 'x' must be a whole number in \[2, 1024\]" -- bench/comm/run.sh 2 x
expect "config 'configs/nope.ini' is not a file" -- bench/scaling/run.sh configs/nope.ini 1 2
expect "must include 1" -- bench/scaling/run.sh configs/laptop.ini 2 4

# The job scripts (configs/*.sbatch through configs/launch.sh): numbers that wrapped, a host that
# reached mpirun as an option, a host that does not answer (MPICH's launcher waited for ever).
for s in cpu-cluster h100 p100-ib knl-aries; do
  expect "--ranks-per-node '4611686018427387904' must be a whole number in \[1, 4096\]" -- \
    bash "configs/$s.sbatch" --nodes localhost --ranks-per-node 4611686018427387904 --dry-run
  expect "--ranks-per-node '9999999999999999999' must be" -- \
    bash "configs/$s.sbatch" --nodes localhost --ranks-per-node 9999999999999999999 --dry-run
  expect "--nodes '-localhost' is not a comma-separated list" -- bash "configs/$s.sbatch" --nodes -localhost --dry-run
done
expect "could not start a process on every node of 'nosuchhost.invalid' within 3 s" -- \
  env GG_LAUNCH_PROBE_S=3 bash configs/cpu-cluster.sbatch --nodes nosuchhost.invalid --dry-run
out=$(timeout 20 env SLURM_JOB_NODELIST=n1 SLURM_JOB_NUM_NODES=99999999999999999999 bash configs/h100.sbatch --dry-run 2>&1)
rc=$?
if [ "$rc" = 0 ] || [ "$rc" = 124 ] || ! grep -q "SLURM_JOB_NUM_NODES = '99999999999999999999' is not a node count" <<<"$out"; then
  echo "FAIL: a Slurm node count of 20 digits: exit $rc: $out"; fail=1
fi

# A study whose point fails ends non-zero naming it (it exited 0). On 2 namespace nodes, with a
# gossipgrad that answers the dry run and fails the run; skipped where namespaces cannot be made.
if ip netns add "ggsi$$-probe" 2>/dev/null; then
  ip netns del "ggsi$$-probe"
  printf '#!/usr/bin/env bash\n[[ " $* " == *" --dry-run "* ]] && exec %q "$@"\nexit 3\n' "$BIN" >"$TMP/failing"
  chmod +x "$TMP/failing"
  out=$(timeout 300 env GG_BIN="$TMP/failing" GG_COMM_BIN=/bin/true GG_STUDY_PREFIX="ggsi$$" \
    GG_STUDY_POINTS="2 1000 quiet grad" bench/cluster/study.sh --out "$TMP/s2" 2>&1)
  rc=$?
  if [ "$rc" != 1 ] || ! grep -q "point(s) failed:.* p2-r1000-quiet-grad " <<<"$out"; then
    echo "FAIL: a study with a failed point: exit $rc: $(tail -3 <<<"$out")"; fail=1
  else
    echo "ok: $(grep 'point(s) failed' <<<"$out")"
  fi
  ! ip netns list | grep -q "ggsi$$" || { echo "FAIL: the study left namespaces"; fail=1; }
else
  echo "skipped: a study with a failed point (no network namespaces here)"
fi

# TORCH names the baselines' PyTorch (2.15 or debian): another value ran Debian's 1.13 under
# 2.15's name before the scripts checked it.
expect "TORCH = '1.13' must be 2.15" -- env TORCH=1.13 GG_STUDY_POINTS="4 1000 quiet ddp" bench/cluster/study.sh --out "$TMP/t1"
expect "TORCH = '2.1' must be 2.15" -- env TORCH=2.1 bench/cluster/real.sh --out "$TMP/t2"
expect "TORCH = 'latest' must be 2.15" -- env TORCH=latest bench/compute/run.sh resnet50:16:64:2
expect "ONEDNN = '3.13' must be debian" -- env ONEDNN=3.13 bench/compute/run.sh resnet50:16:64:2
exit $fail
