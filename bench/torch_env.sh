#!/usr/bin/env bash
# bench/torch_env.sh: today's PyTorch for the benchmarks' baselines, pinned (torch 2.15.0,
# torchvision 0.29.2, from PyPI: the only source of 2.15; Debian ships 1.13), in a virtual
# environment made once at the checkout's root (.venv-torch215, ignored by git; GG_TORCH_VENV
# names another). Prints the environment's python on stdout, everything else on stderr:
#   PY=$(bench/torch_env.sh)
# The wheel pulls CUDA 13's runtime libraries (about 4 GB); it runs on the CPU without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${GG_TORCH_VENV:-.venv-torch215}
TORCH_VERSION=2.15.0
TORCHVISION_VERSION=0.29.2
have() {
  "$VENV/bin/python" -c "import sys, torch, torchvision
sys.exit(0 if (torch.__version__.split('+')[0], torchvision.__version__.split('+')[0]) ==
         ('$TORCH_VERSION', '$TORCHVISION_VERSION') else 1)" 2>/dev/null
}
if ! have; then
  ./scripts/deps.sh python3-venv >&2
  echo "torch_env: installing torch $TORCH_VERSION and torchvision $TORCHVISION_VERSION into $VENV" >&2
  /usr/bin/python3 -m venv "$VENV" >&2
  "$VENV/bin/pip" install -q --disable-pip-version-check "torch==$TORCH_VERSION" \
    "torchvision==$TORCHVISION_VERSION" numpy >&2
  have || { echo "torch_env: $VENV does not import torch $TORCH_VERSION after the install" >&2; exit 1; }
fi
echo "$PWD/$VENV/bin/python"
