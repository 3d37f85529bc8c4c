#!/usr/bin/env bash
# Installs the Debian packages gossipgrad needs, only when some are missing (idempotent).
# Arguments name extra packages (test.sh adds PyTorch, the side-by-side baseline).
set -euo pipefail
PKGS=(build-essential cmake ninja-build pkg-config clang-format
      mpich libmpich-dev libdnnl-dev ocl-icd-opencl-dev opencl-headers
      libboost-program-options-dev catch2 zlib1g-dev nlohmann-json3-dev
      libturbojpeg0-dev libarchive-dev libxxhash-dev dataset-fashion-mnist python3 python3-numpy "$@")
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "deps: installing ${missing[*]}"
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "deps: all Debian packages present"
fi
