#!/usr/bin/env bash
# The sibling hunt of issue 52 over the bench and job scripts, beyond script_inputs.sh: input that
# a script ran under a name that is not what ran (a result mislabelled), a number that wrapped or
# ran a point as something else, a failure blamed on the wrong thing. Each case ends the script
# with one line on stderr and exit 2 (1 for a failed run, a half-made images folder), before
# anything runs or is made; every call is bounded by `timeout 60`, so a hang fails. No cluster, no
# training: the scripts get a gossipgrad that answers the dry run and fails any run.
# Usage: script_siblings.sh ROOT GOSSIPGRAD
set -uo pipefail
ROOT="$1"; BIN="$2"
cd "$ROOT"
TMP=$(mktemp -d)
# (what a regressed script would leave under bench/results, under this test's own names)
trap 'rm -rf "$TMP" bench/results/convergence-siblings.runs bench/results/scale-siblings.runs bench/results/*-siblings.txt' EXIT
fail=0
expect() {  # expect PATTERN -- COMMAND...: exit 2, one line on stderr holding PATTERN
  local want=2 pattern="$1" out rc
  shift 2
  out=$(timeout 60 "$@" 2>&1 >/dev/null); rc=$?
  if [ "$rc" -ne "$want" ] || [ "$(printf '%s\n' "$out" | wc -l)" -ne 1 ] || ! grep -qF -- "$pattern" <<<"$out"; then
    echo "FAIL: $*: exit $rc (expected $want, one line with '$pattern'):"; printf '%s\n' "$out" | tail -5; fail=1
  else
    echo "ok: $out"
  fi
}

# bench/cluster/study.sh: method words it knows that together ran something else under the name
# (a second wire won, allreduce ran fp32 under +bf16 and ignored +ring and @rma, +pipeline won
# over +nooverlap), a clash blamed on an option given twice (+lowrank1+ring), point numbers that
# wrapped or shaped the links to 0 Mbit/s after the cluster was made, a p of +hier's 2 ranks per
# node that is odd, GG_STUDY_TRANSPORT that relabelled nothing; nothing made.
study=(env GG_BIN="$BIN" GG_COMM_BIN=/bin/true bench/cluster/study.sh --out "$TMP/s")
expect "method 'model+int4+int8': two wires" -- env GG_STUDY_POINTS="16 1000 quiet model+int4+int8" "${study[@]}"
expect "method 'grad+bf16+bf16': +bf16 twice" -- env GG_STUDY_POINTS="16 1000 quiet grad+bf16+bf16" "${study[@]}"
for m in allreduce+bf16 allreduce+ring allreduce@rma; do
  expect "method '$m': allreduce moves its bytes with MPI_Allreduce in fp32" -- env GG_STUDY_POINTS="16 1000 quiet $m" "${study[@]}"
done
expect "+nooverlap and +pipeline are two ways" -- env GG_STUDY_POINTS="16 1000 quiet model+int4+choco+ring+pipeline+nooverlap" "${study[@]}"
expect "+hier runs two ranks per node already" -- env GG_STUDY_POINTS="16 1000 quiet grad+ppn2+hier" "${study[@]}"
expect "@shm reaches no partner on another node" -- env GG_STUDY_POINTS="16 1000 quiet grad@shm" "${study[@]}"
expect "+lowrankN sends fp32 factors" -- env GG_STUDY_POINTS="16 1000 quiet model+lowrank1+ring" "${study[@]}"
expect "+lowrankN sends fp32 factors" -- env GG_STUDY_POINTS="16 1000 quiet model+int4+choco+lowrank4" "${study[@]}"
expect "p = '99999999999999999999' must be a whole number in [2, 500]" -- env GG_STUDY_POINTS="99999999999999999999 1000 quiet ddp" "${study[@]}"
expect "rate_mbit = '99999999999999999999' must be" -- env GG_STUDY_POINTS="16 99999999999999999999 quiet ddp" "${study[@]}"
expect "K = '5000' must be a whole number in [1, 1000]" -- env GG_STUDY_POINTS="16 1000 quiet ddp 5000" "${study[@]}"
expect "p must be a multiple of 2" -- env GG_STUDY_POINTS="5 1000 quiet grad+hier" "${study[@]}"
expect "dilation K = 1600 leaves the link 1000 / 1600 < 1 Mbit/s" -- env GG_STUDY_BUDGET_MBIT=10 GG_STUDY_POINTS="16 1000 quiet ddp" "${study[@]}"
expect "GG_STUDY_TRANSPORT = 'shm': use p2p, rma or auto" -- env GG_STUDY_TRANSPORT=shm GG_STUDY_POINTS="16 1000 quiet grad" "${study[@]}"
expect "GG_STUDY_SLOW_START_AFTER_IDLE = 'yes'" -- env GG_STUDY_SLOW_START_AFTER_IDLE=yes GG_STUDY_POINTS="16 1000 quiet grad" "${study[@]}"
[ ! -e "$TMP/s" ] || { echo "FAIL: study.sh made its folder before refusing"; fail=1; }
# ... and a folder of another study's setting, whose points it would skip as done and report as
# its own (points.csv carries no profile).
mkdir "$TMP/p100"
echo "profile p100, jitter p99 2.5, warmup 2, steps 5, tcp_slow_start_after_idle 1, extra ''" >"$TMP/p100/settings.txt"
expect "/p100 holds points of profile p100, jitter p99 2.5, warmup 2, steps 5, tcp_slow_start_after_idle 1, extra '', not profile h100" -- \
  env GG_BIN="$BIN" GG_COMM_BIN=/bin/true GG_STUDY_POINTS="16 1000 quiet ddp" bench/cluster/study.sh --out "$TMP/p100" --profile h100

# A gossipgrad that answers the dry run and runs nothing (exit 3): the scripts below train on a
# regression instead of refusing; this way they fail at once.
printf '#!/usr/bin/env bash\n[[ " $* " == *" --dry-run "* ]] && exec %q "$@"\necho "stand-in: no run" >&2\nexit 3\n' "$BIN" >"$TMP/dry-only"
chmod +x "$TMP/dry-only"
before=$(ls bench/results | wc -l)

# bench/resilience: a fraction F above the run's steps gave fault.mtbf_steps 0, a run without a
# single failure under the name of its strategy and F; a batch from the config alone (EXTRA's
# train.batch missed); a run the dry run refuses surfaced as an arithmetic error.
res=(env BIN="$TMP/dry-only" TAG=siblings bench/resilience/run.sh)
expect "FRACTIONS: F = 500 gives MTBF = 234 steps / 500 = 0, a run without failures" -- env FRACTIONS="2 500" "${res[@]}"
expect "FRACTIONS: F = 300 gives MTBF = 117 steps / 300 = 0" -- env FRACTIONS=300 EXTRA="--train.batch 128" "${res[@]}"
expect "bench/resilience: train.batch = 64 is too large: 60000 samples over 4096 ranks" -- env RANKS=4096 "${res[@]}"
expect "config 'configs/nope.ini' is not a file" -- "${res[@]}" configs/nope.ini

# bench/apoptosis: fewer than 9 steps an epoch gave apoptosis.interval 0, refused by the apoptosis
# run after the plain one had run (and ended without a word); APOP checked by the dry run.
apo=(env BIN="$TMP/dry-only" TAG=siblings bench/apoptosis/run.sh)
expect "at 128 rank(s) of batch 64 an epoch has 8 step(s): too few" -- env RANKS="2 128" "${apo[@]}"
expect "at 64 rank(s) of batch 128 an epoch has 8 step(s)" -- env RANKS=64 EXTRA="--train.batch 128" "${apo[@]}"
expect "2 rank(s): apoptosis.layers = nope is unknown" -- env RANKS=2 APOP="--apoptosis.layers nope" "${apo[@]}"
out=$(timeout 60 env RANKS=1 "${apo[@]}" 2>&1 >/dev/null); rc=$?
if [ "$rc" != 1 ] || [ "$(tail -1 <<<"$out")" != "bench/apoptosis: 1 rank(s), plain, run 1 failed: stand-in: no run" ]; then
  echo "FAIL: a failed apoptosis run: exit $rc (expected 1 and its line): $(tail -3 <<<"$out")"; fail=1
else
  echo "ok: $(tail -1 <<<"$out")"
fi
# bench/convergence: a gossip variant at 1 rank ran as a single rank under its gossip name; grad-hier
# at an odd p failed on its uneven simulated nodes after the folder was made.
conv=(env GG_BIN="$TMP/dry-only" NAME=siblings bench/convergence/run.sh)
expect "convergence: p1-gossip-both: one rank has no partner" -- env VARIANTS="single both" "${conv[@]}" 1 2
expect "convergence: p3-gossip-grad-hier: grad-hier simulates nodes of 2 ranks" -- env VARIANTS="grad grad-hier" "${conv[@]}" 2 3
# bench/scale and bench/convergence: a runs folder of another recipe (BATCH, EPOCHS, EXTRA, ...),
# whose runs the table set beside the new ones under the same names.
mkdir -p bench/results/scale-siblings.runs bench/results/convergence-siblings.runs
echo "EPOCHS=2 MIN_STEPS=0 BATCH=8 RANK_EVAL=500 EXTRA=''" >bench/results/scale-siblings.runs/settings.txt
echo "EPOCHS=12 EXTRA=''" >bench/results/convergence-siblings.runs/settings.txt
expect "scale-siblings.runs holds runs of EPOCHS=2 MIN_STEPS=0 BATCH=8 RANK_EVAL=500 EXTRA='', not EPOCHS=2 MIN_STEPS=0 BATCH=16" -- \
  env GG_BIN="$TMP/dry-only" BATCH=16 MODES=model NAME=siblings bench/scale/run.sh 8
expect "convergence-siblings.runs holds runs of EPOCHS=12 EXTRA='', not EPOCHS=3 EXTRA=''" -- \
  env EPOCHS=3 VARIANTS=both "${conv[@]}" 2
[ "$(ls bench/results/scale-siblings.runs bench/results/convergence-siblings.runs | grep -cv '^$\|:$\|settings.txt')" = 0 ] ||
  { echo "FAIL: a refused invocation wrote into the runs folder"; fail=1; }
rm -rf bench/results/scale-siblings.runs bench/results/convergence-siblings.runs
rm -f bench/results/apoptosis-*-siblings.txt  # the failed run's log (written when runs begin)
[ "$(ls bench/results | wc -l)" = "$before" ] || { echo "FAIL: files made under bench/results before refusing"; fail=1; }

# bench/comm/ratios.sh: its count of invocations unchecked ('abc' ran none, then a traceback,
# after the build). bench/loader: IMAGES ignored once the images' folder existed, the report
# naming IMAGES JPEGs of a folder holding another number (now a folder per count, its count
# checked before the build).
expect "ratios.sh: INVOCATIONS = 'abc' must be a whole number in [1, 1000]" -- bench/comm/ratios.sh abc
expect "ratios.sh: INVOCATIONS = '99999999999999999999' must be" -- bench/comm/ratios.sh 99999999999999999999
mkdir -p "$TMP/b/bench-loader-images-3/n1" && touch "$TMP/b/bench-loader-images-3/n1/img_0.JPEG"
out=$(timeout 60 env BUILD="$TMP/b" bench/loader/run.sh 5 3 2>&1 >/dev/null); rc=$?
if [ "$rc" != 1 ] || [ "$out" != "bench/loader: $TMP/b/bench-loader-images-3 holds 1 JPEGs, not 3 (a make cut short?): remove it" ]; then
  echo "FAIL: bench/loader with 1 of 3 images made: exit $rc: $(tail -3 <<<"$out")"; fail=1
else
  echo "ok: $out"
fi
[ ! -e "$TMP/b/CMakeCache.txt" ] || { echo "FAIL: bench/loader configured a build before refusing"; fail=1; }

# bench/cluster/real.sh: a second invocation into the same --out at another rate pooled its
# rounds with the first's under each method's median (points.csv has no rate column).
mkdir "$TMP/real"
printf 'method,round,median_step_s,file\nddp,1,0.5,ddp-r1.json\n' >"$TMP/real/points.csv"
echo "bench/cluster/real.sh --nodes 4 --rate 1000 --steps 20 --rounds 1" >"$TMP/real/commands.txt"
expect "holds points of TORCH=debian --nodes 4 --rate 1000 --steps 20: their medians would pool with TORCH=2.15 --nodes 4 --rate 200 --steps 20" -- \
  env GG_BIN=/bin/true bench/cluster/real.sh --out "$TMP/real" --rate 200

# configs/launch.sh (every job script): a bad ranks-per-node count from Slurm's environment or
# the #SBATCH line was blamed on --ranks-per-node, which the user had not given.
for s in cpu-cluster h100 p100-ib knl-aries; do
  expect "$s.sbatch: SLURM_NTASKS_PER_NODE '99999999999999999999' must be a whole number in [1, 4096]" -- \
    env GG_BIN=/bin/true SLURM_JOB_NODELIST='n[1-2]' SLURM_JOB_NUM_NODES=2 \
    SLURM_NTASKS_PER_NODE=99999999999999999999 bash "configs/$s.sbatch" --dry-run
done
sed 's/^#SBATCH --ntasks-per-node=.*/#SBATCH --ntasks-per-node=0/' configs/h100.sbatch >"$TMP/zero.sbatch"
expect "zero.sbatch's #SBATCH --ntasks-per-node '0' must be a whole number in [1, 4096]" -- \
  env GG_BIN=/bin/true GG_ROOT="$ROOT" bash "$TMP/zero.sbatch" --nodes localhost --dry-run

[ "$fail" = 0 ] && echo "PASS: the scripts refuse what they would run under another name, in one line, before any work"
exit $fail
