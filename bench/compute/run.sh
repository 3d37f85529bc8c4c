#!/usr/bin/env bash
# bench/compute: training images/s (forward + backward + SGD update) of gossipgrad's oneDNN
# backend side by side with PyTorch on the same model, batch, resolution and thread count, one
# process each, alternating, REPEATS times per setting. PyTorch is 2.15 (pinned, from PyPI, in the
# environment bench/torch_env.sh makes), run eager in channels_last and under torch.compile (model
# and optimizer step); its best is the faster of the two. TORCH=debian runs Debian's python3-torch
# (1.13, eager only) instead, the anchor of the results before 2026-11-29.
# Writes bench/results/compute-<host>.csv and a markdown table with the ratio of the medians.
# Usage: bench/compute/run.sh [MODEL:BATCH:RES:THREADS[:PRECISION] ...]
#   default: ResNet-50 and GoogLeNet at 224 and 64, batch 16, 2 threads, fp32 and bf16.
#   PRECISION (fp32 default, or bf16): gossipgrad's, and PyTorch's channels_last runs' (bf16 under
#   autocast), eager and compiled; PyTorch's default (NCHW fp32, eager) runs beside as the reference. PyTorch's
#   BLAS is OpenBLAS (installed). Each model's achieved FLOP/s (3 x its forward FLOPs per image)
#   is stated as a share of oneDNN's best training convolution on this CPU (gg_bench_peak). A
#   second table says what bounds each row: the instruction peak, and the floor of the step on
#   oneDNN's kernels (gg_bench_peak --model: the model's own layer shapes alone, and the SGD
#   update). Writes also bench/results/compute-<host>.{peak,flops,floor}.csv.
# Environment: REPEATS (default 3), STEPS (timed steps, default 10), WARMUP (default 3), NAME (the
#   results' file name without extension, default compute-<host>: name runs on another CPU of the
#   same host name apart, e.g. NAME=compute-avx2-vm, so that they do not replace earlier files),
#   ONEDNN (debian: Debian's oneDNN 2.6.3, in build/, the default; 3.7: oneDNN 3.7.2 built by
#   bench/onednn_env.sh, gossipgrad in build-onednn3/).
#
# bench/compute/run.sh --backend cuda [MODEL:BATCH:RES:PRECISION ...]: the GPU comparison. The
#   CUDA backend (resident: the step never leaves the GPU) channels-last (fused, the step replayed
#   as a CUDA graph) and channels-first
#   against PyTorch 2.x on the same GPU (same model, batch and precision; PyTorch in
#   channels_last, cudnn.benchmark on, eager and under torch.compile), alternating, REPEATS
#   times, and PyTorch in NCHW once per setting. PRECISION: fp32 (TF32 off on both sides), tf32 (TF32 on on both), bf16 (ours:
#   bf16 activations over fp32 master weights; PyTorch: autocast bf16). Default settings:
#   resnet50:256:224:tf32 resnet50:256:224:bf16 googlenet:256:224:tf32 googlenet:256:224:bf16.
#   PYTHON (default python3) must have torch 2.x with CUDA; nothing is installed (GPU machines
#   may have no package registry: see bench/compute/gpu_device_run.sh). Writes
#   bench/results/compute-cuda-<host>.{csv,md,txt}.
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/checks.sh
# check_settings PRECISIONS SETTING...: each MODEL:BATCH:RES:THREADS[:PRECISION] (CUDA:
# MODEL:BATCH:RES:PRECISION) names a torchvision model both sides build and numbers in range;
# checked before anything runs or a results file is rewritten (an unknown model truncated the
# results, then failed in a traceback).
check_settings() {
  local precisions=$1 s model batch res threads precision
  shift
  for s in "$@"; do
    if [ "$BACKEND" = cuda ]; then
      IFS=: read -r model batch res precision <<<"$s"
      threads=1
    else
      IFS=: read -r model batch res threads precision <<<"$s"
    fi
    case $model in
      resnet18 | resnet34 | resnet50 | resnet101 | resnet152 | googlenet) ;;
      *) echo "run.sh: setting '$s': model '$model' is not one both gossipgrad and torchvision build (resnet18, resnet34, resnet50, resnet101, resnet152, googlenet)" >&2; exit 2 ;;
    esac
    gg_int "BATCH of '$s'" "$batch" 1 4096
    gg_int "RES of '$s'" "$res" 32 1024
    gg_int "THREADS of '$s'" "$threads" 1 1024
    [[ " $precisions " == *" ${precision:-fp32} "* ]] ||
      { echo "run.sh: setting '$s': precision '$precision' is not one of: $precisions" >&2; exit 2; }
  done
}
if [ "${1:-}" = "--backend" ]; then
  BACKEND="${2:?--backend needs a value}"
  shift 2
  [ "$BACKEND" = "cuda" ] || [ "$BACKEND" = "onednn" ] || {
    echo "run.sh: --backend must be onednn or cuda" >&2
    exit 2
  }
else
  BACKEND=onednn
fi
if [ "$BACKEND" = "cuda" ]; then
  SETTINGS=("${@:-resnet50:256:224:tf32 resnet50:256:224:bf16 googlenet:256:224:tf32 googlenet:256:224:bf16}")
  read -r -a SETTINGS <<<"${SETTINGS[*]}"
  check_settings "tf32 bf16 fp32" "${SETTINGS[@]}"
  REPEATS=${REPEATS:-3}
  STEPS=${STEPS:-20}
  WARMUP=${WARMUP:-5}
  gg_int REPEATS "$REPEATS" 1
  gg_int STEPS "$STEPS" 1
  gg_int WARMUP "$WARMUP" 0
  PYTHON=${PYTHON:-python3}
  BUILD=${BUILD:-build}
  if [ ! -x "$BUILD/bench/gg_bench_compute" ] || [ "${REBUILD:-1}" = "1" ]; then
    cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF -DGG_BENCH=ON \
      -DGG_CUDA=ON >/dev/null
    cmake --build "$BUILD" --target gg_bench_compute
  fi
  "$PYTHON" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' || {
    echo "run.sh: $PYTHON has no CUDA-enabled torch" >&2
    exit 1
  }
  OUT=bench/results/compute-cuda-$(hostname)
  mkdir -p bench/results
  echo "impl,model,batch,res,threads,precision,median_step_s,images_per_s,peak_rss_mb,params" >"$OUT.csv"
  {
    echo "# $(date -u +%FT%TZ) $(uname -srm), $(nproc) cores"
    echo "# GPU: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)"
    echo "# torch: $("$PYTHON" -c 'import torch; print(torch.__version__, "CUDA", torch.version.cuda, "cuDNN", torch.backends.cudnn.version())')"
    echo "# repeats=$REPEATS steps=$STEPS warmup=$WARMUP; PyTorch channels_last, cudnn.benchmark"
  } >"$OUT.txt"
  for s in "${SETTINGS[@]}"; do
    IFS=: read -r model batch res precision <<<"$s"
    args=(--model "$model" --batch "$batch" --res "$res" --threads 1 --steps "$STEPS" --warmup "$WARMUP"
      --precision "$precision")
    for ((r = 1; r <= REPEATS; r++)); do
      # Ours at its best (channels-last, fused, the step a CUDA graph) and channels-first as before.
      # The graph is captured in the second warm-up step: at least 2 of them.
      for how in "--layout nhwc --graph on --warmup $((WARMUP < 2 ? 2 : WARMUP))" "--layout native"; do
        # shellcheck disable=SC2086 # the options are words
        "$BUILD/bench/gg_bench_compute" "${args[@]}" --backend cuda $how \
          2>>"$OUT.txt" | tee -a "$OUT.txt" >>"$OUT.csv"
      done
      "$PYTHON" bench/compute/torch_bench.py "${args[@]}" --device cuda --channels-last 2>>"$OUT.txt" |
        tee -a "$OUT.txt" >>"$OUT.csv"
      # torch.compile compiles in the warm-up steps: at least 2 of them.
      "$PYTHON" bench/compute/torch_bench.py "${args[@]}" --warmup "$((WARMUP < 2 ? 2 : WARMUP))" \
        --device cuda --channels-last --compile 2>>"$OUT.txt" | tee -a "$OUT.txt" >>"$OUT.csv"
      # PyTorch in NCHW (our layout) once per setting: how much of a gap is the layout.
      if ((r == 1)); then
        "$PYTHON" bench/compute/torch_bench.py "${args[@]}" --device cuda 2>>"$OUT.txt" |
          tee -a "$OUT.txt" >>"$OUT.csv"
      fi
    done
  done
  "$PYTHON" - "$OUT.csv" <<'PY' >"$OUT.md"
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1])))
key = lambda r: (r["model"], r["batch"], r["res"], r["precision"])
print("| model | batch | res | precision | gossipgrad NHWC img/s | gossipgrad NCHW img/s "
      "| PyTorch channels_last eager img/s | torch.compile img/s | NHWC / eager | NHWC / compiled "
      "| PyTorch NCHW img/s |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
med = lambda v: statistics.median(v) if v else float("nan")
for k in dict.fromkeys(key(r) for r in rows):
    pick = lambda f: [float(r["images_per_s"]) for r in rows if key(r) == k and f(r["impl"])]
    nhwc = med(pick(lambda i: i.startswith("gossipgrad-cuda-nhwc")))
    nchw = med(pick(lambda i: i == "gossipgrad-cuda"))
    eager = med(pick(lambda i: i.startswith("pytorch") and i.endswith("channels_last")))
    compiled = med(pick(lambda i: i.startswith("pytorch") and "channels_last" in i and
                        i.endswith("compiled")))
    torch_nchw = med(pick(lambda i: i.startswith("pytorch") and "channels_last" not in i))
    print(f"| {' | '.join(k)} | {nhwc:.1f} | {nchw:.1f} | {eager:.1f} | {compiled:.1f} "
          f"| {nhwc / eager:.2f} | {nhwc / compiled:.2f} | {torch_nchw:.1f} |")
PY
  cat "$OUT.md"
  echo "bench/compute: wrote $OUT.csv, $OUT.md (raw output in $OUT.txt)"
  exit 0
fi
SETTINGS=("${@:-resnet50:16:224:2 googlenet:16:224:2 resnet50:16:64:2 googlenet:16:64:2 resnet50:16:224:2:bf16 googlenet:16:224:2:bf16 resnet50:16:64:2:bf16 googlenet:16:64:2:bf16}")
read -r -a SETTINGS <<<"${SETTINGS[*]}"
check_settings "fp32 bf16" "${SETTINGS[@]}"
REPEATS=${REPEATS:-3}
STEPS=${STEPS:-10}
WARMUP=${WARMUP:-3}
gg_int REPEATS "$REPEATS" 1
gg_int STEPS "$STEPS" 1
gg_int WARMUP "$WARMUP" 0
gg_name NAME "${NAME:=compute-$(hostname)}"
TORCH=${TORCH:-2.15}
gg_torch_check
[[ ${ONEDNN:-debian} =~ ^(debian|3\.7)$ ]] ||
  { echo "run.sh: ONEDNN = '$ONEDNN' must be debian (Debian's 2.6.3) or 3.7 (bench/onednn_env.sh)" >&2; exit 2; }
./scripts/deps.sh
# torch.compile's cache, one per ATen instruction-set cap: a kernel compiled uncapped and reused
# under ATEN_CPU_CAPABILITY=avx2 gave garbage indices in ResNet-50's backward (PyTorch 2.15).
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-${TMPDIR:-/tmp}/gossipgrad-inductor-${ATEN_CPU_CAPABILITY:-native}}
if ! /usr/bin/python3 -c 'import torch, torchvision' 2>/dev/null; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    python3-torch python3-torchvision >/dev/null
fi
# Debian's PyTorch calls the system BLAS (libblas.so.3) for its fully connected layers: the
# reference BLAS unless OpenBLAS is installed, which is what a user does.
if ! dpkg-query -W -f '${Status}' libopenblas0-pthread 2>/dev/null | grep -q "ok installed"; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    libopenblas0-pthread >/dev/null
fi
case ${ONEDNN:-debian} in
  debian) GGB=build DNNL_ARGS=() ;;
  3.7) GGB=build-onednn3 DNNL_ARGS=("-Ddnnl_DIR=$(bench/onednn_env.sh)") ;;
esac
TORCH_PY=$(gg_torch_python)
cmake -S . -B "$GGB" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF -DGG_BENCH=ON \
  "${DNNL_ARGS[@]}" >/dev/null
cmake --build "$GGB" --target gg_bench_compute gg_bench_peak gossipgrad
OUT=bench/results/$NAME
mkdir -p bench/results
echo "impl,model,batch,res,threads,precision,median_step_s,images_per_s,peak_rss_mb,params" >"$OUT.csv"
{
  echo "# $(date -u +%FT%TZ) $(uname -srm), $(nproc) cores: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
  echo "# flags: $(grep -m1 '^flags' /proc/cpuinfo | grep -o 'avx512[a-z_0-9]*\|avx2\|amx[a-z_0-9]*' | sort -u | xargs)"
  echo "# instruction sets capped: ONEDNN_MAX_CPU_ISA=${ONEDNN_MAX_CPU_ISA:-none} ATEN_CPU_CAPABILITY=${ATEN_CPU_CAPABILITY:-none}"
  echo "# oneDNN: $(ldd "$GGB/bench/gg_bench_compute" | awk '/libdnnl/ {print $3}' | xargs readlink -f), torch: $("$TORCH_PY" -c 'import torch; print(torch.__version__)') ($TORCH_PY), libblas.so.3: $(readlink -f /usr/lib/x86_64-linux-gnu/libblas.so.3)"
  echo "# repeats=$REPEATS steps=$STEPS warmup=$WARMUP; PyTorch: default (NCHW, fp32, eager), channels_last eager and compiled (bf16 rows under autocast bf16)"
} >"$OUT.txt"
# The ceiling of each (threads, precision): oneDNN's best training convolution (gg_bench_peak),
# and beside it the instruction peak (register-only FMA / bf16 dot products), the bound on any kernel.
echo "threads,precision,ceiling_gflops,instruction_gflops" >"$OUT.peak.csv"
for s in "${SETTINGS[@]}"; do
  IFS=: read -r model batch res threads precision <<<"$s"
  precision=${precision:-fp32}
  grep -q "^$threads,$precision," "$OUT.peak.csv" && continue
  OMP_NUM_THREADS=$threads "$GGB"/bench/gg_bench_peak --threads "$threads" --precision "$precision" |
    tee -a "$OUT.txt" | awk -F, -v t="$threads" -v p="$precision" '
      $1 == "instruction_peak" { ip = $5 }
      $1 == "ceiling" { print t "," p "," $5 "," ip }' >>"$OUT.peak.csv"
done
# Forward FLOPs per image (direct count, multiply-add = 2) of each model and resolution, and a
# training step's useful FLOPs per image (padding taps and the input's gradient left out).
echo "model,res,forward_flops,training_useful_flops" >"$OUT.flops.csv"
for s in "${SETTINGS[@]}"; do
  IFS=: read -r model batch res threads precision <<<"$s"
  grep -q "^$model,$res," "$OUT.flops.csv" && continue
  f=$("$GGB"/gossip/gossipgrad info --model "$model" --input "3,$res,$res" --classes 1000 --json |
    /usr/bin/python3 -c 'import json, sys; d = json.load(sys.stdin)
print(d["forward_flops"], 2 * d["training_useful_macs"], sep=",")')
  echo "$model,$res,$f" >>"$OUT.flops.csv"
done
# The floor of each setting: the model's own convolution and fully connected shapes timed alone
# at oneDNN's best, plus the SGD update (gg_bench_peak --model). Measured once per repeat, just
# before that repeat's steps, so that it drifts with them (this VM's speed moves by up to 25%
# within minutes); the tables use the median of the repeats' floors.
echo "model,batch,res,threads,precision,repeat,floor_ms" >"$OUT.floor.csv"
for s in "${SETTINGS[@]}"; do
  IFS=: read -r model batch res threads precision <<<"$s"
  precision=${precision:-fp32}
  args=(--model "$model" --batch "$batch" --res "$res" --threads "$threads" --steps "$STEPS"
    --warmup "$WARMUP")
  for ((r = 1; r <= REPEATS; r++)); do
    export OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads
    "$GGB"/bench/gg_bench_peak --model "$model" --res "$res" --batch "$batch" --threads "$threads" \
      --precision "$precision" --seconds 0.05 | tee -a "$OUT.txt" |
      awk -F, -v k="$model,$batch,$res,$threads,$precision,$r" '$1 == "floor" { print k "," $NF }' \
        >>"$OUT.floor.csv"
    "$GGB"/bench/gg_bench_compute "${args[@]}" --precision "$precision" | tee -a "$OUT.txt" >>"$OUT.csv"
    # PyTorch's default (NCHW, fp32, eager: the reference column), and channels_last at this
    # precision, eager and (PyTorch 2.x) compiled: its best is the faster of the two.
    "$TORCH_PY" bench/compute/torch_bench.py "${args[@]}" | tee -a "$OUT.txt" >>"$OUT.csv"
    "$TORCH_PY" bench/compute/torch_bench.py "${args[@]}" --channels-last \
      --precision "$precision" | tee -a "$OUT.txt" >>"$OUT.csv"
    [ "$TORCH" = debian ] ||
      "$TORCH_PY" bench/compute/torch_bench.py "${args[@]}" --channels-last --compile \
        --precision "$precision" | tee -a "$OUT.txt" >>"$OUT.csv"
  done
done
# The machine first: every figure below is this CPU's (and, when capped, that instruction set's).
{
  echo "Machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores, $(date -u +%F);" \
    "oneDNN capped to ${ONEDNN_MAX_CPU_ISA:-none}, PyTorch's ATen to ${ATEN_CPU_CAPABILITY:-none}" \
    "(raw output and flags: $NAME.txt)."
  echo
} >"$OUT.md"
/usr/bin/python3 - "$OUT" <<'PY' >>"$OUT.md"
import csv, statistics, sys
out = sys.argv[1]
rows = list(csv.DictReader(open(out + ".csv")))
peaks = list(csv.DictReader(open(out + ".peak.csv")))
ceiling = {(r["threads"], r["precision"]): float(r["ceiling_gflops"]) for r in peaks}
instr = {(r["threads"], r["precision"]): float(r["instruction_gflops"])
         for r in peaks if r.get("instruction_gflops")}
flop_rows = list(csv.DictReader(open(out + ".flops.csv")))
flops = {(r["model"], r["res"]): float(r["forward_flops"]) for r in flop_rows}
useful = {(r["model"], r["res"]): float(r["training_useful_flops"])
          for r in flop_rows if r.get("training_useful_flops")}
setting = lambda r: (r["model"], r["batch"], r["res"], r["threads"])
med = lambda rs: statistics.median(float(r["images_per_s"]) for r in rs)
keys = list(dict.fromkeys(setting(r) + (r["precision"],) for r in rows
                          if r["impl"].startswith("gossipgrad")))
versions = sorted({r["impl"].split("-")[1] for r in rows if r["impl"].startswith("pytorch-")})
print(f"PyTorch {', '.join(versions)}: eager and compiled (torch.compile of the model and the "
      "optimizer step) in channels_last at the row's precision; best = the faster of the two.")
print()
print("| model | batch | res | threads | precision | gossipgrad img/s | PyTorch default (NCHW fp32) "
      "| PyTorch eager (channels_last) | PyTorch compiled (channels_last) | vs best | vs default "
      "| gossipgrad share of ceiling | PyTorch best share | gossipgrad peak MB "
      "| PyTorch best peak MB |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
floor_runs = {}
for r in csv.DictReader(open(out + ".floor.csv")):
    k = tuple(r[c] for c in ("model", "batch", "res", "threads", "precision"))
    floor_runs.setdefault(k, []).append(float(r["floor_ms"]))
floors = {k: statistics.median(v) for k, v in floor_runs.items()}
bounds = []
for k in keys:
    ours = [r for r in rows if r["impl"].startswith("gossipgrad") and setting(r) + (r["precision"],) == k]
    default = [r for r in rows if r["impl"].startswith("pytorch") and "channels_last" not in r["impl"]
               and setting(r) == k[:4]]
    eager = [r for r in rows if r["impl"].endswith("-channels_last") and setting(r) + (r["precision"],) == k]
    compiled = [r for r in rows if r["impl"].endswith("-channels_last-compiled")
                and setting(r) + (r["precision"],) == k]
    if not ours or not default or not eager:
        continue
    best = compiled if compiled and med(compiled) > med(eager) else eager
    a, d, b = med(ours), med(default), med(best)
    e, cm = med(eager), (f"{med(compiled):.2f}" if compiled else "–")
    # Training FLOPs per image: 3 x the forward's (forward, backward-data, backward-weights).
    c = ceiling.get((k[3], k[4]))
    f = flops.get((k[0], k[2]))
    share = lambda ips: f"{3 * f * ips / 1e9 / c:.0%}" if c and f else ""
    # The bound: images/s if a step's useful multiply-adds all ran at the instruction peak and
    # nothing else took time, over PyTorch's best; only Winograd (fp32) does less work.
    ip, u = instr.get((k[3], k[4])), useful.get((k[0], k[2]))
    bound = f"{ip * 1e9 / u / b:.2f}x" if ip and u else ""
    # The floor: the step if it were only the model's convolutions and FC layers at oneDNN's
    # best alone, and the SGD update; no step built on oneDNN's kernels beats PyTorch by more.
    fl = floors.get(k)
    step, best_step = int(k[1]) / a * 1e3, int(k[1]) / b * 1e3
    # Each repeat's step over the floor measured just before it: the pairs drift together.
    paired = [float(r["median_step_s"]) * 1e3 / f for r, f in zip(ours, floor_runs.get(k, []))]
    pair = (f"{statistics.median(paired):.2f}x ({min(paired):.2f}-{max(paired):.2f})"
            if paired else "")
    bounds.append(f"| {' | '.join(k)} | {step:.0f} | {best_step:.0f} | "
                  + (f"{fl:.0f} | {fl / step:.0%} | {pair} | {best_step / fl:.2f}x" if fl else " | | | ")
                  + f" | {bound} |")
    mo = max(float(r["peak_rss_mb"]) for r in ours)
    mb = max(float(r["peak_rss_mb"]) for r in best)
    print(f"| {' | '.join(k)} | {a:.2f} | {d:.2f} | {e:.2f} | {cm} | {a / b:.2f}x | {a / d:.2f}x "
          f"| {share(a)} | {share(b)} | {mo:.0f} | {mb:.0f} |")
print()
print("Ceiling: oneDNN's best training convolution (forward + backward-data + backward-weights, "
      "direct algorithm, ResNet-50 shapes at batch 16) on this CPU with the same threads: "
      + ", ".join(f"{t} threads {p} {g:.0f} GFLOP/s" for (t, p), g in ceiling.items())
      + ". A model's share counts 3 x its forward FLOPs per image (direct count; Winograd does "
      "fewer, so a share can exceed what the direct count allows). Instruction peak (every thread "
      "issuing independent FMAs, 512-bit on AVX-512 and 256-bit on AVX2, or bf16 dot products, "
      "on registers): "
      + ", ".join(f"{t} threads {p} {g:.0f} GFLOP/s" for (t, p), g in instr.items())
      + ". Bound vs best: the images/s of a step whose useful multiply-adds (forward, "
      "backward-weights and backward-data of every convolution and FC layer, without the taps on "
      "zero padding and without the input's gradient: `gossipgrad info`'s training_useful_macs) "
      "all ran at the instruction peak with nothing else in the step, over PyTorch's best: no "
      "implementation doing that work (every algorithm but Winograd, which oneDNN has for fp32 "
      "only) can beat PyTorch by more.")
print()
print("What bounds each row (ms per step, medians above): the floor (the median of one "
      "measurement per repeat, each just before that repeat's steps) is the model's own "
      "convolution and fully connected shapes, each pass timed alone at the best of oneDNN's "
      "algorithms and layouts (gg_bench_peak --model; warm caches, no batch norm, pooling or "
      "reorders), plus the SGD update over its parameters: no step built on oneDNN's kernels "
      "goes below it, and none beats PyTorch's best by more than PyTorch's step over it.")
print()
print("| model | batch | res | threads | precision | gossipgrad step | PyTorch best step | floor "
      "| floor / gossipgrad step | gossipgrad step / floor, paired by repeat: median (range) "
      "| PyTorch best / floor | bound vs best (instruction peak) |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
print("\n".join(bounds))
PY
cat "$OUT.md"
echo "bench/compute: wrote $OUT.csv, $OUT.md (raw output in $OUT.txt)"
