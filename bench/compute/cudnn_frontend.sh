#!/usr/bin/env bash
# cudnn-frontend 1.32.0 (NVIDIA's header-only C++ wrapper of cuDNN's graph API) into
# .deps/cudnn-frontend-1.32.0/include, for the CUDA backend's convolution + statistics fusion
# (kernels/cuda/conv_stats.hpp). PyPI's nvidia-cudnn-frontend wheel is the registry that ships
# the headers; only include/ is kept (the wheel's Python module is not used). Reconfigure the
# build afterwards (cmake picks the folder up). Exits 1 with one line when it cannot fetch it.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
VERSION=1.32.0
DEST="$ROOT/.deps/cudnn-frontend-$VERSION"
[ -f "$DEST/include/cudnn_frontend.h" ] && { echo "cudnn-frontend $VERSION: $DEST/include"; exit 0; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.11 \
  "nvidia-cudnn-frontend==$VERSION" -d "$TMP" >/dev/null 2>"$TMP/err" ||
  { echo "cudnn_frontend.sh: pip could not download nvidia-cudnn-frontend==$VERSION: $(tail -1 "$TMP/err")"; exit 1; }
whl=$(ls "$TMP"/nvidia_cudnn_frontend-*.whl 2>/dev/null | head -1)
[ -n "$whl" ] || { echo "cudnn_frontend.sh: no wheel downloaded"; exit 1; }
mkdir -p "$TMP/x"
python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$whl" "$TMP/x"
[ -f "$TMP/x/include/cudnn_frontend.h" ] ||
  { echo "cudnn_frontend.sh: the wheel holds no include/cudnn_frontend.h"; exit 1; }
mkdir -p "$DEST"
cp -r "$TMP/x/include" "$DEST/"
echo "cudnn-frontend $VERSION: $DEST/include"
