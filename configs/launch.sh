# shellcheck shell=bash
# The launch logic of every configs/*.sbatch, sourced by each once it has found the checkout:
#
#   . "$ROOT/configs/launch.sh" "${BASH_SOURCE[0]}" "$@"
#
# $1 is the job script itself (under sbatch the copy Slurm runs), read for its --help text (its
# comment block from "# gossipgrad on") and its #SBATCH --ntasks-per-node line; the rest are the
# job script's arguments. The job script sets CONFIG (configs/NAME.ini), SRUN_OPTS (srun options
# of its machine), ROOT (the checkout, holding CONFIG), PROG (NAME.sbatch, the prefix of every
# message) and die (print "PROG: message" on stderr, exit 1). Ends in exec of the launch line.
# With --nodes and MPICH's mpirun (no Slurm, no GG_LAUNCH), one process is first started on every
# node within GG_LAUNCH_PROBE_S seconds (60): a host that does not resolve or answer is named in
# one line (exit 2) instead of a launch that waits for ever.
set -euo pipefail
SCRIPT=$1
shift
usage_error() { echo "$PROG: $* (see $PROG --help)" >&2 && exit 2; }

BIN=${GG_BIN:-$ROOT/build/gossip/gossipgrad}
[[ -x $BIN ]] || die "no gossipgrad binary at $BIN: build it (see README.md) or set GG_BIN"

# The ranks per node this job intends: the #SBATCH --ntasks-per-node line of the job script.
intended_ppn() {
    sed -n 's/^#SBATCH  *--ntasks-per-node[= ]\([0-9][0-9]*\).*/\1/p' "$SCRIPT" | head -n 1
}

hosts='' ppn='' ppn_from=--ranks-per-node dry_run=0 pass=()
while (($#)); do
    case $1 in
    -h | --help) sed -n '/^# gossipgrad on/,/^$/s/^# \{0,1\}//p' "$SCRIPT" && exit 0 ;;
    --nodes | --ranks-per-node)
        (($# >= 2)) || usage_error "$1 needs a value"
        if [[ $1 == --nodes ]]; then hosts=$2; else ppn=$2; fi
        shift 2
        ;;
    --nodes=*) hosts=${1#--nodes=} && shift ;;
    --ranks-per-node=*) ppn=${1#--ranks-per-node=} && shift ;;
    --dry-run) dry_run=1 && shift ;;
    --) shift && pass+=("$@") && break ;;
    *) pass+=("$1") && shift ;;
    esac
done
# A host name starts with a letter or digit: '-localhost' reached mpirun as an option and hung.
[[ -z $hosts || $hosts =~ ^[A-Za-z0-9][A-Za-z0-9._-]*(,[A-Za-z0-9][A-Za-z0-9._-]*)*$ ]] ||
    usage_error "--nodes '$hosts' is not a comma-separated list of host names"

# Nodes: --nodes, else the Slurm allocation. Ranks per node: --ranks-per-node, else Slurm's,
# else the #SBATCH line.
if [[ -n $hosts ]]; then
    mode=hosts
    nnodes=$(tr ',' '\n' <<<"$hosts" | wc -l)
elif [[ -n ${SLURM_JOB_NODELIST:-} ]]; then
    mode=slurm
    hosts=$SLURM_JOB_NODELIST
    nnodes=${SLURM_JOB_NUM_NODES:-${SLURM_NNODES:-}}
    [[ $nnodes =~ ^[1-9][0-9]{0,5}$ ]] || die "SLURM_JOB_NODELIST is set but SLURM_JOB_NUM_NODES = '$nnodes' is not a node count"
    [[ -n $ppn ]] || { ppn=${SLURM_NTASKS_PER_NODE:-} && ppn_from=SLURM_NTASKS_PER_NODE; }
else
    usage_error "no node list: give --nodes host1,host2,... or submit with sbatch (SLURM_JOB_NODELIST is not set)"
fi
[[ -n $ppn ]] || { ppn=$(intended_ppn) && ppn_from="$(basename "$SCRIPT")'s #SBATCH --ntasks-per-node"; }
# Bounded before any arithmetic: 4611686018427387904 per node wrapped to a negative rank count
# (mpirun died by SIGFPE), 9999999999999999999 to "-8446744073709551617 ranks".
if ! [[ $ppn =~ ^[1-9][0-9]{0,5}$ ]] || ((ppn > 4096)); then
    usage_error "$ppn_from '$ppn' must be a whole number in [1, 4096]" # named where it came from
fi
((nnodes <= 65536)) || usage_error "$nnodes nodes: at most 65536"
np=$((nnodes * ppn))
((np <= 1048576)) || usage_error "$nnodes nodes x $ppn ranks per node = $np ranks: at most 1048576"

# The launcher: GG_LAUNCH, else srun in a Slurm allocation, else MPICH's mpirun -hosts.
if [[ -n ${GG_LAUNCH:-} ]]; then
    read -r -a words <<<"$GG_LAUNCH"
    launch=()
    for w in "${words[@]}"; do
        w=${w//\{np\}/$np} && w=${w//\{ppn\}/$ppn} && w=${w//\{nodes\}/$nnodes}
        launch+=("${w//\{hosts\}/$hosts}")
    done
elif [[ $mode == slurm ]]; then
    launch=(srun --mpi=pmi2 --nodes="$nnodes" --ntasks="$np" --ntasks-per-node="$ppn")
    # srun no longer takes --cpus-per-task from sbatch (Slurm 22.05 on): pass it on.
    [[ -z ${SLURM_CPUS_PER_TASK:-} ]] || launch+=(--cpus-per-task="$SLURM_CPUS_PER_TASK")
    launch+=("${SRUN_OPTS[@]}")
else
    launch=(mpirun -hosts "$hosts" -n "$np" -ppn "$ppn")
fi
command -v "${launch[0]}" >/dev/null || die "launcher '${launch[0]}' not found (set GG_LAUNCH to the launcher of this machine)"
# (the version text captured, not piped into grep -q: under pipefail grep's early exit can fail
# the pipe with SIGPIPE)
if [[ ${launch[0]} == mpirun && $(mpirun --version 2>/dev/null || true) != *[Hh][Yy][Dd][Rr][Aa]* ]]; then
    die "this mpirun is not MPICH's hydra (no -hosts, -ppn): set GG_LAUNCH, e.g. 'mpirun --host {hosts} -N {ppn}'"
fi

# --nodes through MPICH's own launcher: one process on every node first, within a bound (it
# waited for ever on a host that does not resolve or answer), GG_LAUNCH_PROBE_S seconds (60).
if [[ $mode == hosts && -z ${GG_LAUNCH:-} ]]; then
    probe_s=${GG_LAUNCH_PROBE_S:-60}
    [[ $probe_s =~ ^[1-9][0-9]{0,4}$ ]] || usage_error "GG_LAUNCH_PROBE_S '$probe_s' must be a whole number of seconds in [1, 99999]"
    if ! probe=$(timeout "$probe_s" mpirun -hosts "$hosts" -n "$nnodes" -ppn 1 true 2>&1); then
        usage_error "mpirun could not start a process on every node of '$hosts' within $probe_s s (a host that does not resolve or answer?): $(tail -n 1 <<<"$probe" | cut -c1-160)"
    fi
fi
if ((dry_run)); then
    cmd=("${launch[@]}" "$BIN" layout --config "$ROOT/$CONFIG" "${pass[@]}")
else
    cmd=("${launch[@]}" "$BIN" train --config "$ROOT/$CONFIG" "${pass[@]}")
fi
echo "$PROG: $np ranks, $ppn per node on $nnodes node(s): ${cmd[*]}" >&2
exec "${cmd[@]}"
