#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan + UBSan) and runs each for SECONDS (default 10):
# the full-checkpoint readers, the tar shard index, the config reader, the .npz/.npy readers, the
# loader's JPEG path and the idx reader. Seeds: a manifest, a tar archive, the cluster configs,
# .npz archives from Python's zipfile, small JPEGs and idx pairs (fuzz/make_seeds.cpp).
# Usage: fuzz/run.sh [SECONDS]. Exits non-zero on a crash.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH="${1:-10}"
OUT=build-fuzz
mkdir -p "$OUT"
CXX=(clang++ -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -I.)
# The rank state's parts: format 1's fields are read into the parts their owners (the rules' copies,
# the codec's residue) write today.
"${CXX[@]}" fuzz/fuzz_checkpoint.cpp gossip/resilience/full_checkpoint.cpp kernels/durable_file.cpp \
  gossip/comm/state_part.cpp gossip/comm/rules.cpp gossip/comm/mixing.cpp \
  -lxxhash -o "$OUT/fuzz_checkpoint"
# The config reader with what it validates against (model names, data source grammar); what
# concerns this machine (gossip/train/preflight) is not part of it.
"${CXX[@]}" fuzz/fuzz_config.cpp gossip/config/config.cpp gossip/config/options.cpp gossip/config/fault_spec.cpp gossip/config/algorithms.cpp \
  kernels/models.cpp kernels/graph.cpp shuffle/source.cpp shuffle/tar.cpp shuffle/image.cpp shuffle/idx.cpp \
  partners/schedule.cpp \
  -lboost_program_options -larchive -lturbojpeg -lz -o "$OUT/fuzz_config"
"${CXX[@]}" fuzz/fuzz_tar.cpp shuffle/tar.cpp shuffle/source.cpp shuffle/image.cpp shuffle/idx.cpp \
  -larchive -lturbojpeg -lz -o "$OUT/fuzz_tar"
"${CXX[@]}" fuzz/fuzz_npz.cpp kernels/npz.cpp kernels/durable_file.cpp kernels/graph.cpp -larchive \
  -o "$OUT/fuzz_npz"
"${CXX[@]}" fuzz/fuzz_jpeg.cpp shuffle/image.cpp -lturbojpeg -o "$OUT/fuzz_jpeg"
"${CXX[@]}" fuzz/fuzz_idx.cpp shuffle/idx.cpp -lz -o "$OUT/fuzz_idx"
clang++ -std=c++20 -O1 -I. fuzz/make_seeds.cpp shuffle/image.cpp -lturbojpeg -lz -o "$OUT/make_seeds"
rm -rf "$OUT"/seeds-*
mkdir -p "$OUT/seeds-ckpt" "$OUT/seeds-tar" "$OUT/seeds-config" "$OUT/seeds-npz" "$OUT/seeds-jpeg" \
  "$OUT/seeds-idx"
"$OUT/make_seeds" "$OUT/seeds-jpeg" "$OUT/seeds-idx"
cp configs/*.ini "$OUT/seeds-config/"  # every cluster config
# Seeds: a tar with one sample, and a manifest + a small rank state from the unit-test format.
( cd "$OUT" && printf 'img' > k.jpg && printf '3' > k.cls &&
  tar --format=ustar -cf seeds-tar/one.tar k.jpg k.cls && rm k.jpg k.cls )
printf '{"format":"gossipgrad-full-checkpoint","version":1,"step":4,"epoch":0,"ranks":1,' \
  > "$OUT/seeds-ckpt/manifest.json"
printf '"steps_per_epoch":2,"model":{"name":"resnet8","input":[1,28,28],"classes":10,' \
  >> "$OUT/seeds-ckpt/manifest.json"
printf '"width":4,"batch_norm":true},"files":{"rank-00000.bin":{"size":3,"xxh3":"00ff"}}}' \
  >> "$OUT/seeds-ckpt/manifest.json"
# .npz seeds as numpy writes them (stored, deflated, ZIP64 records) and the .npy inside them.
/usr/bin/python3 - "$OUT/seeds-npz" <<'PY'
import sys, zipfile
d = sys.argv[1]
h = "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }"
h += " " * (63 - (10 + len(h)) % 64) + "\n"
npy = b"\x93NUMPY\x01\x00" + len(h).to_bytes(2, "little") + h.encode() + bytes(8)
open(f"{d}/x.npy", "wb").write(npy)
for name, method, zip64 in [("stored", zipfile.ZIP_STORED, False),
                            ("deflated", zipfile.ZIP_DEFLATED, False),
                            ("zip64", zipfile.ZIP_STORED, True)]:
    with zipfile.ZipFile(f"{d}/{name}.npz", "w", method) as z:
        for member in ["w.npy", "b.npy"]:
            with z.open(member, "w", force_zip64=zip64) as f:
                f.write(npy)
PY
for t in checkpoint tar config npz jpeg idx; do
  seeds="$OUT/seeds-$t"; [ $t = checkpoint ] && seeds="$OUT/seeds-ckpt"
  echo "fuzz: $t for ${SECONDS_EACH}s"
  rc=0
  "$OUT/fuzz_$t" -max_total_time="$SECONDS_EACH" -max_len=4096 -print_final_stats=1 \
    -artifact_prefix="$OUT/crash-$t-" "$seeds" > "$OUT/fuzz_$t.log" 2>&1 || rc=$?
  grep -E "stat::number_of_executed_units|ERROR|SUMMARY" "$OUT/fuzz_$t.log" || true
  [ $rc = 0 ] || { echo "fuzz: $t failed (exit $rc), see $OUT/fuzz_$t.log"; exit 1; }
done
