#!/usr/bin/env bash
# The GPU checks on a lent GPU machine that has no package registry (it has CUDA's driver, nvcc,
# and PyTorch 2.x whose wheels bring cuDNN 9 and cuBLAS 13, but none of our Debian libraries and
# no MPI). Two steps:
#
#   1. here, where the build works:   bench/compute/gpu_device_run.sh prepare
#      builds gossipgrad, gg_cuda_tests, gg_bench_compute and gg_bench_cuda_eltwise with GG_CUDA=ON (in $BUILD, default
#      build-gpu), and packs into .deps/gpu/bundle.tar.xz the binaries, MPICH's launcher
#      (mpiexec.hydra, hydra_pmi_proxy) and every shared library they load beyond CUDA and glibc /
#      libstdc++, copied from this machine's Debian packages and stripped; beside it
#      .deps/gpu/fashion-mnist holds Debian's Fashion-MNIST files. .deps/ is ignored by git; the
#      whole of .deps/gpu is about 57 MB (the device tool carries at most 64 MiB with the tree).
#   2. on the GPU machine, with .deps/gpu carried along (device tool: carry [".deps/gpu"]):
#        bench/compute/gpu_device_run.sh run [OUTDIR]
#      unpacks the bundle into a temporary folder, points LD_LIBRARY_PATH at it and at the
#      machine's cuDNN / cuBLAS (/usr/local/cuda or PyTorch's nvidia-* wheels), refuses to go on
#      if `ldd` still misses a library (naming it), then runs, each under its own time limit so
#      that one failure or hang leaves time for the rest:
#        a. gg_cuda_tests (every layer against the reference backend, ResNet-18 / GoogLeNet
#           against oneDNN, device SGD, staging, resident training, the trainer's device state),
#           then gg_cuda_ipc_tests under mpiexec -n 2 (the CUDA IPC exchanges against the host's
#           pair average, bit for bit);
#        b. mpirun -n 2 gossipgrad train --train.backend cuda on Fashion-MNIST (configs/laptop.ini,
#           EPOCHS epochs, default 2; both ranks on the one GPU; FMNIST_ARGS: more options);
#        c. mpirun -n 2 gossipgrad train --train.backend cuda, ResNet-50 on synthetic ImageNet-
#           shaped data (3x224x224, 1000 classes), R50_STEPS steps (default 100) of R50_BATCH
#           (default 64) per rank, gossip mode both: exposed communication and data wait in the
#           metrics;
#        c2. resident (only when STEPS_ONLY names it): Fashion-MNIST and ResNet-50 as in b and c with
#           --train.resident true (ResNet-50 also with false, the host-staged step, same options);
#           exact resume with --train.deterministic true (60 steps against 30 + a resume: the same
#           model.npz arrays);
#           and gg_bench_compute's single-process resident step at R50_BATCH, into resident.txt,
#           resident-metrics.jsonl and staged-metrics.jsonl;
#        d. eltwise: gg_bench_cuda_eltwise, the batch norm passes fused and one by one at
#           ResNet-50's shapes against a device-to-device copy of the same bytes, into eltwise.txt;
#        e. profile: ResNet-50 at batch 256 in tf32 and bf16 with GG_CUDA_PROFILE=1 (the time per
#           step by kind of layer, from CUDA events): channels-first one layer at a time, fused,
#           channels-last fused, and (bf16) with the statistics in the convolutions' epilogue,
#           into bench.txt;
#        f. bench/compute/run.sh --backend cuda against the machine's PyTorch (channels_last
#           eager and torch.compile), alternating.
#      OUTDIR (default $OUT, else bench/results/gpu-<host>) gets at most 9 files: device.txt,
#      cuda-tests.txt, fmnist.txt, fmnist-metrics.jsonl, r50.txt, r50-metrics.jsonl, eltwise.txt,
#      bench.txt, bench.csv. Environment: STEPS_ONLY (a subset of "tests fmnist r50 eltwise
#      profile bench", default all),
#      BUDGET_S (seconds for the whole run, default 540: each part's limit is cut to what is
#      left), and run.sh's REPEATS, STEPS, WARMUP, SETTINGS (MODEL:BATCH:RES:PRECISION list).
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/checks.sh
GPU=.deps/gpu
case "${1:-}" in
  prepare)
    BUILD=${BUILD:-build-gpu}
    # cuDNN's graph API for the convolution + statistics fusion (CudaOptions::conv_stats): the
    # build goes on without it, and the runs that ask for it then say so in one line.
    bench/compute/cudnn_frontend.sh || echo "gpu_device_run: building without cudnn-frontend" >&2
    [ -f "$BUILD/CMakeCache.txt" ] ||
      cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGG_CUDA=ON -DBUILD_TESTING=ON \
        -DGG_BENCH=ON >/dev/null
    grep -q '^GG_CUDA:STRING=\(ON\|AUTO\)' "$BUILD/CMakeCache.txt" || {
      echo "gpu_device_run: $BUILD is configured without CUDA (GG_CUDA=OFF)" >&2
      exit 1
    }
    cmake --build "$BUILD" -j "${JOBS:-2}" --target gg_cuda_tests gg_cuda_ipc_tests \
      gg_bench_compute gg_bench_cuda_eltwise gossipgrad
    stage=$(mktemp -d)
    trap 'rm -rf "$stage"' EXIT
    mkdir -p "$stage/gg/bin" "$stage/gg/lib/ucx"
    bins=("$BUILD/tests/gg_cuda_tests" "$BUILD/tests/gg_cuda_ipc_tests" "$BUILD/bench/gg_bench_compute"
      "$BUILD/bench/gg_bench_cuda_eltwise" "$BUILD/gossip/gossipgrad" /usr/bin/mpiexec.hydra
      /usr/bin/hydra_pmi_proxy)
    cp "${bins[@]}" "$stage/gg/bin/"
    # UCX finds its transport modules in <libucs's folder>/ucx: cma (single-copy between
    # processes) needs nothing more; the InfiniBand modules are left out (no such device there).
    cp -L /usr/lib/x86_64-linux-gnu/ucx/libuct_cma.so.0 "$stage/gg/lib/ucx/"
    # Every library ldd resolves outside CUDA and the C / C++ runtimes, for the binaries and the
    # launcher.
    for f in $(ldd "${bins[@]}" /usr/lib/x86_64-linux-gnu/ucx/libuct_cma.so.0 |
      awk '/=> \// {print $3}' | sort -u |
      grep -v -e /usr/local/cuda -e 'libc\.so' -e 'libm\.so' -e 'libstdc++' -e 'libgcc_s' \
        -e 'ld-linux' -e 'libdl\.' -e 'libpthread' -e 'librt\.' -e 'libresolv\.'); do
      cp -L "$f" "$stage/gg/lib/"
    done
    strip --strip-unneeded "$stage"/gg/bin/* "$stage"/gg/lib/*.so* "$stage"/gg/lib/ucx/*
    rm -rf "$GPU"
    mkdir -p "$GPU/fashion-mnist"
    echo "gpu_device_run: compressing $(du -sh "$stage/gg" | cut -f1) of binaries and libraries"
    tar -C "$stage" -cf - gg | xz -T "${JOBS:-2}" -6 >"$GPU/bundle.tar.xz"
    cp /usr/share/datasets/fashion-mnist/*.gz "$GPU/fashion-mnist/"
    du -sh "$GPU"
    echo "gpu_device_run: ready; carry .deps/gpu and run: bench/compute/gpu_device_run.sh run"
    ;;
  run)
    OUTDIR=${2:-${OUT:-bench/results/gpu-$(hostname)}}
    BUDGET_S=${BUDGET_S:-540}
    gg_int BUDGET_S "$BUDGET_S" 60
    EPOCHS=${EPOCHS:-2}
    R50_STEPS=${R50_STEPS:-100}
    R50_BATCH=${R50_BATCH:-64}
    gg_int EPOCHS "$EPOCHS" 1 100
    gg_int R50_STEPS "$R50_STEPS" 1
    gg_int R50_BATCH "$R50_BATCH" 1 4096
    PARTS=${STEPS_ONLY:-tests fmnist r50 eltwise profile bench}
    for p in $PARTS; do
      case "$p" in tests | fmnist | r50 | resident | eltwise | profile | bench) ;; *)
        echo "gpu_device_run: STEPS_ONLY takes tests, fmnist, r50, resident, eltwise, profile, bench (not '$p')" >&2
        exit 2
        ;;
      esac
    done
    start=$SECONDS
    mkdir -p "$OUTDIR"
    [ -f "$GPU/bundle.tar.xz" ] || {
      echo "gpu_device_run: $GPU/bundle.tar.xz is missing: run 'prepare' here and carry .deps/gpu" >&2
      exit 1
    }
    root=$(mktemp -d)
    xz -dc -T 0 "$GPU/bundle.tar.xz" | tar -C "$root" -xf -
    bin=$root/gg/bin
    libs="$root/gg/lib"
    for d in /usr/local/cuda/lib64 /usr/local/cuda/lib; do [ -d "$d" ] && libs="$libs:$d"; done
    # PyTorch's wheels carry cuDNN 9 and cuBLAS 13 (the sonames our binaries link against).
    wheels=$(python3 -c 'import os, nvidia; print(" ".join(os.path.join(p, d, "lib") for p in nvidia.__path__ for d in os.listdir(p)))' 2>/dev/null || true)
    for d in $wheels; do [ -d "$d" ] && libs="$libs:$d"; done
    export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export PATH="$bin:$PATH"
    {
      echo "# $(date -u +%FT%TZ) $(uname -srm), $(nproc) cores: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
      nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv || true
      python3 -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda, "cuDNN", torch.backends.cudnn.version())' || true
      ldd "$bin"/gossipgrad "$bin"/gg_cuda_tests "$bin"/gg_bench_compute \
        "$bin"/gg_bench_cuda_eltwise "$bin"/mpiexec.hydra |
        grep -e cud -e cublas -e 'not found' | sort -u
    } >"$OUTDIR/device.txt" 2>&1
    cat "$OUTDIR/device.txt"
    missing=$(ldd "$bin"/* | grep 'not found' | sort -u || true)
    if [ -n "$missing" ]; then
      echo "gpu_device_run: libraries not found: $(echo "$missing" | awk '{print $1}' | xargs)" >&2
      exit 1
    fi
    # part NAME CAP_S LOG CMD...: runs CMD under the smaller of CAP_S and what is left of BUDGET_S,
    # output into LOG, and records its exit status.
    failed=""
    tail_lines=8
    part() {
      local name="$1" cap="$2" log="$3" left rc
      shift 3
      left=$((BUDGET_S - (SECONDS - start) - 5))
      ((left < cap)) && cap=$left
      if ((cap < 10)); then
        echo "gpu_device_run: $name: no time left in BUDGET_S=$BUDGET_S" | tee -a "$log"
        failed="$failed $name"
        return
      fi
      echo "gpu_device_run: $name (at most ${cap}s) at $((SECONDS - start))s"
      set +e
      timeout -k 5 "$cap" "$@" >>"$log" 2>&1
      rc=$?
      set -e
      echo "gpu_device_run: $name exit $rc after $((SECONDS - start))s" | tee -a "$log"
      ((rc == 0)) || failed="$failed $name"
      tail -n "$tail_lines" "$log"
    }
    data="$PWD/$GPU/fashion-mnist"
    mpi=(mpiexec.hydra -n 2)
    for p in $PARTS; do
      case "$p" in
        tests)
          part tests 120 "$OUTDIR/cuda-tests.txt" "$bin/gg_cuda_tests" --durations yes
          part "ipc tests" 60 "$OUTDIR/cuda-tests.txt" "${mpi[@]}" "$bin/gg_cuda_ipc_tests"
          ;;
        fmnist)
          part fmnist 120 "$OUTDIR/fmnist.txt" "${mpi[@]}" "$bin/gossipgrad" train \
            --config configs/laptop.ini --train.backend cuda --train.epochs "$EPOCHS" \
            --data.dir "$data" --log.metrics "$OUTDIR/fmnist-metrics.jsonl" \
            --log.overwrite true --log.interval 10 ${FMNIST_ARGS:-}
          ;;
        r50)
          part r50 100 "$OUTDIR/r50.txt" "${mpi[@]}" "$bin/gossipgrad" train \
            --config configs/laptop.ini --train.backend cuda --model.name resnet50 \
            --data.source "synthetic:3x224x224:1000:$((R50_BATCH * 2 * R50_STEPS))" \
            --train.batch "$R50_BATCH" --train.max_steps "$R50_STEPS" --gossip.bucket_kb 16384 \
            --data.workers 4 --data.prefetch 4 --log.metrics "$OUTDIR/r50-metrics.jsonl" --log.overwrite true \
            --log.interval 10
          ;;
        resident)
          # The trainer's state on the GPU (train.resident) against the host-staged step, same
          # options (the weight exchange not overlapped: refused with a resident state), and the
          # single-process resident benchmark at the same per-rank batch.
          part "fmnist resident" 120 "$OUTDIR/resident.txt" "${mpi[@]}" "$bin/gossipgrad" train \
            --config configs/laptop.ini --train.backend cuda --train.resident true \
            --gossip.overlap_model false --train.epochs "$EPOCHS" --data.dir "$data" \
            --log.interval 10 ${FMNIST_ARGS:-}
          # Exact resume on the GPU (train.deterministic): 60 steps straight, and 30 + a resume to
          # 60, must end in the same weights (the average model's arrays, bit for bit).
          ck=$(mktemp -d)
          exact=(--config configs/laptop.ini --train.backend cuda --train.resident true
            --train.deterministic true --gossip.overlap_model false --train.max_steps 60
            --data.dir "$data" --log.progress false --train.eval_batch 1000)
          part "resume straight" 60 "$OUTDIR/resident.txt" "${mpi[@]}" "$bin/gossipgrad" train \
            "${exact[@]}" --checkpoint.dir "$ck/a"
          part "resume stop" 60 "$OUTDIR/resident.txt" "${mpi[@]}" "$bin/gossipgrad" train \
            "${exact[@]}" --checkpoint.dir "$ck/b" --train.stop_at 30
          part "resume rest" 60 "$OUTDIR/resident.txt" "${mpi[@]}" "$bin/gossipgrad" train \
            "${exact[@]}" --checkpoint.dir "$ck/b" --checkpoint.resume auto
          part "resume compare" 30 "$OUTDIR/resident.txt" python3 -c '
import sys, numpy as np
a, b = np.load(sys.argv[1]), np.load(sys.argv[2])
assert sorted(a.files) == sorted(b.files), "other arrays"
bad = [k for k in a.files if a[k].tobytes() != b[k].tobytes()]
print("exact resume on the GPU:", "the same bits" if not bad else "DIFFERS in %d of %d arrays (%s)" % (len(bad), len(a.files), bad[0]))
sys.exit(1 if bad else 0)' "$ck/a/model.npz" "$ck/b/model.npz"
          rm -rf "$ck"
          for how in true false; do
            part "r50 resident $how" 90 "$OUTDIR/resident.txt" "${mpi[@]}" "$bin/gossipgrad" train \
              --config configs/laptop.ini --train.backend cuda --model.name resnet50 \
              --train.resident "$how" --gossip.overlap_model false \
              --data.source "synthetic:3x224x224:1000:$((R50_BATCH * 2 * R50_STEPS))" \
              --train.batch "$R50_BATCH" --train.max_steps "$R50_STEPS" --gossip.bucket_kb 16384 \
              --data.workers 4 --data.prefetch 4 --log.interval 10 \
              --log.metrics "$OUTDIR/$([ "$how" = true ] && echo resident || echo staged)-metrics.jsonl"
          done
          part "r50 one process" 60 "$OUTDIR/resident.txt" "$bin/gg_bench_compute" --backend cuda \
            --model resnet50 --batch "$R50_BATCH" --res 224 --precision tf32 --layout native --fuse off \
            --steps 20 --warmup 3
          ;;
        eltwise)
          part eltwise 60 "$OUTDIR/eltwise.txt" "$bin/gg_bench_cuda_eltwise" --repeats 10
          ;;
        profile)
          # Where a step goes: per-layer CUDA events (GG_CUDA_PROFILE), ResNet-50 at batch 256:
          # channels-first one layer at a time (as before), fused, and channels-last fused.
          for prec in tf32 bf16; do
            for how in "native off off" "native on off" "nhwc on off" "nhwc on on"; do
              read -r layout fuse stats <<<"$how"
              [ "$stats" = on ] && [ "$prec" != bf16 ] && continue  # conv_stats: bf16 only
              GG_CUDA_PROFILE=1 part "profile $prec $layout fuse $fuse conv-stats $stats" 40 \
                "$OUTDIR/bench.txt" "$bin/gg_bench_compute" --backend cuda --model resnet50 \
                --batch 256 --res 224 --precision "$prec" --layout "$layout" --fuse "$fuse" \
                --conv-stats "$stats" --steps 5 --warmup 2
            done
          done
          ;;
        bench)
          read -r -a settings <<<"${SETTINGS:-}"
          # run.sh looks for $BUILD/bench/gg_bench_compute; REBUILD=0 keeps the carried binary.
          mkdir -p "$root/b/bench"
          ln -sf "$bin/gg_bench_compute" "$root/b/bench/gg_bench_compute"
          tail_lines=12
          part bench 300 "$OUTDIR/bench.txt" env BUILD="$root/b" REBUILD=0 PYTHON=python3 \
            bench/compute/run.sh --backend cuda "${settings[@]}"
          h=bench/results/compute-cuda-$(hostname)
          if [ -f "$h.csv" ]; then
            cp "$h.csv" "$OUTDIR/bench.csv"
            { echo; cat "$h.md" "$h.txt"; } >>"$OUTDIR/bench.txt" 2>/dev/null || true
          fi
          ;;
      esac
    done
    rm -rf "$root"
    echo "gpu_device_run: done in $((SECONDS - start))s; failed:${failed:- none}"
    [ -z "$failed" ]
    ;;
  *)
    sed -n 2,39p "$0" >&2
    exit 2
    ;;
esac
