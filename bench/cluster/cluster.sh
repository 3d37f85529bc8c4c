#!/usr/bin/env bash
# The cluster in a box: N network namespaces ("nodes") on a bridge, links shaped with tc,
# MPI jobs launched across them with MPICH's hydra. See usage() below and docs/cluster.md,
# "The testbed: bench/cluster/cluster.sh".
set -euo pipefail

PROG=cluster.sh
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SUBNET=10.213.0        # node i is $SUBNET.(i+1)/24, inside the cluster's namespaces only
MAX_NODES=250

usage() {
    cat <<EOF
usage: $PROG [--prefix P] COMMAND [options]

A cluster in a box: N network namespaces ("nodes") joined by veth pairs to a bridge,
each node's link shaped with tc, and MPI jobs launched across them with MPICH's hydra.

commands:
  up --nodes N [--rate R] [--delay D] [--jitter J] [--loss L]
        Make namespaces P-n0 .. P-n(N-1) and a switch namespace P-sw holding the bridge
        P-br. Node i has one interface, P-eth, address $SUBNET.(i+1)/24 and no default
        route; its peer in the switch is port P-p<i>. Nothing is created in the root
        namespace: no interface, route or firewall rule. If any namespace of the prefix
        exists already, up fails (exit 1) and changes nothing: use shape, or down first.
  shape [--rate R] [--delay D] [--jitter J] [--loss L]
        Reshape every link of the running cluster; options not given keep their values.
  status
        Print the nodes, their addresses and the qdiscs of each link (exit 1: not up).
  down
        Remove everything of the prefix: every namespace named P-sw, P-n<i> or P-probe<pid>
        (with them go the bridge, veths, addresses and qdiscs), after ending the processes
        still running inside them (TERM, then KILL after 2 s), and the temporary folders
        \${TMPDIR:-/tmp}/P-run.* that a killed run left. Works after a crash; nothing to
        remove is not an error.
  run [-n NP] [-ppn K] [mpiexec options] -- CMD [ARGS...]
        Run CMD as NP ranks (default: K per node on every node), K per node (default 1)
        on nodes P-n0, P-n1, ... in order: ranks 0..K-1 on P-n0, K..2K-1 on P-n1, and so on.
        mpiexec (hydra) runs inside P-n0; it starts a proxy in every other node through a
        launcher that enters the node's namespace and a UTS namespace whose host name is
        the node's name (P-n<i>), so every node is its own host to MPI: ranks of a node
        talk over MPICH's shared memory, ranks of different nodes over UCX's tcp transport
        on P-eth (UCX_TLS=tcp,self unless UCX_TLS is set, UCX_NET_DEVICES=P-eth). The
        environment reaches the ranks (hydra passes it on; -genv NAME VALUE sets one more).
        The cluster sets
        -launcher, -launcher-exec, -iface, -hosts and -ppn itself; do not pass them.
        The exit status is mpiexec's.
        The ranks preload a small helper (ucx_exit_progress.c, built with cc into a
        temporary folder) that keeps UCX progressing while a rank waits in MPI_Finalize:
        without it MPICH 4.0 over UCX's tcp transport hangs at exit in about one job in
        four. GG_CLUSTER_NO_EXIT_HELPER=1 turns it off.

link options (each node's link: both directions are limited to R; delay, jitter and loss
apply once per packet, on the node's outgoing side, so D is the one-way latency added
between two nodes and 2*D the round trip):
  --rate R      tc rate: 1gbit (default), 200mbit, 10gbit, ... or none
  --delay D     added one-way latency: 100us (default), 2ms, 0, ...   (needs netem)
  --jitter J    +- J around D: 50us (default), 0, ...                 (needs netem)
  --loss L      random loss: 0% (default), 0.1%, ...
  Rate limits use HTB. Delay, jitter and loss use netem where the kernel has it (sch_netem).
  Without netem, loss is emulated (a BPF random filter sends that share of packets to a
  class that drops them), a non-zero --delay or --jitter given explicitly is an error
  (exit 1), and the defaults give a warning and the link gets no added latency. While
  loss > 0, GSO is off on the node's interface, so that a loss is one packet, not a 64 KiB
  GSO packet.
  With jitter, netem reorders packets whose delays cross.

options:
  --prefix P    names of everything made (default: \$GG_CLUSTER_PREFIX, else ggc): lower
                case letter then up to 9 letters or digits, so that clusters with
                different prefixes do not collide
  -h, --help    this text

Needs root (CAP_SYS_ADMIN for the network, mount and UTS namespaces, CAP_NET_ADMIN for the
links): without, every command but --help exits 77 with one line saying why. Usage errors
exit 2, other errors 1.

examples:
  $PROG up --nodes 4 --rate 1gbit --delay 100us
  $PROG run -n 8 -ppn 2 -- ./build/gossip/gossipgrad train --config configs/laptop.ini
  OMP_NUM_THREADS=1 $PROG run -ppn 4 -- gossipgrad train ...
  $PROG shape --rate 200mbit --loss 0.1%
  $PROG status
  $PROG down
EOF
}

die() { echo "$PROG: $*" >&2; exit 1; }
usage_error() { echo "$PROG: $* (see $PROG --help)" >&2; exit 2; }
skip() { echo "$PROG: $*" >&2; exit 77; }

# ---- names ----------------------------------------------------------------------------

PREFIX=${GG_CLUSTER_PREFIX:-ggc}
check_prefix() {
    [[ $PREFIX =~ ^[a-z][a-z0-9]{0,9}$ ]] ||
        usage_error "prefix '$PREFIX' must be a lower case letter then up to 9 letters or digits"
}
sw_ns() { echo "$PREFIX-sw"; }
node_ns() { echo "$PREFIX-n$1"; }
BR() { echo "$PREFIX-br"; }
IFACE() { echo "$PREFIX-eth"; }
port() { echo "$PREFIX-p$1"; }

# Every namespace of this prefix that exists: the switch, the nodes, and a privilege probe
# left by a killed run of this script.
our_namespaces() {
    ip netns list 2>/dev/null | awk '{print $1}' |
        grep -E "^${PREFIX}-(sw|n(0|[1-9][0-9]*)|probe[0-9]+)\$" | sort -V || true
}
node_count() {
    local n=0
    while [[ -e /run/netns/$(node_ns "$n") ]]; do n=$((n + 1)); done
    echo "$n"
}

# ---- privileges -------------------------------------------------------------------------

check_privileges() {
    command -v ip >/dev/null || skip "needs iproute2 ('ip' not found)"
    command -v tc >/dev/null || skip "needs iproute2 ('tc' not found)"
    local probe="$PREFIX-probe$$" err
    if ! err=$(ip netns add "$probe" 2>&1); then
        skip "needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN): cannot create a network namespace (${err//$'\n'/ })"
    fi
    if ! err=$(ip -n "$probe" link set lo up 2>&1); then
        ip netns del "$probe" 2>/dev/null || true
        skip "needs CAP_NET_ADMIN: cannot configure an interface in a new network namespace (${err//$'\n'/ })"
    fi
    if ! err=$(ip netns exec "$probe" unshare --uts true 2>&1); then
        ip netns del "$probe" 2>/dev/null || true
        skip "needs CAP_SYS_ADMIN: cannot enter a network namespace and a new UTS namespace (${err//$'\n'/ })"
    fi
    # while here: does the kernel have netem?
    HAVE_NETEM=no
    tc -n "$probe" qdisc add dev lo root netem delay 0ms 2>/dev/null && HAVE_NETEM=yes
    ip netns del "$probe"
}

# ---- link shaping -----------------------------------------------------------------------

RATE_RE='^([0-9]+(\.[0-9]+)?(bit|kbit|mbit|gbit|tbit|bps|kbps|mbps|gbps|tbps)|none)$'
TIME_RE='^(0|[0-9]+(\.[0-9]+)?(us|ms|s))$'
LOSS_RE='^([0-9]+(\.[0-9]+)?)%$'

RATE=1gbit DELAY=100us JITTER=50us LOSS=0%
RATE_SET=0 DELAY_SET=0 JITTER_SET=0 LOSS_SET=0

check_link_options() {
    [[ $RATE =~ $RATE_RE ]] || usage_error "--rate '$RATE' is not a tc rate (e.g. 1gbit, 200mbit) or none"
    [[ $DELAY =~ $TIME_RE ]] || usage_error "--delay '$DELAY' is not a time (e.g. 100us, 2ms, 0)"
    [[ $JITTER =~ $TIME_RE ]] || usage_error "--jitter '$JITTER' is not a time (e.g. 50us, 0)"
    [[ $LOSS =~ $LOSS_RE ]] || usage_error "--loss '$LOSS' is not a percentage (e.g. 0%, 0.1%)"
    awk -v l="${LOSS%\%}" 'BEGIN { exit !(l <= 100) }' || usage_error "--loss '$LOSS' is over 100%"
    if [[ $RATE != none ]]; then
        awk -v r="$(rate_bits "$RATE")" 'BEGIN { exit !(r >= 8000) }' ||
            usage_error "--rate '$RATE' is below 8kbit"
    fi
}
is_zero_time() { [[ $1 =~ ^0+(\.0+)?(us|ms|s)?$ ]]; }
is_zero_loss() { [[ ${1%\%} =~ ^0+(\.0+)?$ ]]; }

# bits per second of a tc rate
rate_bits() {
    local r=$1 num unit
    num=$(sed -E 's/^([0-9.]+).*/\1/' <<<"$r")
    unit=${r#"$num"}
    awk -v n="$num" -v u="$unit" 'BEGIN {
        m["bit"]=1; m["kbit"]=1e3; m["mbit"]=1e6; m["gbit"]=1e9; m["tbit"]=1e12;
        m["bps"]=8; m["kbps"]=8e3; m["mbps"]=8e6; m["gbps"]=8e9; m["tbps"]=8e12;
        printf "%.0f\n", n * m[u] }'
}

HAVE_NETEM= # set by check_privileges
have_netem() { [[ $HAVE_NETEM == yes ]]; }

# What each link gets, decided once for up/shape; NETEM_ARGS empty: no netem.
NETEM_ARGS=() EMULATED_LOSS=0 DELAY_APPLIED=
plan_shaping() {
    NETEM_ARGS=() EMULATED_LOSS=0
    # jitter without delay: only when asked for
    if is_zero_time "$DELAY" && ((!JITTER_SET)); then JITTER=0; fi
    local want_delay=1
    if is_zero_time "$DELAY" && is_zero_time "$JITTER"; then want_delay=0; fi
    if have_netem; then
        if ((want_delay)) || ! is_zero_loss "$LOSS"; then
            NETEM_ARGS=(limit 100000)
            ((want_delay)) && NETEM_ARGS+=(delay "$DELAY")
            ((want_delay)) && ! is_zero_time "$JITTER" && NETEM_ARGS+=("$JITTER")
            is_zero_loss "$LOSS" || NETEM_ARGS+=(loss "$LOSS")
        fi
        DELAY_APPLIED="$DELAY jitter $JITTER"
    else
        if ((want_delay)); then
            if { ((DELAY_SET)) && ! is_zero_time "$DELAY"; } || { ((JITTER_SET)) && ! is_zero_time "$JITTER"; }; then
                die "this kernel has no netem qdisc (sch_netem), so --delay/--jitter cannot be emulated; give --delay 0 --jitter 0"
            fi
            echo "$PROG: warning: this kernel has no netem qdisc (sch_netem): links get no added delay or jitter (rate and loss apply)" >&2
        fi
        DELAY_APPLIED="none (no netem in this kernel)"
        is_zero_loss "$LOSS" || EMULATED_LOSS=1
    fi
}

# classic BPF for cls_bpf: match (return -1: the filter's class) with probability LOSS
loss_bytecode() {
    local thr
    thr=$(awk -v l="${LOSS%\%}" 'BEGIN { t = l / 100 * 4294967296; if (t > 4294967295) t = 4294967295; printf "%.0f", t }')
    # ld rand; jge #thr -> ret 0 (no match) ; ret -1 (match)
    echo "4,32 0 0 4294963256,53 1 0 $thr,6 0 0 4294967295,6 0 0 0"
}

# htb_rate NS DEV: root HTB 1: with class 1:1 (everything) limited to RATE
htb_root() {
    local ns=$1 dev=$2 rate=$3
    tc -n "$ns" qdisc add dev "$dev" root handle 1: htb default 1
    tc -n "$ns" class add dev "$dev" parent 1: classid 1:1 htb rate "$rate" ceil "$rate" \
        quantum 60000 burst "$(htb_burst "$rate")" cburst "$(htb_burst "$rate")"
}
# 2 ms worth of bytes at the rate, at least 128 KiB (two GSO packets)
htb_burst() {
    awk -v b="$(rate_bits "$1")" 'BEGIN { x = b / 8 * 0.002; if (x < 131072) x = 131072; printf "%.0f\n", x }'
}

shape_node() {
    local i=$1 ns dev port_dev rate
    ns=$(node_ns "$i") dev=$(IFACE) port_dev=$(port "$i")
    rate=$RATE
    [[ $rate == none ]] && rate=100gbit
    tc -n "$ns" qdisc del dev "$dev" root 2>/dev/null || true
    tc -n "$(sw_ns)" qdisc del dev "$port_dev" root 2>/dev/null || true
    # node -> switch: rate, then netem (delay, jitter, loss) or the emulated loss
    local need_htb=0
    [[ $RATE != none ]] && need_htb=1
    ((EMULATED_LOSS)) && need_htb=1
    if ((need_htb)); then
        htb_root "$ns" "$dev" "$rate"
        if ((${#NETEM_ARGS[@]})); then
            tc -n "$ns" qdisc add dev "$dev" parent 1:1 handle 10: netem "${NETEM_ARGS[@]}"
        fi
        if ((EMULATED_LOSS)); then
            tc -n "$ns" class add dev "$dev" parent 1: classid 1:2 htb rate "$rate" quantum 60000
            tc -n "$ns" qdisc add dev "$dev" parent 1:2 handle 2: pfifo limit 0
            tc -n "$ns" filter add dev "$dev" parent 1: protocol all prio 1 handle 1 \
                bpf bytecode "$(loss_bytecode)" classid 1:2
        fi
    elif ((${#NETEM_ARGS[@]})); then
        tc -n "$ns" qdisc add dev "$dev" root handle 10: netem "${NETEM_ARGS[@]}"
    fi
    # GSO off while there is loss, so that a lost packet is one MTU, not a 64 KiB GSO packet
    # (neither netem nor the emulation splits those)
    if ! is_zero_loss "$LOSS"; then
        ip -n "$ns" link set dev "$dev" gso_max_segs 1
    else
        ip -n "$ns" link set dev "$dev" gso_max_segs 65535
    fi
    # switch -> node: rate
    if [[ $RATE != none ]]; then
        htb_root "$(sw_ns)" "$port_dev" "$rate"
    fi
}

shape_all() { # after plan_shaping
    local n=$1 i
    for ((i = 0; i < n; i++)); do shape_node "$i"; done
    # the settings live on the bridge itself (its alias), so status and shape can read them
    ip -n "$(sw_ns)" link set dev "$(BR)" alias \
        "gg-cluster rate=$RATE delay=$DELAY jitter=$JITTER loss=$LOSS"
}

# RATE/DELAY/JITTER/LOSS from the bridge's alias, for options not given
load_settings() {
    local alias kv
    alias=$(ip -n "$(sw_ns)" -o link show dev "$(BR)" 2>/dev/null | sed -n 's/.*alias gg-cluster //p')
    for kv in $alias; do
        case $kv in
        rate=*) ((RATE_SET)) || RATE=${kv#rate=} ;;
        delay=*) ((DELAY_SET)) || DELAY=${kv#delay=} ;;
        jitter=*) ((JITTER_SET)) || JITTER=${kv#jitter=} ;;
        loss=*) ((LOSS_SET)) || LOSS=${kv#loss=} ;;
        esac
    done
}

parse_link_options() {
    while (($#)); do
        case $1 in
        --rate | --delay | --jitter | --loss)
            (($# >= 2)) || usage_error "$1 needs a value"
            case $1 in
            --rate) RATE=$2 RATE_SET=1 ;;
            --delay) DELAY=$2 DELAY_SET=1 ;;
            --jitter) JITTER=$2 JITTER_SET=1 ;;
            --loss) LOSS=$2 LOSS_SET=1 ;;
            esac
            shift 2
            ;;
        --rate=* | --delay=* | --jitter=* | --loss=*)
            local k=${1%%=*} v=${1#*=}
            set -- "$k" "$v" "${@:2}"
            ;;
        *) usage_error "unknown option '$1' for $CMD" ;;
        esac
    done
}

# ---- commands ---------------------------------------------------------------------------

remove_all() {
    local ns pids left=0
    for ns in $(our_namespaces); do
        pids=$(ip netns pids "$ns" 2>/dev/null || true)
        if [[ -n $pids ]]; then
            # shellcheck disable=SC2086
            kill -TERM $pids 2>/dev/null || true
        fi
    done
    local t
    for ((t = 0; t < 20; t++)); do
        left=0
        for ns in $(our_namespaces); do
            [[ -n $(ip netns pids "$ns" 2>/dev/null || true) ]] && left=1
        done
        ((left)) || break
        sleep 0.1
    done
    if ((left)); then
        for ns in $(our_namespaces); do
            pids=$(ip netns pids "$ns" 2>/dev/null || true)
            # shellcheck disable=SC2086
            if [[ -n $pids ]]; then kill -KILL $pids 2>/dev/null || true; fi
        done
    fi
    local removed=0 failed=0 dir
    for ns in $(our_namespaces); do
        if ip netns del "$ns" 2>/dev/null; then removed=$((removed + 1)); else failed=$((failed + 1)); fi
    done
    for dir in "${TMPDIR:-/tmp}/$PREFIX"-run.*; do
        if [[ -d $dir && -f $dir/launch ]]; then rm -rf "$dir"; fi
    done
    REMOVED=$removed
    ((failed == 0))
}

cmd_up() {
    local nodes=
    local args=()
    while (($#)); do
        case $1 in
        --nodes)
            (($# >= 2)) || usage_error "--nodes needs a value"
            nodes=$2
            shift 2
            ;;
        --nodes=*) nodes=${1#--nodes=} && shift ;;
        *) args+=("$1") && shift ;;
        esac
    done
    parse_link_options "${args[@]}"
    [[ -n $nodes ]] || usage_error "up needs --nodes N"
    if ! [[ $nodes =~ ^[1-9][0-9]*$ ]] || ((nodes > MAX_NODES)); then
        usage_error "--nodes '$nodes' must be a whole number from 1 to $MAX_NODES"
    fi
    check_link_options
    check_privileges

    local existing
    existing=$(our_namespaces | { grep -v -- -probe || true; } | tr '\n' ' ')
    if [[ -n $existing ]]; then
        die "cluster '$PREFIX' is already up (namespaces: ${existing% }); 'shape' changes its links, 'down' removes it"
    fi
    plan_shaping

    trap 'echo "$PROG: up failed at \"$BASH_COMMAND\"; removing what it made" >&2; remove_all || true; exit 1' EXIT
    local sw br i ns
    sw=$(sw_ns) br=$(BR)
    ip netns add "$sw"
    ip -n "$sw" link set lo up
    ip -n "$sw" link add "$br" type bridge
    # a plain learning switch: no STP delay, no multicast snooping surprises
    ip -n "$sw" link set dev "$br" type bridge stp_state 0 forward_delay 0 mcast_snooping 0
    ip -n "$sw" link set "$br" up
    for ((i = 0; i < nodes; i++)); do
        ns=$(node_ns "$i")
        ip netns add "$ns"
        ip -n "$ns" link set lo up
        ip -n "$sw" link add "$(port "$i")" type veth peer name "$(IFACE)" netns "$ns"
        ip -n "$sw" link set "$(port "$i")" master "$br"
        ip -n "$sw" link set "$(port "$i")" up
        ip -n "$ns" addr add "$SUBNET.$((i + 1))/24" dev "$(IFACE)"
        ip -n "$ns" link set "$(IFACE)" up
    done
    shape_all "$nodes"
    trap - EXIT
    echo "cluster '$PREFIX' up: $nodes nodes ($(node_ns 0)..$(node_ns $((nodes - 1))), $SUBNET.1-$SUBNET.$nodes on $(IFACE)), switch $sw; links: rate $RATE, delay $DELAY_APPLIED, loss $LOSS"
}

require_up() {
    if [[ ! -e /run/netns/$(sw_ns) || ! -e /run/netns/$(node_ns 0) ]]; then
        die "cluster '$PREFIX' is not up (no namespaces $(sw_ns), $(node_ns 0)); start it with '$PROG up --nodes N'"
    fi
}

cmd_shape() {
    parse_link_options "$@"
    check_privileges
    require_up
    load_settings
    check_link_options
    plan_shaping
    local n
    n=$(node_count)
    trap 'echo "$PROG: shape failed at \"$BASH_COMMAND\"" >&2; exit 1' EXIT
    shape_all "$n"
    trap - EXIT
    echo "cluster '$PREFIX': $n links reshaped: rate $RATE, delay $DELAY_APPLIED, loss $LOSS"
}

qdisc_summary() { # NS DEV: one line per qdisc and HTB class
    {
        tc -n "$1" qdisc show dev "$2" | sed -E 's/ refcnt [0-9]+//; s/^/qdisc: /'
        tc -n "$1" class show dev "$2" | sed -E 's/^/class: /'
        tc -n "$1" filter show dev "$2" | { grep -E 'bpf.*handle' || true; } | sed -E 's/ not_in_hw//; s/^/filter: /'
    } | sed 's/^/        /'
}

cmd_status() {
    (($# == 0)) || usage_error "status takes no options"
    check_privileges
    require_up
    load_settings
    local n i ns addr
    n=$(node_count)
    if have_netem; then DELAY_APPLIED="$DELAY jitter $JITTER"; else DELAY_APPLIED="none (no netem in this kernel)"; fi
    echo "cluster '$PREFIX': $n nodes, switch namespace $(sw_ns) with bridge $(BR), subnet $SUBNET.0/24"
    echo "links: rate $RATE, delay $DELAY_APPLIED, loss $LOSS"
    for ((i = 0; i < n; i++)); do
        ns=$(node_ns "$i")
        addr=$(ip -n "$ns" -o -4 addr show dev "$(IFACE)" | awk '{print $4}')
        echo "node $ns: $(IFACE) $addr, switch port $(port "$i"), processes $(ip netns pids "$ns" | wc -l)"
        echo "    out (node -> switch, $(IFACE) in $ns):"
        qdisc_summary "$ns" "$(IFACE)"
        echo "    in (switch -> node, $(port "$i") in $(sw_ns)):"
        qdisc_summary "$(sw_ns)" "$(port "$i")"
    done
    local extra
    extra=$(our_namespaces | grep -vxE "$(sw_ns)|$PREFIX-n([0-9]|[1-9][0-9]+)" || true)
    [[ -z $extra ]] || echo "other namespaces of the prefix: $extra"
}

cmd_down() {
    (($# == 0)) || usage_error "down takes no options"
    check_privileges
    REMOVED=0
    remove_all || die "could not remove every namespace of '$PREFIX': $(our_namespaces | tr '\n' ' ')"
    if ((REMOVED)); then
        echo "cluster '$PREFIX' down: $REMOVED namespaces removed"
    else
        echo "cluster '$PREFIX': nothing to remove"
    fi
}

find_mpiexec() {
    local c
    for c in ${GG_CLUSTER_MPIEXEC:-} mpiexec.hydra mpiexec.mpich mpiexec; do
        # Not `--version | grep -q`: under pipefail grep's early exit fails the pipe (SIGPIPE).
        if command -v "$c" >/dev/null && [[ $("$c" --version 2>/dev/null || true) == *[Hh][Yy][Dd][Rr][Aa]* ]]; then
            command -v "$c"
            return
        fi
    done
    return 1
}

RUN_DIR=
cmd_run() {
    local np='' ppn=1 opts=() cmd=()
    while (($#)); do
        case $1 in
        -h | --help) usage && exit 0 ;;
        --) shift && cmd=("$@") && break ;;
        -n | -np)
            (($# >= 2)) || usage_error "$1 needs a value"
            np=$2
            shift 2
            ;;
        -ppn)
            (($# >= 2)) || usage_error "-ppn needs a value"
            ppn=$2
            shift 2
            ;;
        -hosts | -host | -f | -hostfile | -machinefile | -launcher | -launcher-exec | -iface | \
            -bootstrap | -bootstrap-exec | -rmk)
            usage_error "run sets $1 itself"
            ;;
        *) opts+=("$1") && shift ;;
        esac
    done
    ((${#cmd[@]})) || usage_error "run needs -- CMD [ARGS...]"
    [[ $ppn =~ ^[1-9][0-9]*$ ]] || usage_error "-ppn '$ppn' must be a whole number of at least 1"
    [[ -z $np || $np =~ ^[1-9][0-9]*$ ]] || usage_error "-n '$np' must be a whole number of at least 1"
    check_privileges
    require_up
    local nodes need mpiexec
    nodes=$(node_count)
    [[ -n $np ]] || np=$((nodes * ppn))
    need=$(((np + ppn - 1) / ppn))
    ((need <= nodes)) || die "-n $np -ppn $ppn needs $need nodes; cluster '$PREFIX' has $nodes"
    mpiexec=$(find_mpiexec) || skip "needs MPICH's hydra mpiexec (mpiexec.hydra, mpiexec.mpich or mpiexec; none found)"
    command -v unshare >/dev/null || skip "needs unshare (util-linux)"

    RUN_DIR=$(mktemp -d "${TMPDIR:-/tmp}/$PREFIX-run.XXXXXX")
    trap 'rm -rf "$RUN_DIR"' EXIT
    # hydra calls the launcher like ssh: LAUNCHER [ssh options] HOST COMMAND...
    cat >"$RUN_DIR/launch" <<EOF
#!/bin/sh
# made by $PROG run for cluster '$PREFIX': enter node HOST's namespaces, run COMMAND there
while [ \$# -gt 0 ]; do
    case \$1 in
    -[bcDEeFIiJLlmOopQRSWw]) shift 2 ;;
    -*) shift ;;
    *) break ;;
    esac
done
host=\$1
shift
case \$host in
$PREFIX-n[0-9]*) ;;
*) echo "$PROG launcher: '\$host' is not a node of cluster '$PREFIX'" >&2; exit 255 ;;
esac
exec ip netns exec "\$host" unshare --uts sh -c 'hostname "\$1" && shift && exec sh -c "\$*"' sh "\$host" "\$@"
EOF
    chmod +x "$RUN_DIR/launch"

    local preload=${LD_PRELOAD:-}
    if [[ ${GG_CLUSTER_NO_EXIT_HELPER:-0} != 1 ]]; then
        local cc=${CC:-cc}
        command -v "$cc" >/dev/null || die "needs a C compiler ('$cc') for the MPI_Finalize helper; or set GG_CLUSTER_NO_EXIT_HELPER=1"
        "$cc" -O2 -shared -fPIC -o "$RUN_DIR/ucx_exit_progress.so" "$HERE/ucx_exit_progress.c" -ldl -lpthread ||
            die "could not build $HERE/ucx_exit_progress.c (needs UCX's headers: libucx-dev); or set GG_CLUSTER_NO_EXIT_HELPER=1"
        preload="$RUN_DIR/ucx_exit_progress.so${preload:+:$preload}"
    fi

    local hosts=() i
    for ((i = 0; i < need; i++)); do hosts+=("$(node_ns "$i")"); done
    local genv=(-genv UCX_TLS "${UCX_TLS:-tcp,self}" -genv UCX_NET_DEVICES "$(IFACE)")
    [[ -n $preload ]] && genv+=(-genv LD_PRELOAD "$preload")
    local rc=0
    # shellcheck disable=SC2016 # $1 and $@ are the inner shell's
    ip netns exec "$(node_ns 0)" unshare --uts sh -c 'hostname "$1" && shift && exec "$@"' sh "$(node_ns 0)" \
        "$mpiexec" -launcher ssh -launcher-exec "$RUN_DIR/launch" -iface "$(IFACE)" \
        -hosts "$(
            IFS=,
            echo "${hosts[*]}"
        )" -n "$np" -ppn "$ppn" "${genv[@]}" "${opts[@]}" "${cmd[@]}" || rc=$?
    return "$rc"
}

# ---- main -------------------------------------------------------------------------------

CMD=
ARGS=()
while (($#)); do
    case $1 in
    -h | --help | help)
        usage
        exit 0
        ;;
    --prefix)
        (($# >= 2)) || usage_error "--prefix needs a value"
        PREFIX=$2
        shift 2
        ;;
    --prefix=*) PREFIX=${1#--prefix=} && shift ;;
    *)
        if [[ -z $CMD ]]; then
            CMD=$1
            shift
            # run: everything after the command belongs to it (mpiexec options, CMD)
            if [[ $CMD == run ]]; then
                while (($#)) && [[ $1 == --prefix || $1 == --prefix=* ]]; do
                    if [[ $1 == --prefix ]]; then
                        (($# >= 2)) || usage_error "--prefix needs a value"
                        PREFIX=$2
                        shift 2
                    else
                        PREFIX=${1#--prefix=}
                        shift
                    fi
                done
                ARGS=("$@")
                break
            fi
        else
            ARGS+=("$1")
            shift
        fi
        ;;
    esac
done
[[ -n $CMD ]] || usage_error "no command (up, shape, status, down, run)"
check_prefix
case $CMD in
up) cmd_up "${ARGS[@]}" ;;
shape) cmd_shape "${ARGS[@]}" ;;
status) cmd_status "${ARGS[@]}" ;;
down) cmd_down "${ARGS[@]}" ;;
run) cmd_run "${ARGS[@]}" ;;
*) usage_error "unknown command '$CMD' (up, shape, status, down, run)" ;;
esac
