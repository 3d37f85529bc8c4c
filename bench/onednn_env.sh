#!/usr/bin/env bash
# bench/onednn_env.sh: a current oneDNN for our own kernels, beside Debian bookworm's 2.6.3.
# Builds oneDNN 3.7.2 from Debian trixie's source package (the newest oneDNN Debian ships;
# bookworm's binary packages cannot take trixie's, whose libstdc++ is newer) with OpenMP
# threading, as bookworm's 2.6.3 and PyTorch's own oneDNN thread, into .deps/onednn-3.7.2 at the
# checkout's root (ignored by git; GG_ONEDNN_PREFIX names another). Only the primitives
# gossipgrad uses are built (about 20 minutes on 2 cores). Prints the CMake package directory on
# stdout, everything else on stderr:
#   cmake -S . -B build-onednn3 -Ddnnl_DIR=$(bench/onednn_env.sh) ...
# Why not PyPI's `onednn-devel`: see bench/results/README.md ("A current oneDNN").
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=3.7.2
DEB=3.7.2+ds-2
SHA_ORIG=0cc51ca26c1af6a2bb1e71e378e7046f3ceb3e71791ee9d4e246d50f904a6ea6
POOL=${GG_DEBIAN_MIRROR:-http://deb.debian.org/debian}/pool/main/o/onednn
PREFIX=${GG_ONEDNN_PREFIX:-$PWD/.deps/onednn-$VERSION}
CONFIG=$PREFIX/lib/cmake/dnnl
JOBS=${JOBS:-$(nproc)}

if [ -f "$CONFIG/dnnl-config.cmake" ] && grep -q "\"$VERSION\"" "$CONFIG/dnnl-config-version.cmake"; then
  echo "$CONFIG"
  exit 0
fi
./scripts/deps.sh curl xz-utils >&2
work=$(mktemp -d "${TMPDIR:-/tmp}/gg-onednn.XXXXXX")
trap 'rm -rf "$work"' EXIT
orig=onednn_${VERSION}+ds.orig.tar.xz
echo "onednn_env: fetching $orig ($DEB) from Debian" >&2
curl -fsS --retry 3 --max-time 600 -o "$work/$orig" "$POOL/$orig" || {
  echo "onednn_env: cannot fetch $POOL/$orig; set GG_DEBIAN_MIRROR to a reachable Debian mirror" >&2
  exit 1
}
echo "$SHA_ORIG  $work/$orig" | sha256sum -c --quiet - >&2 || {
  echo "onednn_env: $orig does not match its Debian checksum; not building it" >&2
  exit 1
}
tar -xJf "$work/$orig" -C "$work"
src=$(find "$work" -mindepth 1 -maxdepth 1 -type d | head -1)
# The primitives gossipgrad's executor, benchmarks and tests create (kernels/onednn, bench/compute).
prims="CONVOLUTION;DECONVOLUTION;BATCH_NORMALIZATION;ELTWISE;POOLING;INNER_PRODUCT;REORDER;SUM"
prims+=";CONCAT;BINARY;LRN;MATMUL"
echo "onednn_env: building oneDNN $VERSION into $PREFIX with $JOBS jobs (about 20 minutes on 2 cores)" >&2
cmake -S "$src" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_INSTALL_PREFIX="$PREFIX" -DONEDNN_CPU_RUNTIME=OMP -DONEDNN_GPU_RUNTIME=NONE \
  -DONEDNN_BUILD_GRAPH=OFF -DONEDNN_BUILD_TESTS=OFF -DONEDNN_BUILD_EXAMPLES=OFF \
  -DONEDNN_BUILD_DOC=OFF -DONEDNN_ENABLE_PRIMITIVE="$prims" >"$work/configure.log" 2>&1 || {
  tail -20 "$work/configure.log" >&2
  echo "onednn_env: oneDNN $VERSION's configure failed (its log above)" >&2
  exit 1
}
ninja -C "$work/build" -j "$JOBS" install >"$work/build.log" 2>&1 || {
  tail -20 "$work/build.log" >&2
  echo "onednn_env: oneDNN $VERSION's build failed (its log above)" >&2
  exit 1
}
[ -f "$CONFIG/dnnl-config.cmake" ] || {
  echo "onednn_env: the install left no $CONFIG/dnnl-config.cmake" >&2
  exit 1
}
echo "$CONFIG"
