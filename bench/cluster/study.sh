#!/usr/bin/env bash
# When does gossip win? Step time and efficiency of gossipgrad (grad, model, both), MPI_Allreduce
# and PyTorch DDP over gloo, on the cluster in a box (cluster.sh: one network namespace per node,
# links shaped with tc), with compute emulated from a measured GPU profile ([emulate]).
#
# usage: bench/cluster/study.sh [--plan quick|session|check|ten|late|lag|tcp|fill|hier|lean|authors|scale|compressed|choco|lowrank|nooverlap|pipeline|full] [--out DIR] [--profile p100|h100]
#
# Every point runs p ranks on p nodes (one rank per node) at a link rate R with ResNet-50's real
# gradient (102 MB, gossipgrad's buckets of gossip.bucket_kb) and the profile's forward/backward/
# update times (configs/p100-ib.ini [simulate]). This VM cannot move p x R of TCP traffic for
# R = 1 Gbit/s and p = 16, so every point runs in dilated time: links at R / K and compute x K,
# with K chosen so that the cluster's total traffic, p x R / K, stays under GG_STUDY_BUDGET_MBIT
# (default 1600). Every time reported is divided by K again: the figures are those of the real
# R. That the link, not the CPU, is the bottleneck is checked by the rate-halving points (the
# communication time must about double).
#
# Methods: grad, model, both (gossipgrad's modes over p2p across nodes, what auto picks;
# MODE@rma over rma; MODE+bf16 with gossip.wire and model_wire = bf16 (MODE+int8, MODE+int4:
# those quantized wires, with gossip.error_feedback; MODE+int4+choco: the int4 wire carrying the
# difference to CHOCO's public copies, gossip.choco, no rotation; +sr: the quantized wire rounds
# stochastically, gossip.rounding; +ring: the ring schedule;
# +lowrankN: low-rank gossip of rank N, gossip.low_rank, fp32 factors, the hypercube unrotated);
# MODE+stale with
# gossip.staleness = 1: a rank never waits for this step's partner; MODE+lag with guard.lag = 1:
# the agreements after each step run behind the next one; MODE+every4 with gossip.model_every 4
# (the weights every 4th step); MODE+nooverlap with gossip.overlap_model false (the weights mixed
# after the update, before the next forward: what keeps accuracy at large p, bench/scale);
# MODE+pipeline: the same numbers with gossip.pipeline_weights (each bucket of the weights
# waited for in the next forward, just before the first layer that reads it);
# MODE+ppn2: two ranks per node, p / 2
# nodes, transport auto (shm inside a node); grad+hier: the same nodes with gossip.hierarchy =
# node, an exact average inside each node and gossip between nodes, one rail per local rank),
# allreduce (gossipgrad's
# MPI_Allreduce mode), ddp (ddp_emulate.py; ddp+fp16 with DDP's fp16_compress_hook; ddp+powersgd
# with torch's powerSGD_hook, rank 4, one bucket: its factorisations run on this VM's CPU, which a
# GPU node does in milliseconds, so its step is the testbed's, not a cluster's: see the results).
# Conditions: quiet; jitter (every rank's compute x a lognormal factor per step, median 1, p99
# GG_STUDY_JITTER, default 2.5); straggler (rank 1 always 1.5x slower).
# GG_STUDY_EXTRA: more train options for every gossipgrad point (e.g. --log.timeline FILE).
# TORCH: the DDP points' PyTorch, 2.15 (the default: bench/torch_env.sh's pinned environment) or
# debian (Debian's python3-torch 1.13, the rows before 2026-11-29); part of the folder's settings.
# GG_STUDY_POINTS: the points to run instead of the plan's, separated by ';', each "p rate_mbit
# condition method [K]" as the plans write them (e.g. "16 1000 quiet model+int4+choco+ring").
# GG_STUDY_SLOW_START_AFTER_IDLE=0 sets the nodes' net.ipv4.tcp_slow_start_after_idle to 0 (Linux
# default 1: a TCP connection idle for a retransmission timeout restarts from a small congestion
# window; a collective that talks to a different peer each round meets it on every connection);
# use another --out for such a study.
# Output: DIR/points.csv (one line per point), DIR/*.jsonl|json (the runs), DIR/latency.csv, and
# bench/cluster/summarize.py makes the table, the plot and the simulator's predictions.
# A method word it does not know, words that together would run something else (two wires,
# allreduce with a wire, +ring or @TRANSPORT, +lowrankN with +ring), a point's number out of range
# or a p the method's ranks per node do not divide, or a point the run would refuse (each gossip
# point's dry run at its p), ends it in one line, exit 2, before anything is made; a point that
# fails is logged, the others run, and the study ends with exit 1 naming the failed points.
# GG_STUDY_TRANSPORT (rma or auto) is written into the methods it changes (grad -> grad@rma).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
BIN=${GG_BIN:-$ROOT/build/gossip/gossipgrad}
COMM_BIN=${GG_COMM_BIN:-$(dirname "$(dirname "$BIN")")/bench/gg_bench_comm}
CLUSTER=$HERE/cluster.sh
PREFIX=${GG_STUDY_PREFIX:-ggs$$}
BUDGET=${GG_STUDY_BUDGET_MBIT:-1600}
JITTER=${GG_STUDY_JITTER:-2.5}
. "$ROOT/scripts/checks.sh"
gg_int GG_STUDY_BUDGET_MBIT "$BUDGET" 1
gg_decimal GG_STUDY_JITTER "$JITTER" 1
[[ -z ${GG_STUDY_SLOW_START_AFTER_IDLE:-} ]] ||
    gg_int GG_STUDY_SLOW_START_AFTER_IDLE "$GG_STUDY_SLOW_START_AFTER_IDLE" 0 1
PLAN=session
OUT=$ROOT/bench/results/cluster-study
PROFILE=p100

die() { echo "study.sh: $*" >&2 && exit 1; }
while (($#)); do
    case $1 in
    --plan) PLAN=${2:?--plan needs quick, session, check, ten, late, lag, tcp, fill, hier, lean, authors, scale, compressed, choco, lowrank, nooverlap, pipeline or full} && shift 2 ;;
    --out) OUT=${2:?--out needs a folder} && shift 2 ;;
    --profile) PROFILE=${2:?--profile needs p100 or h100} && shift 2 ;;
    -h | --help) sed -n '2,/^set -euo/{/^#/s/^# \{0,1\}//p}' "${BASH_SOURCE[0]}" && exit 0 ;;
    *) echo "study.sh: unknown argument '$1' (see --help)" >&2 && exit 2 ;;
    esac
done
[[ -x $BIN ]] || die "no gossipgrad at $BIN: build it first (cmake --build build)"
[[ -x $COMM_BIN ]] || die "no gg_bench_comm at $COMM_BIN: build it first (cmake --build build)"
gg_torch_check

# The profile: ms per step of one GPU, batch per rank (configs/*.ini, [simulate]).
case $PROFILE in
p100) FWD=95 BWD=190 UPD=5 BATCH=64 ;;
h100) FWD=35 BWD=68 UPD=1 BATCH=256 ;;
*) echo "study.sh: --profile $PROFILE: use p100 or h100" >&2 && exit 2 ;;
esac
BUCKET_KB=4096 # configs/p100-ib.ini and h100.ini
# Steps per point: the first WARMUP are not measured (GG_STUDY_WARMUP, default 2; a schedule
# that cycles through d partners meets a new connection in each of its first d steps:
# dissemination at p = 16 has d = 4), then STEPS measured ones (GG_STUDY_STEPS, default 5).
WARMUP=${GG_STUDY_WARMUP:-2} STEPS=${GG_STUDY_STEPS:-5}
gg_int GG_STUDY_WARMUP "$WARMUP" 0
gg_int GG_STUDY_STEPS "$STEPS" 1
# Across nodes p2p (MPI_Isend/Irecv) is what auto picks; GG_STUDY_TRANSPORT=rma compares.
TRANSPORT=${GG_STUDY_TRANSPORT:-p2p}
read -r -a STUDY_EXTRA <<<"${GG_STUDY_EXTRA:-}"

# The points: "p rate_mbit condition method", run in this order (grouped by p and rate, so that
# the cluster is made once per p).
points() {
    local quick_p=4
    if [[ -n ${GG_STUDY_POINTS:-} ]]; then
        tr ';' '\n' <<<"$GG_STUDY_POINTS" | sed 's/^ *//; s/ *$//; /^$/d'
        return
    fi
    case $PLAN in
    quick)
        for m in grad allreduce ddp; do echo "$quick_p 1000 quiet $m"; done
        for m in grad allreduce; do echo "$quick_p 500 quiet $m"; done
        ;;
    session)
        # p = 16 first (the question the study asks), then the checks and the smaller jobs.
        for m in grad both model allreduce ddp grad+bf16 both+bf16; do echo "16 1000 quiet $m"; done
        for m in grad allreduce ddp grad+bf16; do echo "16 1000 straggler $m"; done
        for m in grad allreduce ddp grad+bf16; do echo "16 1000 jitter $m"; done
        echo "16 1000 quiet grad@rma"
        # The link sets the pace, not this CPU: at the same dilation, half the link rate must
        # about double the communication time (a fifth field forces the dilation K).
        echo "16 500 quiet grad 10"
        for m in grad both allreduce ddp grad@rma; do echo "4 1000 quiet $m"; done
        for m in grad allreduce; do echo "4 500 quiet $m"; done
        echo "16 1000 quiet ddp+fp16"
        for m in grad both model allreduce ddp; do echo "8 1000 quiet $m"; done
        echo "4 1000 quiet model"
        # Does MPI_Allreduce at p = 16 follow the link, or this VM's CPU?
        echo "16 500 quiet allreduce 10"
        ;;
    check)
        # Only the link check and DDP's fp16 compression at p = 16 (also part of session).
        echo "16 500 quiet grad 10"
        echo "16 1000 quiet ddp+fp16"
        ;;
    ten)
        # The 10 Gbit/s link (dilation 25 at p = 4, 100 at p = 16: a point takes 3-5 minutes).
        for m in grad both allreduce ddp; do echo "4 10000 quiet $m"; done
        for m in grad allreduce ddp; do echo "16 10000 quiet $m"; done
        # Where compute, not the link, sets the pace: does jitter cost gossip less?
        for m in grad allreduce; do echo "16 10000 jitter $m"; done
        ;;
    late)
        # Late partners: does staleness 1 (never wait for this step's partner) keep jitter from
        # spreading along the partners' chain? And DDP under the same jitter.
        for m in grad+stale ddp; do echo "16 10000 jitter $m"; done
        echo "16 10000 quiet grad+stale"
        for m in grad+stale; do echo "16 1000 jitter $m"; done
        echo "16 1000 quiet grad+stale"
        ;;
    tcp)
        # With GG_STUDY_SLOW_START_AFTER_IDLE=0 (and another --out): the TCP setting's share.
        for m in allreduce grad ddp; do echo "16 1000 quiet $m"; done
        ;;
    lag)
        # Without the per-step agreements' wait for the slowest rank (guard.lag 1): the
        # partners' chain alone (staleness 0), and with late partners (staleness 1).
        for m in grad+lag grad+stale+lag; do echo "16 10000 jitter $m"; done
        echo "16 10000 quiet grad+stale+lag"
        echo "16 10000 straggler grad+stale+lag"
        echo "16 1000 jitter grad+stale+lag"
        ;;
    fill)
        # The grid's gaps after session, ten and late, most telling first. First: late partners
        # on the slow link without the agreements that queue behind the exchange in flight.
        echo "16 1000 quiet grad+stale+lag"
        for m in grad allreduce ddp; do echo "16 10000 straggler $m"; done
        for m in model both; do echo "16 10000 quiet $m"; done
        for c in jitter straggler; do
            for m in grad allreduce ddp; do echo "8 1000 $c $m"; done
        done
        for m in grad allreduce ddp; do echo "8 10000 quiet $m"; done
        for c in jitter straggler; do
            for m in grad allreduce ddp; do echo "4 1000 $c $m"; done
        done
        ;;
    lean)
        # The lean modes that keep the models together (bench/convergence: grad alone does
        # not), quiet, under jitter and with a straggler on the slow link.
        for c in quiet jitter straggler; do echo "16 1000 $c model+bf16"; done
        echo "16 1000 quiet both+every4+bf16"
        ;;
    authors)
        # GossipGraD as its authors ran it (weights and momentum mixed after the update:
        # gossip.mode gossipgrad), beside model + bf16 and DDP in the same session.
        for m in gossipgrad gossipgrad+bf16 model+bf16 ddp; do echo "16 1000 quiet $m"; done
        ;;
    scale)
        # What the accuracy study at large p points to (bench/scale): the weights mixed after
        # the update, not behind the next step (+nooverlap), beside the overlapped model + bf16
        # and DDP in the same session.
        for m in model+bf16+nooverlap model+bf16 ddp gossipgrad+bf16+nooverlap; do
            echo "16 1000 quiet $m"
        done
        ;;
    compressed)
        # The quantized wires (issue: compressed gossip at the link's limit): model with int8 and
        # int4 weights (error feedback) beside model + bf16, DDP and DDP's fp16 hook, on 1 Gbit/s
        # and 200 Mbit/s, in the same session.
        for r in 1000 200; do
            for m in model+int8 model+int4 model+bf16 ddp ddp+fp16; do echo "16 $r quiet $m"; done
        done
        for m in model+int8 model+int4; do echo "16 1000 jitter $m"; done
        # Without the agreements after each step in the step's path (guard.lag 1): what is left
        # beyond compute when the link is no longer the bottleneck.
        for m in model+int4+lag model+int8+lag model+bf16+lag; do echo "16 1000 quiet $m"; done
        ;;
    choco)
        # CHOCO's public copies on the int4 / int8 wire (the difference to a copy both partners
        # hold), beside model + int4 with error feedback, DDP and DDP's fp16 hook in the same
        # session. At p = 16 on the ring schedule: a pair of ResNet-50 copies per partner, and 16
        # ranks with dissemination's 4 partners each (8 copies, 0.8 GB a rank) do not fit this
        # VM's 24 GiB; a step's traffic is the same (one bucket set out, one in). Whether the
        # ring's steady partner flatters the step is measured: int4 with error feedback on both
        # schedules at p = 16, choco on both at p = 8.
        for m in model+int4+choco+ring+lag model+int8+choco+ring+lag model+int4+ring+lag \
            model+int4+lag ddp+fp16 ddp ddp+powersgd; do
            echo "16 1000 quiet $m"
        done
        for m in model+int4+choco+lag model+int4+choco+ring+lag; do echo "8 1000 quiet $m"; done
        for m in model+int4+choco+ring+lag ddp+fp16 ddp; do echo "16 200 quiet $m"; done
        for m in model+int4+choco+ring+lag model+int4+lag; do echo "16 1000 jitter $m"; done
        ;;
    lowrank)
        # Low-rank gossip (PowerGossip, fp32 factors) at ranks 1 and 4, overlapped and not,
        # beside choco's best (int4, ring), DDP and DDP's fp16 hook in the same session.
        for m in model+lowrank1+lag model+lowrank4+lag model+lowrank4+nooverlap+lag \
            model+int4+choco+ring+lag ddp+fp16 ddp; do
            echo "16 1000 quiet $m"
        done
        for m in model+lowrank4+lag ddp; do echo "16 200 quiet $m"; done
        ;;
    nooverlap)
        # The weights mixed before the next forward (what keeps top-1 at p = 128, bench/scale):
        # int4 + choco on the ring, beside its overlapped step in the same session.
        for m in model+int4+choco+ring+nooverlap+lag model+int4+choco+ring+lag; do
            echo "16 1000 quiet $m"
        done
        ;;
    pipeline)
        # The weights mixed before the next forward, waited for bucket by bucket inside it
        # (gossip.pipeline_weights), beside the same exchange waited for before the forward
        # (+nooverlap: the same numbers), the overlapped one, DDP and DDP's fp16 hook.
        for m in model+int4+choco+ring+pipeline+lag model+int4+choco+ring+nooverlap+lag \
            model+int4+choco+ring+lag ddp+fp16 ddp; do
            echo "16 1000 quiet $m"
        done
        ;;
    hier)
        # Two ranks per node (8 nodes of 2 at p = 16): every rank gossiping with its own partner
        # (two buckets' worth on each node's link) against the node-then-network hierarchy
        # (one), and MPI_Allreduce on the same nodes.
        for m in grad+hier grad+ppn2 allreduce+ppn2; do echo "16 1000 quiet $m"; done
        ;;
    full)
        for p in 4 8 16; do
            for r in 10000 1000; do
                for c in quiet jitter straggler; do
                    for m in grad model both allreduce ddp; do echo "$p $r $c $m"; done
                done
            done
            for m in grad allreduce ddp; do echo "$p 500 quiet $m"; done
        done
        ;;
    *) echo "study.sh: --plan $PLAN: use quick, session, check, ten, late, lag, tcp, fill, hier, lean, authors, scale, compressed, choco, lowrank, nooverlap, pipeline or full" >&2 && exit 2 ;;
    esac
}

# The points, checked before anything is made.
planned=$(points) || exit 2
mapfile -t PLANNED <<<"$planned"
# GG_STUDY_TRANSPORT: written into the method of every gossip point that names no transport and
# runs one rank per node (grad -> grad@rma), so that points.csv and the file names say what ran
# (they said grad); allreduce, +ppn2 and +hier take none from it, as before.
if [[ $TRANSPORT != p2p ]]; then
    [[ $TRANSPORT =~ ^(rma|auto)$ ]] ||
        { echo "study.sh: GG_STUDY_TRANSPORT = '$TRANSPORT': use p2p, rma or auto (shm reaches no other node)" >&2 && exit 2; }
    for i in "${!PLANNED[@]}"; do
        read -r p rate cond method k <<<"${PLANNED[$i]}"
        [[ $method =~ ^(ddp|allreduce) || $method == *[@]* || $method =~ \+(ppn2|hier) ]] && continue
        PLANNED[i]="$p $rate $cond ${method%%+*}@$TRANSPORT${method#"${method%%+*}"}${k:+ $k}"
    done
fi
[[ -n $planned ]] || { echo "study.sh: no points to run (GG_STUDY_POINTS is empty?)" >&2 && exit 2; }
for point in "${PLANNED[@]}"; do
    [[ $point =~ ^[1-9][0-9]*\ [1-9][0-9]*\ (quiet|jitter|straggler)\ [a-z0-9@+]+(\ [1-9][0-9]*)?$ ]] ||
        { echo "study.sh: point '$point': write 'p rate_mbit quiet|jitter|straggler method [K]' (see --help)" >&2 && exit 2; }
done
# The methods' words: a word the runs below do not know ran as something else under its name
# (a wire misspelt ran fp32), so each is checked: ddp, ddp+fp16, ddp+powersgd, or
# MODE[@TRANSPORT] and tags.
method_ok() {
    local m=$1 tag
    [[ $m == ddp || $m == ddp+fp16 || $m == ddp+powersgd ]] && return 0
    [[ ${m%%+*} =~ ^(grad|both|model|gossipgrad|allreduce)(@(p2p|rma|shm|auto))?$ ]] || return 1
    [[ $m == *+* ]] || return 0
    # +nooverlap asks for what grad and allreduce do anyway (their run would only warn).
    [[ ${m%%[@+]*} =~ ^(grad|allreduce)$ && $m == *+nooverlap* ]] && return 1
    local IFS=+
    for tag in ${m#*+}; do
        [[ $tag =~ ^(every4|bf16|int8|int4|choco|sr|ring|lowrank[1-9][0-9]*|nooverlap|pipeline|stale|lag|ppn2|hier)$ ]] ||
            return 1
    done
}
for point in "${PLANNED[@]}"; do
    read -r _ _ _ method _ <<<"$point"
    method_ok "$method" || {
        echo "study.sh: point '$point': unknown method '$method' (ddp, ddp+fp16, ddp+powersgd, or MODE[@TRANSPORT][+every4][+bf16|+int8|+int4][+choco][+sr][+ring][+lowrankN][+nooverlap|+pipeline][+stale][+lag][+ppn2|+hier])" >&2
        exit 2
    }
done
# Known words that together would run something other than the name says: the runs below match
# tags by substring, so a second wire won over the first (model+int4+int8 ran int8), +pipeline
# over +nooverlap, +hier over +ppn2; allreduce ran fp32 under +bf16 and ignored +ring and
# @TRANSPORT (its run only warns); +lowrankN with +ring or +choco was blamed on an option given
# twice; @shm reaches no partner on another node. Echoes why, or nothing.
method_clash() {
    local m=$1 tags tag seen=' ' wires=0
    [[ $m == ddp* ]] && return 0
    tags=${m#"${m%%+*}"}
    for tag in ${tags//+/ }; do
        [[ $seen != *" $tag "* ]] || { echo "+$tag twice" && return 0; }
        seen+="$tag "
        [[ $tag =~ ^(bf16|int8|int4)$ ]] && wires=$((wires + 1))
    done
    ((wires <= 1)) || { echo "two wires: a run sends one (+bf16, +int8 or +int4)" && return 0; }
    [[ $seen == *" nooverlap "* && $seen == *" pipeline "* ]] &&
        echo "+nooverlap and +pipeline are two ways to wait for the weights: choose one" && return 0
    [[ $seen == *" ppn2 "* && $seen == *" hier "* ]] &&
        echo "+hier runs two ranks per node already: drop +ppn2" && return 0
    [[ $m == *@shm* ]] &&
        echo "@shm reaches no partner on another node, and every point spans nodes: use @auto" && return 0
    if [[ ${m%%[@+]*} == allreduce && ($m == *@* || $seen =~ \ (bf16|int8|int4|ring)\ ) ]]; then
        echo "allreduce moves its bytes with MPI_Allreduce in fp32: a wire, +ring or @TRANSPORT would change nothing"
        return 0
    fi
    if [[ $seen =~ \ lowrank[0-9]+\  && $seen =~ \ (bf16|int8|int4|choco|sr|ring)\  ]]; then
        echo "+lowrankN sends fp32 factors on the hypercube's pairs: it takes no wire, +choco, +sr or +ring"
    fi
}
for point in "${PLANNED[@]}"; do
    read -r _ _ _ method _ <<<"$point"
    why=$(method_clash "$method")
    [[ -z $why ]] || { echo "study.sh: point '$point': method '$method': $why" >&2 && exit 2; }
done
# Ranks per node of a method: 2 for +ppn2 and +hier, else 1.
ppn_of() { [[ $1 == *+ppn2* || $1 == *+hier* ]] && echo 2 || echo 1; }

# The points' numbers, in range before any arithmetic (20 digits wrapped), p a whole number of
# nodes of the method's ranks per node (3 ranks of +ppn2 ran on 1 node), and a link of at least
# 1 Mbit/s once dilated (a forced K above the rate, or more nodes than GG_STUDY_BUDGET_MBIT,
# shaped the links to 0 Mbit/s after the cluster was made).
for point in "${PLANNED[@]}"; do
    read -r p rate _ method forced_k <<<"$point"
    gg_int "point '$point': p" "$p" 2 500
    gg_int "point '$point': rate_mbit" "$rate" 1 1000000
    [[ -z $forced_k ]] || gg_int "point '$point': K" "$forced_k" 1 "$rate"
    ppn=$(ppn_of "$method")
    nodes=$((p / ppn))
    ((p % ppn == 0 && nodes <= 250)) || {
        echo "study.sh: point '$point': $method runs $ppn rank(s) per node: p must be a multiple of $ppn, on at most 250 nodes" >&2
        exit 2
    }
    k=${forced_k:-$(((nodes * rate + BUDGET - 1) / BUDGET))}
    ((rate / k >= 1)) || {
        echo "study.sh: point '$point': dilation K = $k leaves the link $rate / $k < 1 Mbit/s (raise GG_STUDY_BUDGET_MBIT or K's rate)" >&2
        exit 2
    }
done

# The train options of a gossip point (p method fwd bwd upd jitter slow), one per line.
gossip_args() {
    local p=$1 method=$2 fwd=$3 bwd=$4 upd=$5 jitter=$6 slow=$7
    local ppn
    ppn=$(ppn_of "$method")
    # MODE[@TRANSPORT][+every4][+bf16|+int8|+int4][+choco][+sr][+lowrankN][+nooverlap|+pipeline][+stale][+lag][+ppn2|+hier]
    local spec=${method%%+*} wire=fp32 stale=0 lag=0 hier=none every=1
    local overlap=true feedback=false pipeline=false
    local mode=${spec%@*} transport=$TRANSPORT
    ((ppn > 1)) && transport=auto
    [[ $spec == *@* ]] && transport=${spec#*@}
    [[ $method == *+hier* ]] && hier=node
    [[ $method == *+every4* ]] && every=4
    [[ $method == *+bf16* ]] && wire=bf16
    [[ $method == *+int8* ]] && wire=int8 && feedback=true
    [[ $method == *+int4* ]] && wire=int4 && feedback=true
    [[ $method == *+nooverlap* ]] && overlap=false
    [[ $method == *+pipeline* ]] && overlap=false && pipeline=true
    # +choco: the weights' difference to CHOCO's public copies (no error feedback; choco
    # needs the same partners again, so the schedule does not rotate).
    local choco=()
    [[ $method == *+choco* ]] && feedback=false && choco=(--gossip.choco true)
    # +ring: the ring schedule (one partner each way, the same every step).
    [[ $method == *+ring* ]] && choco+=(--gossip.schedule ring)
    [[ $method == *+sr* ]] && choco+=(--gossip.rounding stochastic)
    [[ $method == *+choco* || $method == *+ring* ]] && choco+=(--gossip.rotate false)
    # +lowrankN: low-rank gossip of rank N (PowerGossip: the hypercube's pairs, no rotation).
    [[ $method =~ \+lowrank([0-9]+) ]] &&
        choco+=(--gossip.low_rank "${BASH_REMATCH[1]}" --gossip.schedule hypercube --gossip.rotate false)
    # Each wire only where the mode sends that buffer (a wire for a buffer the mode never
    # sends is refused): the gradients' in grad and both, the weights' in the others.
    local grad_wire=fp32 model_wire=fp32
    [[ $mode == grad || $mode == both ]] && grad_wire=$wire
    [[ $mode == model || $mode == both || $mode == gossipgrad ]] && model_wire=$wire
    [[ $method == *+stale* ]] && stale=1
    [[ $method == *+lag* ]] && lag=1
    printf '%s\n' --config "$BASE" --model.name resnet50 --train.batch "$BATCH" \
        --train.threads 1 --data.augment false --train.max_steps $((WARMUP + STEPS)) \
        --gossip.mode "$mode" --gossip.transport "$transport" \
        --gossip.wire "$grad_wire" --gossip.model_wire "$model_wire" --gossip.bucket_kb $BUCKET_KB \
        --gossip.error_feedback $feedback "${choco[@]}" \
        --gossip.consensus_every 0 --gossip.staleness $stale --guard.lag $lag \
        --gossip.hierarchy $hier --gossip.model_every $every --gossip.overlap_model $overlap \
        --gossip.pipeline_weights $pipeline \
        --gossip.timeout_s 1200 --emulate.forward_ms "$fwd" \
        --emulate.backward_ms "$bwd" --emulate.update_ms "$upd" \
        --emulate.jitter_p99 "$jitter" --emulate.slow "$slow" --log.progress false "${STUDY_EXTRA[@]}"
}

# Every gossip point's verdict from the dry run at its rank count before anything runs (a
# schedule that needs another p, a tag its mode does not honour): one line, exit 2.
check_points() {
    local point p method err args base=$ROOT/configs/laptop.ini
    [[ -f $OUT/base.ini ]] && base=$OUT/base.ini
    for point in "${PLANNED[@]}"; do
        read -r p _ _ method _ <<<"$point"
        [[ $method == ddp* ]] && continue
        mapfile -t args < <(BASE=$base gossip_args "$p" "$method" 1 1 1 1 '')
        if ! err=$(env PMI_SIZE="$p" GG_RANKS_PER_NODE="$(ppn_of "$method")" "$BIN" train "${args[@]}" \
            --dry-run 2>&1 >/dev/null); then
            echo "study.sh: point '$point': $(gg_refusal "$err")" >&2
            exit 2
        fi
    done
}
check_points
# One folder, one setting: a point already in points.csv is not run again, and its row carries no
# profile, jitter, TCP setting or extra options (a study with --profile h100 into a p100 study's
# folder reused the p100 points under the h100 study; GG_STUDY_STEPS skipped points measured over
# other steps). The first invocation writes DIR/settings.txt.
SETTINGS="profile $PROFILE, torch ${TORCH:-2.15}, jitter p99 $JITTER, warmup $WARMUP, steps $STEPS, tcp_slow_start_after_idle ${GG_STUDY_SLOW_START_AFTER_IDLE:-1}, extra '${STUDY_EXTRA[*]}'"
if [[ -f $OUT/settings.txt && $(cat "$OUT/settings.txt") != "$SETTINGS" ]]; then
    echo "study.sh: $OUT holds points of $(cat "$OUT/settings.txt"), not $SETTINGS: use another --out" >&2
    exit 2
fi
mkdir -p "$OUT"
[[ -f $OUT/settings.txt ]] || echo "$SETTINGS" >"$OUT/settings.txt"
CSV=$OUT/points.csv
[[ -f $CSV ]] || echo "p,rate_mbit,condition,method,dilation,link_mbit,warmup,steps,file" >"$CSV"
# The DDP points' PyTorch (TORCH: 2.15 by default, debian for 1.13), installed (on first use) before any point runs.
TORCH_PY=""
for point in "${PLANNED[@]}"; do
    read -r _ _ _ method _ <<<"$point"
    if [[ $method == ddp* ]]; then
        TORCH_PY=$(gg_torch_python)
        break
    fi
done
# The base config, copied once: the points of one study share it even if the checkout changes.
BASE=$OUT/base.ini
[[ -f $BASE ]] || cp "$ROOT/configs/laptop.ini" "$BASE"
cleanup() { "$CLUSTER" --prefix "$PREFIX" down >/dev/null 2>&1 || true; }
trap cleanup EXIT
trap 'exit 130' INT TERM

# Dilation: the smallest whole K with p x rate / K <= budget.
dilation() { echo $((($1 * $2 + BUDGET - 1) / BUDGET)); }

times_k() { awk -v a="$1" -v k="$2" 'BEGIN { printf "%g", a * k }'; }

run_point() { # p rate condition method K
    local p=$1 rate=$2 cond=$3 method=$4
    local ppn
    ppn=$(ppn_of "$method")
    local k=$5 # the dilation; the caller has shaped the links to rate / k
    local link=$((rate / k))
    local fwd bwd upd
    fwd=$(times_k "$FWD" "$k") bwd=$(times_k "$BWD" "$k") upd=$(times_k "$UPD" "$k")
    # Files are named without the method's + and @ (tools choke on them): grad+stale+lag ->
    # grad_stale_lag, grad@rma -> grad_at_rma; points.csv keeps the method as written.
    local plain=${method//+/_}
    local name="p${p}-r${rate}-${cond}-${plain//@/_at_}"
    local jitter=1 slow=''
    [[ $cond == jitter ]] && jitter=$JITTER
    [[ $cond == straggler ]] && slow=1:1.5
    local t0=$SECONDS
    if [[ $method == ddp* ]]; then
        local file=$OUT/$name.json
        local extra=()
        [[ $method == ddp+fp16 ]] && extra+=(--compress fp16)
        # PowerSGD (rank 4, error feedback, warm start) runs over gloo only with one bucket: with
        # several in flight gloo's TCP pair aborts (op.preamble.length <= op.nbytes) or hangs,
        # under Debian's torch 1.13 and PyPI's 2.15 alike (ddp_emulate.py refuses it).
        [[ $method == ddp+powersgd ]] && extra+=(--compress powersgd --bucket-cap-mb 1000)
        [[ -n $slow ]] && extra+=(--slow "$slow")
        "$CLUSTER" --prefix "$PREFIX" run -n "$p" -ppn 1 -- "$TORCH_PY" "$HERE/ddp_emulate.py" \
            --model resnet50 --batch "$BATCH" --forward-ms "$fwd" --backward-ms "$bwd" \
            --update-ms "$upd" --jitter "$jitter" "${extra[@]}" --steps "$STEPS" \
            --warmup "$WARMUP" --master-addr 10.213.0.1 --ifname "$PREFIX-eth" --timeout-s 600 \
            --json-out "$file" >"$OUT/$name.log" 2>&1 || {
            echo "study.sh: $name failed (see $OUT/$name.log)" >&2
            FAILED+=("$name")
            return 0
        }
    else
        local file=$OUT/$name.jsonl args
        mapfile -t args < <(gossip_args "$p" "$method" "$fwd" "$bwd" "$upd" "$jitter" "$slow")
        "$CLUSTER" --prefix "$PREFIX" run -n "$p" -ppn "$ppn" -- "$BIN" train "${args[@]}" \
            --log.metrics "$file" --log.overwrite true >"$OUT/$name.log" 2>&1 || {
            echo "study.sh: $name failed (see $OUT/$name.log)" >&2
            FAILED+=("$name")
            return 0
        }
    fi
    echo "$p,$rate,$cond,$method,$k,$link,$WARMUP,$STEPS,$(basename "$file")" >>"$CSV"
    printf 'study.sh: %-28s K=%-3s link %5s Mbit/s  %4ss\n' "$name" "$k" "$link" $((SECONDS - t0))
}

# The testbed's own latency at p nodes and link R / K: the median time of a 4 KiB exchange with
# one partner (bench/comm p2p, slowest of the p ranks), measured once per p and K into
# DIR/latency.csv. At p >= 4 it is set by this VM's scheduler (p ranks share 2 cores), not by the
# link: summarize.py gives it to the simulator as the latency of every message.
LAT=$OUT/latency.csv
[[ -f $LAT ]] || echo "p,dilation,link_mbit,exchange_4k_s" >"$LAT"
measure_latency() { # p K link_mbit
    grep -q "^$1,$2," "$LAT" && return 0
    local row
    row=$("$CLUSTER" --prefix "$PREFIX" run -n "$1" -ppn 1 -- "$COMM_BIN" --max-bytes 4096 \
        --runs 9 --methods p2p 2>/dev/null | grep "^$1,p2p,4096," || true)
    [[ -n $row ]] || {
        echo "study.sh: the latency at p = $1 could not be measured" >&2
        FAILED+=("latency-p$1")
        return 0
    }
    echo "$1,$2,$3,$(cut -d, -f4 <<<"$row")" >>"$LAT"
}

# A point already in points.csv (an interrupted study run again) is not run again.
done_already() { grep -q "^$1,$2,$3,$4," "$CSV"; }

FAILED=()  # points that failed: the others run, the study ends non-zero naming them
echo "study.sh: ${#PLANNED[@]} points, plan $PLAN, profile $PROFILE, budget $BUDGET Mbit/s, out $OUT"
nodes=0
for point in "${PLANNED[@]}"; do
    read -r p rate cond method forced_k <<<"$point"
    done_already "$p" "$rate" "$cond" "$method" && continue
    need=$((p / $(ppn_of "$method")))
    if ((need != nodes)); then
        cleanup
        "$CLUSTER" --prefix "$PREFIX" up --nodes "$need" --rate none --delay 0 --jitter 0 >/dev/null
        if [[ -n ${GG_STUDY_SLOW_START_AFTER_IDLE:-} ]]; then
            for ((n = 0; n < need; n++)); do
                ip netns exec "$PREFIX-n$n" sysctl -qw \
                    net.ipv4.tcp_slow_start_after_idle="$GG_STUDY_SLOW_START_AFTER_IDLE"
            done
        fi
        nodes=$need
    fi
    k=$forced_k
    # The budget is the links' traffic: one link per node.
    [[ -n $k ]] || k=$(dilation "$nodes" "$rate")
    "$CLUSTER" --prefix "$PREFIX" shape --rate "$((rate / k))mbit" >/dev/null
    ((need == p)) && measure_latency "$p" "$k" "$((rate / k))"
    run_point "$p" "$rate" "$cond" "$method" "$k"
done
if ((${#FAILED[@]})); then
    echo "study.sh: ${#FAILED[@]} point(s) failed: ${FAILED[*]} (their logs in $OUT); the others are in $CSV" >&2
    exit 1
fi
echo "study.sh: done; summarize with: /usr/bin/python3 $HERE/summarize.py $OUT"
