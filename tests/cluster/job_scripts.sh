#!/usr/bin/env bash
# The job scripts next to the configs (configs/*.sbatch), run on the cluster in a box:
#   1. Without a cluster: each script and configs/launch.sh are bash -n (and shellcheck) clean,
#      each script hands over to configs/launch.sh with its own path (its lines below the "same
#      in every" line, the same in all four, find the checkout and source launch.sh; no launch
#      logic of its own), its #SBATCH --ntasks-per-node is its config's network.ranks_per_node;
#      a missing node list, a bad --ranks-per-node and a missing binary are one-line errors
#      (exit 2, 2, 1).
#   2. On 2 namespace nodes (bench/cluster/cluster.sh), each script with --dry-run, as plain
#      bash with --nodes, launched through GG_LAUNCH: `gossipgrad layout` reports 2 nodes named
#      as the cluster's, with the ranks per node the script intends, node-local ranks 0..K-1 on
#      each (from MPI: SLURM_LOCALID, LOCAL_RANK and OMPI_COMM_WORLD_LOCAL_RANK are set to 5),
#      and no mismatch with its config.
#   3. The same as under sbatch (SLURM_JOB_NODELIST set) through a stand-in srun that checks
#      --mpi=pmi2 and launches on the cluster; and the plain bash mpirun -hosts line through a
#      stand-in mpirun that checks the hosts.
#   4. Scaled down: p100-ib with --ranks-per-node 2 reports 2 per node and warns that the config
#      intends 4; with `-- --network.ranks_per_node 2` passed through, it matches again.
# Exit 77 (skip) when namespaces cannot be made. The cluster is torn down also on failure.
#
# usage: job_scripts.sh path/to/gossipgrad [source root]
set -euo pipefail

BIN=$(realpath "$1")
ROOT=$(realpath "${2:-$(dirname "${BASH_SOURCE[0]}")/../..}")
CLUSTER=$ROOT/bench/cluster/cluster.sh
P=ggj$$ # at most 10 characters
SCRIPTS=(p100-ib h100 cpu-cluster knl-aries)
START=$SECONDS
TMP=$(mktemp -d "${TMPDIR:-/tmp}/job_scripts.XXXXXX")

fail() {
    echo "FAIL: $*" >&2
    exit 1
}
log() { echo "[$((SECONDS - START))s] $*"; }
cleanup() {
    local rc=$?
    "$CLUSTER" --prefix "$P" down >/dev/null 2>&1 || true
    rm -rf "$TMP"
    exit "$rc"
}
trap cleanup EXIT
trap "exit 143" TERM INT HUP

# Outside Slurm, whatever runs this test.
unset SLURM_JOB_ID SLURM_JOB_NODELIST SLURM_JOB_NUM_NODES SLURM_NNODES SLURM_NTASKS_PER_NODE \
    SLURM_CPUS_PER_TASK SLURM_SUBMIT_DIR GG_LAUNCH GG_ROOT
export GG_BIN=$BIN

intended() { sed -n 's/^#SBATCH --ntasks-per-node=\([0-9]*\)$/\1/p' "$ROOT/configs/$1.sbatch"; }

# ---- 1. without a cluster ----
L=$ROOT/configs/launch.sh
[[ -f $L ]] || fail "$L is missing"
bash -n "$L" || fail "$L: bash -n"
if command -v shellcheck >/dev/null; then shellcheck "$L" || fail "$L: shellcheck"; fi
body() { sed -n '/^# ---- the same in every configs\/\*.sbatch/,$p' "$ROOT/configs/$1.sbatch"; }
# shellcheck disable=SC2016 # the line as written in the scripts
handover='. "$ROOT/configs/launch.sh" "${BASH_SOURCE[0]}" "$@"'
for s in "${SCRIPTS[@]}"; do
    f=$ROOT/configs/$s.sbatch
    [[ -x $f ]] || fail "$f is missing or not executable"
    bash -n "$f" || fail "$f: bash -n"
    if command -v shellcheck >/dev/null; then shellcheck -x "$f" || fail "$f: shellcheck"; fi
    [[ -n $(body "$s") ]] || fail "$f has no '# ---- the same in every configs/*.sbatch' line"
    [[ $(body "$s") == "$(body p100-ib)" ]] || fail "$f: its lines below the 'same in every' line differ from p100-ib.sbatch's"
    [[ $(tail -n 1 "$f") == "$handover" ]] || fail "$f does not end handing over to configs/launch.sh: $handover"
    [[ $(grep -v '^ *#' "$f" | grep -cE '(^|[^_])(exec|srun|mpirun|launch=|GG_LAUNCH|GG_BIN)' || true) == 0 ]] ||
        fail "$f has launch logic of its own; it belongs in configs/launch.sh"
    grep -qx "CONFIG=configs/$s.ini" "$f" || fail "$f does not run configs/$s.ini"
    k=$(intended "$s")
    want=$(sed -n 's/^ranks_per_node *= *\([0-9]*\)$/\1/p' "$ROOT/configs/$s.ini")
    [[ -n $k && $k == "$want" ]] || fail "$f: #SBATCH --ntasks-per-node=$k, configs/$s.ini network.ranks_per_node = $want"
done
log "ok: 4 scripts clean, each hands over to configs/launch.sh, ranks per node as their configs"

expect_error() { # RC WORDS -- CMD...: exit RC with one line holding WORDS
    local rc=$1 words=$2 got=0
    shift 3
    "$@" >"$TMP/out" 2>"$TMP/err" || got=$?
    [[ $got == "$rc" ]] || fail "$* exited $got, expected $rc: $(cat "$TMP/err")"
    [[ $(wc -l <"$TMP/err") == 1 && ! -s $TMP/out ]] || fail "$*: expected one line, got: $(cat "$TMP/out" "$TMP/err")"
    grep -q -- "$words" "$TMP/err" || fail "$*: expected '$words' in: $(cat "$TMP/err")"
}
S=$ROOT/configs/h100.sbatch
expect_error 2 "no node list" -- "$S" --dry-run
expect_error 2 "--ranks-per-node 'x'" -- "$S" --nodes a,b --ranks-per-node x --dry-run
expect_error 2 "not a comma-separated list" -- "$S" --nodes "a b" --dry-run
expect_error 1 "no gossipgrad binary at /nonexistent" -- env GG_BIN=/nonexistent "$S" --nodes a --dry-run
expect_error 1 "launcher 'nolauncher' not found" -- env GG_LAUNCH="nolauncher -n {np}" "$S" --nodes a --dry-run
log "ok: one-line errors"

# ---- 2. on 2 namespace nodes ----
rc=0
"$CLUSTER" --prefix "$P" down >/dev/null || rc=$?
[[ $rc == 77 ]] && exit 77
[[ $rc == 0 ]] || fail "cluster.sh down with nothing up exited $rc"
"$CLUSTER" --prefix "$P" up --nodes 2 --rate none >/dev/null 2>&1 || fail "cluster.sh up --nodes 2 failed"
log "cluster $P up"

# check_layout SCRIPT K OUT: 2 nodes P-n0, P-n1 with K ranks each, global ranks in blocks, local
# ranks 0..K-1 on each node.
check_layout() {
    local s=$1 k=$2 out=$3 i r locals
    grep -qx "layout: 2 nodes, $((2 * k)) ranks, $k rank$( ((k == 1)) || echo s) per node" "$out" ||
        fail "$s: expected 2 nodes of $k ranks: $(cat "$out")"
    for i in 0 1; do
        locals=''
        for ((r = 0; r < k; r++)); do locals+=" $((i * k + r))/$r"; done
        grep -qx "node $i $P-n$i: $k rank$( ((k == 1)) || echo s) (global/local):$locals; cpus per rank [0-9]*\(; gpus [0-9]*\)\?" "$out" ||
            fail "$s: expected node $i $P-n$i with global/local$locals: $(cat "$out")"
    done
}

# run_dry SCRIPT K OUT [ARGS...]: the script with --dry-run and ARGS, bogus local ranks in the
# environment; exit 0 within 120 s.
run_dry() {
    local s=$1 k=$2 out=$3 rc=0
    shift 3
    SLURM_LOCALID=5 LOCAL_RANK=5 OMPI_COMM_WORLD_LOCAL_RANK=5 timeout -k 5 120 \
        "$ROOT/configs/$s.sbatch" --dry-run "$@" >"$out" 2>&1 || rc=$?
    [[ $rc == 0 ]] || fail "$s.sbatch --dry-run $* exited $rc: $(cat "$out")"
    grep -q "^$s.sbatch: $((2 * k)) ranks, $k per node on 2 node(s): .* $BIN layout --config $ROOT/configs/$s.ini" "$out" ||
        fail "$s.sbatch: no launch line running layout with its config: $(cat "$out")"
}

no_mismatch() { # SCRIPT OUT
    ! grep -q "ranks per node, but" "$2" || fail "$1: layout reports a mismatch with its config: $(cat "$2")"
    ! grep -q "warning: node .* holds ranks on hosts\|both call themselves" "$2" || fail "$1: $(cat "$2")"
}

export GG_LAUNCH="$CLUSTER --prefix $P run -n {np} -ppn {ppn} --"
for s in "${SCRIPTS[@]}"; do
    k=$(intended "$s")
    run_dry "$s" "$k" "$TMP/$s.out" --nodes "$P-n0,$P-n1"
    check_layout "$s" "$k" "$TMP/$s.out"
    no_mismatch "$s" "$TMP/$s.out"
    log "ok: $s.sbatch --nodes $P-n0,$P-n1 (GG_LAUNCH): 2 nodes x $k ranks, local ranks from MPI"
done
unset GG_LAUNCH

# ---- 3. as under sbatch (a stand-in srun), and mpirun -hosts (a stand-in mpirun) ----
mkdir -p "$TMP/bin"
cat >"$TMP/bin/srun" <<EOF
#!/usr/bin/env bash
# stand-in srun: checks the options the job scripts pass, launches on cluster $P
echo "srun \$*" >>"$TMP/srun.args"
np='' ppn='' mpi=''
while ((\$#)); do
    case \$1 in
    --mpi=*) mpi=\${1#--mpi=} ;;
    --ntasks=*) np=\${1#--ntasks=} ;;
    --ntasks-per-node=*) ppn=\${1#--ntasks-per-node=} ;;
    --nodes=2 | --cpus-per-task=* | --gpus-per-node=* | --cpu-bind=*) ;;
    -*) echo "stand-in srun: unexpected option \$1" >&2 && exit 1 ;;
    *) break ;;
    esac
    shift
done
[[ \$mpi == pmi2 ]] || { echo "stand-in srun: no --mpi=pmi2" >&2; exit 1; }
exec "$CLUSTER" --prefix "$P" run -n "\$np" -ppn "\$ppn" -- "\$@"
EOF
cat >"$TMP/bin/mpirun" <<EOF
#!/usr/bin/env bash
# stand-in mpirun (hydra's options): checks the hosts, launches on cluster $P
[[ \$1 == --version ]] && echo "HYDRA build details: stand-in" && exit 0
[[ \$1 == -hosts && \$2 == "$P-n0,$P-n1" && \$3 == -n && \$5 == -ppn ]] ||
    { echo "stand-in mpirun: unexpected \$*" >&2; exit 1; }
exec "$CLUSTER" --prefix "$P" run -n "\$4" -ppn "\$6" -- "\${@:7}"
EOF
chmod +x "$TMP/bin/srun" "$TMP/bin/mpirun"
for s in "${SCRIPTS[@]}"; do
    k=$(intended "$s")
    : >"$TMP/srun.args"
    PATH=$TMP/bin:$PATH SLURM_JOB_ID=4242 SLURM_JOB_NODELIST="$P-n[0-1]" SLURM_JOB_NUM_NODES=2 \
        SLURM_NTASKS_PER_NODE=$k SLURM_CPUS_PER_TASK=1 SLURM_SUBMIT_DIR=$ROOT \
        run_dry "$s" "$k" "$TMP/$s.slurm.out"
    grep -q "^srun --mpi=pmi2 --nodes=2 --ntasks=$((2 * k)) --ntasks-per-node=$k --cpus-per-task=1" "$TMP/srun.args" ||
        fail "$s.sbatch under Slurm: srun line $(cat "$TMP/srun.args")"
    check_layout "$s" "$k" "$TMP/$s.slurm.out"
    no_mismatch "$s" "$TMP/$s.slurm.out"
    log "ok: $s.sbatch under Slurm: srun --mpi=pmi2, 2 nodes x $k ranks"
done
PATH=$TMP/bin:$PATH run_dry cpu-cluster 2 "$TMP/mpirun.out" --nodes "$P-n0,$P-n1"
grep -q ": mpirun -hosts $P-n0,$P-n1 -n 4 -ppn 2 " "$TMP/mpirun.out" || fail "mpirun line: $(cat "$TMP/mpirun.out")"
check_layout cpu-cluster 2 "$TMP/mpirun.out"
log "ok: cpu-cluster.sbatch --nodes: mpirun -hosts $P-n0,$P-n1 -n 4 -ppn 2"

# ---- 4. scaled down ----
export GG_LAUNCH="$CLUSTER --prefix $P run -n {np} -ppn {ppn} --"
run_dry p100-ib 2 "$TMP/small.out" --nodes "$P-n0,$P-n1" --ranks-per-node 2
check_layout p100-ib 2 "$TMP/small.out"
grep -q "warning: 2 ranks per node, but $ROOT/configs/p100-ib.ini intends 4 (network.ranks_per_node)" "$TMP/small.out" ||
    fail "p100-ib scaled to 2 per node: no warning that the config intends 4: $(cat "$TMP/small.out")"
run_dry p100-ib 2 "$TMP/small2.out" --nodes "$P-n0,$P-n1" --ranks-per-node 2 -- --network.ranks_per_node 2
grep -q "^config $ROOT/configs/p100-ib.ini: matches (2 ranks per node)" "$TMP/small2.out" ||
    fail "p100-ib with --network.ranks_per_node 2 passed through: $(cat "$TMP/small2.out")"
log "ok: p100-ib.sbatch scaled to 2 ranks per node warns; the override passed through matches"
echo "ok: job scripts ($((SECONDS - START)) s)"
