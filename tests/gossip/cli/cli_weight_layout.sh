#!/usr/bin/env bash
# train.weight_layout end to end under mpirun with 2 ranks, on a network whose convolutions are
# kept blocked (width 16: 16/32/64 channels; 16-blocks on AVX-512, 8-blocks on AVX2), on
# Fashion-MNIST:
# - native and plain train bit for bit alike: after 12 steps every rank's full checkpoint state
#   (plain on disk) is identical byte for byte, and the ranks' average model (model.npz) equal;
# - a checkpoint written by a native run resumes exactly in a plain run, and the other way round;
# - ranks whose CPUs want different layouts (rank 1 limited by ONEDNN_MAX_CPU_ISA to AVX2 on
#   AVX-512, to AVX on AVX2, where it keeps the weights plain) all stay plain, rank 0 says so,
#   and they train.
# Skipped (77) on CPUs without AVX2, where every layout is plain. A cap already in the
# environment (ONEDNN_MAX_CPU_ISA=AVX2: the whole suite run as on an AVX2 machine) counts as the CPU.
set -euo pipefail
BIN="$1"; ROOT="$2"; MPIEXEC="$3"
case "${ONEDNN_MAX_CPU_ISA:-ALL}" in
  ALL | AVX512*) CAP=avx512f ;;
  AVX2*) CAP=avx2 ;;
  *) CAP=none ;;
esac
if [ "$CAP" = avx512f ] && grep -q ' avx512f ' /proc/cpuinfo; then OTHER_ISA=AVX2
elif [ "$CAP" != none ] && grep -q ' avx2 ' /proc/cpuinfo; then OTHER_ISA=AVX
else echo "SKIP: no AVX2 (or oneDNN capped below it): every weight layout is plain"; exit 77; fi
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
cd "$TMP"
export OMP_NUM_THREADS=1
fail() { echo "FAIL: $*"; for f in *.log; do echo "== $f"; tail -4 "$f"; done; exit 1; }
RUN=(train --config "$ROOT/configs/laptop.ini"
     --model.width 16 --train.batch 32 --train.threads 1 --train.epochs 3
     --log.progress false --log.overwrite true --gossip.consensus_every 0
     --gossip.mode both --checkpoint.every 6 --train.max_steps 12)
train() { "$MPIEXEC" -n 2 "$BIN" "${RUN[@]}" "$@"; }
same_states() {  # same_states DIR_A DIR_B STEP
  local n=0 d
  d=$(printf 'ckpt-%012d' "$3")
  for a in "$1/$d"/rank-*.bin; do
    cmp -s "$a" "$2/$d/$(basename "$a")" || return 1
    n=$((n + 1))
  done
  [ "$n" = 2 ]
}

train --train.weight_layout native --checkpoint.dir N > n.log 2>&1 || fail "native"
train --train.weight_layout plain --checkpoint.dir P > p.log 2>&1 || fail "plain"
same_states N P 6 || fail "native and plain states differ at step 6"
same_states N P 12 || fail "native and plain states differ at step 12"
/usr/bin/python3 - N P <<'PY' || fail "average models differ"
import glob, os, sys, zipfile
def arrays(path):
    z = zipfile.ZipFile(path)
    return {n: z.read(n) for n in z.namelist()}
A, B = sys.argv[1], sys.argv[2]
models = sorted(glob.glob(f"{A}/**/model.npz", recursive=True))
assert models, "no model.npz"
for m in models:
    a, b = arrays(m), arrays(os.path.join(B, os.path.relpath(m, A)))
    assert a.keys() == b.keys() and all(a[k] == b[k] for k in a), f"{m}: arrays differ"
print(f"{len(models)} model.npz equal")
PY
echo "native and plain train bit for bit alike: ok"

# Resume across layouts: stop at 6, go on in the other layout; the states at 12 are exact.
train --train.weight_layout native --checkpoint.dir NP --train.stop_at 6 > np1.log 2>&1 ||
  fail "native, stopped"
train --train.weight_layout plain --checkpoint.dir NP --checkpoint.resume auto > np2.log 2>&1 ||
  fail "plain, resumed"
grep -q "at step 6" np2.log || fail "not resumed at step 6"
same_states N NP 12 || fail "native -> plain resume is not exact"
train --train.weight_layout plain --checkpoint.dir PN --train.stop_at 6 > pn1.log 2>&1 ||
  fail "plain, stopped"
train --train.weight_layout native --checkpoint.dir PN --checkpoint.resume auto > pn2.log 2>&1 ||
  fail "native, resumed"
same_states N PN 12 || fail "plain -> native resume is not exact"
echo "resume across layouts is exact: ok"

# Ranks on CPUs that want different layouts: rank 1 as on the next older ISA.
"$MPIEXEC" -n 1 "$BIN" "${RUN[@]}" --checkpoint.dir M : \
  -n 1 env "ONEDNN_MAX_CPU_ISA=$OTHER_ISA" "$BIN" "${RUN[@]}" --checkpoint.dir M > m.log 2>&1 ||
  fail "mixed CPUs"
grep -q "want different weight layouts" m.log || fail "no note about the layouts"
echo "PASS: weight layouts"
