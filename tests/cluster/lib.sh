# shellcheck shell=bash
# Shared by the cluster-in-a-box tests that run gossipgrad's MPI programs across namespace nodes
# (sourced, not run). `cluster_setup CLUSTER_SH LETTER` gives the test a prefix of its own
# (gg<LETTER><pid>, so two tests can run at once), a temporary folder $TMP, and a trap that
# always tears the cluster down and fails the test if anything of the prefix is left; it exits
# 77 (skip) where cluster.sh cannot make namespaces (no root or CAP_NET_ADMIN).
# Then: cluster_up ARGS..., cluster_down, cluster_run LIMIT_S OUT -- ARGS... (cluster.sh run),
# fail MESSAGE, log MESSAGE.

fail() {
    echo "FAIL: $*" >&2
    exit 1
}
log() { echo "[$((SECONDS - CLUSTER_START))s] $*"; }

# Namespaces of this test's prefix (ip netns list can complain about a namespace that another
# run deletes meanwhile).
cluster_ours() {
    { ip netns list 2>/dev/null || true; } | awk '{print $1}' | { grep "^$P-" || true; } |
        sort | tr '\n' ' '
}

cluster_cleanup() {
    local rc=$?
    "$CLUSTER" down >/dev/null 2>&1 || true
    rm -rf "$TMP"
    local left
    left=$(cluster_ours)
    if [[ -n $left ]]; then
        echo "FAIL: namespaces of $P left after cleanup: $left" >&2
        rc=1
    fi
    exit "$rc"
}

cluster_setup() {
    CLUSTER=$1
    export GG_CLUSTER_PREFIX=gg$2$$ # at most 10 characters: pid_max is at most 4194304
    P=$GG_CLUSTER_PREFIX
    CLUSTER_START=$SECONDS
    TMP=$(mktemp -d "${TMPDIR:-/tmp}/$P-test.XXXXXX")
    trap cluster_cleanup EXIT
    trap "exit 143" TERM INT HUP
    local rc=0
    "$CLUSTER" down >/dev/null || rc=$?
    [[ $rc == 77 ]] && exit 77
    [[ $rc == 0 ]] || fail "cluster.sh down with nothing up exited $rc"
    return 0
}

cluster_up() {
    "$CLUSTER" up "$@" >"$TMP/up.log" 2>&1 || { cat "$TMP/up.log" >&2; fail "cluster.sh up $*"; }
}

cluster_down() {
    "$CLUSTER" down >/dev/null
    [[ -z $(cluster_ours) ]] || fail "namespaces of $P left after down: $(cluster_ours)"
}

# cluster_run LIMIT_S OUT -- RUN_ARGS...: cluster.sh run RUN_ARGS with output in OUT; fails the
# test (printing OUT) on a non-zero exit or after LIMIT_S seconds.
cluster_run() {
    local limit=$1 out=$2 rc=0
    shift 3
    timeout -k 5 "$limit" "$CLUSTER" run "$@" >"$out" 2>&1 || rc=$?
    if [[ $rc != 0 ]]; then
        tail -n 40 "$out" >&2
        [[ $rc == 124 ]] && fail "run $* did not end within $limit s"
        fail "run $* exited $rc"
    fi
}
