#!/usr/bin/env bash
# Fresh machine -> dependencies, a warnings-as-errors build, the format check and every test.
set -euo pipefail
cd "$(dirname "$0")"
# PyTorch and torchvision: the tests that compare logits with torchvision's models run with them.
# clang and its runtime (libFuzzer, sanitizers): the fuzz targets (fuzz/run.sh). iproute2 (ip,
# tc): the cluster in a box (bench/cluster/cluster.sh). universal-ctags: the function length check
# (tests/function_length.sh).
./scripts/deps.sh python3-torch python3-torchvision clang libclang-rt-14-dev iproute2 \
  universal-ctags
echo "test: clang-format check"
git ls-files '*.cpp' '*.hpp' | xargs clang-format --dry-run --Werror
cmake -S . -B build-test -G Ninja -DCMAKE_BUILD_TYPE=Release -DGG_WERROR=ON -DBUILD_TESTING=ON >/dev/null
cmake --build build-test -j 2
cd build-test
OMP_NUM_THREADS=1 ctest --output-on-failure -j 2 --timeout 900
cd ..
# The checkpoint and tar readers under libFuzzer (ASan + UBSan), briefly.
./fuzz/run.sh "${FUZZ_SECONDS:-5}"
