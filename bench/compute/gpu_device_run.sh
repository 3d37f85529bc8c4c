#!/usr/bin/env bash
# Running the CUDA checks on a lent GPU machine that has no package registry (it has CUDA's
# driver, nvcc, and PyTorch 2.x whose wheels bring cuDNN 9 and cuBLAS, but not our Debian
# dependencies). Two steps:
#
#   1. here, where apt works:   bench/compute/gpu_device_run.sh prepare
#      builds gg_cuda_tests and gg_bench_compute with GG_CUDA=ON (in $BUILD, default build-gpu),
#      copies them into .deps/gpu/bin, and unpacks with `dpkg -x` the Debian packages of the
#      shared libraries they need beyond CUDA and the base system (oneDNN and its OpenCL loader)
#      into .deps/gpu/root. .deps/ is ignored by git; the whole of .deps/gpu is about 45 MB.
#   2. on the GPU machine, with .deps/gpu carried along (device tool: carry [".deps/gpu"]):
#        bench/compute/gpu_device_run.sh run [OUTDIR]
#      points LD_LIBRARY_PATH at the unpacked libraries and at the cuDNN / cuBLAS that the
#      machine has (/usr/local/cuda/lib64 or PyTorch's nvidia-* wheels), refuses to go on if
#      `ldd` still misses a library (naming it), runs the GPU tests, then
#      bench/compute/run.sh --backend cuda against PyTorch on the same GPU, and copies the test
#      log and the benchmark's csv/md/txt into OUTDIR (default $OUT, else bench/results).
#      Environment for the benchmark as in run.sh: REPEATS, STEPS, WARMUP, and SETTINGS (the
#      MODEL:BATCH:RES:PRECISION list, default run.sh's).
set -euo pipefail
cd "$(dirname "$0")/../.."
GPU=.deps/gpu
case "${1:-}" in
  prepare)
    BUILD=${BUILD:-build-gpu}
    cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGG_CUDA=ON -DBUILD_TESTING=ON \
      -DGG_BENCH=ON >/dev/null
    cmake --build "$BUILD" -j "${JOBS:-2}" --target gg_cuda_tests gg_bench_compute
    rm -rf "$GPU"
    mkdir -p "$GPU/bin/bench" "$GPU/bin/tests" "$GPU/debs" "$GPU/root"
    cp "$BUILD/tests/gg_cuda_tests" "$GPU/bin/tests/"
    cp "$BUILD/bench/gg_bench_compute" "$GPU/bin/bench/"
    # Packages of the libraries ldd resolves outside CUDA and glibc/libstdc++/libgomp (dpkg knows
    # a file by its /usr path on merged-/usr systems).
    pkgs=""
    for f in $(ldd "$GPU/bin/tests/gg_cuda_tests" "$GPU/bin/bench/gg_bench_compute" |
      awk '/=> \// {print $3}' | sort -u |
      grep -v -e /usr/local/cuda -e 'libc\.so' -e 'libm\.so' -e 'libstdc++' -e 'libgcc_s' \
        -e 'libgomp' -e 'ld-linux' -e 'libdl\.' -e 'libpthread' -e 'librt\.'); do
      for p in "$f" "/usr$f" "$(realpath "$f")"; do
        owner=$(dpkg -S "$p" 2>/dev/null | head -1 | cut -d: -f1) && [ -n "$owner" ] && break
      done
      [ -n "$owner" ] || { echo "gpu_device_run: no package owns $f" >&2; exit 1; }
      pkgs="$pkgs $owner"
    done
    pkgs=$(echo $pkgs | tr ' ' '\n' | sort -u | xargs)
    echo "gpu_device_run: unpacking $pkgs"
    (cd "$GPU/debs" && apt-get download $pkgs >/dev/null)
    for d in "$GPU"/debs/*.deb; do dpkg -x "$d" "$GPU/root"; done
    rm -rf "$GPU/debs"
    du -sh "$GPU"
    echo "gpu_device_run: ready; carry .deps/gpu and run: bench/compute/gpu_device_run.sh run"
    ;;
  run)
    OUTDIR=${2:-${OUT:-bench/results}}
    mkdir -p "$OUTDIR"
    [ -x "$GPU/bin/tests/gg_cuda_tests" ] || {
      echo "gpu_device_run: $GPU is missing: run 'prepare' where apt works and carry it" >&2
      exit 1
    }
    libs="$PWD/$GPU/root/usr/lib/x86_64-linux-gnu:$PWD/$GPU/root/lib/x86_64-linux-gnu"
    for d in /usr/local/cuda/lib64 /usr/local/cuda/lib; do [ -d "$d" ] && libs="$libs:$d"; done
    # PyTorch's wheels carry cuDNN 9 and cuBLAS 13 (the sonames our binaries link against).
    wheels=$(python3 -c 'import os, nvidia; print(" ".join(os.path.join(p, d, "lib") for p in nvidia.__path__ for d in os.listdir(p)))' 2>/dev/null || true)
    for d in $wheels; do [ -d "$d" ] && libs="$libs:$d"; done
    export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    missing=$(ldd "$GPU/bin/tests/gg_cuda_tests" "$GPU/bin/bench/gg_bench_compute" | grep 'not found' | sort -u || true)
    if [ -n "$missing" ]; then
      echo "gpu_device_run: libraries not found: $(echo "$missing" | awk '{print $1}' | xargs)" >&2
      exit 1
    fi
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
    set +e
    "$GPU/bin/tests/gg_cuda_tests" 2>&1 | tee "$OUTDIR/cuda-tests.txt"
    tests_rc=${PIPESTATUS[0]}
    set -e
    echo "gpu_device_run: gg_cuda_tests exit $tests_rc"
    # run.sh looks for $BUILD/bench/gg_bench_compute; REBUILD=0 keeps the carried binary.
    read -r -a settings <<<"${SETTINGS:-}"
    BUILD="$GPU/bin" REBUILD=0 PYTHON=python3 bench/compute/run.sh --backend cuda "${settings[@]}"
    cp bench/results/compute-cuda-"$(hostname)".* "$OUTDIR/" 2>/dev/null || true
    exit "$tests_rc"
    ;;
  *)
    sed -n 2,22p "$0" >&2
    exit 2
    ;;
esac
