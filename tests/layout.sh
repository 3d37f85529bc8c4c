#!/usr/bin/env bash
# The modules' dependencies point one way (docs/layout.md): every #include "X/..." of
# a module's sources names the module itself or one it may use. Fails with the offending lines.
set -euo pipefail
ROOT="${1:-$(dirname "$0")/..}"
cd "$ROOT"
declare -A ALLOWED=(
  [partners]=""
  [kernels]=""
  [shuffle]="partners"
  [gossip/comm]="partners kernels shuffle"
  [gossip/config]="partners kernels shuffle gossip/comm"
  [gossip/resilience]="partners kernels shuffle gossip/comm gossip/config"
  [gossip/train]="partners kernels shuffle gossip/comm gossip/config gossip/resilience"
  [gossip/cli]="partners kernels shuffle gossip/comm gossip/config gossip/resilience gossip/train"
)
bad=0
checked=0
for module in "${!ALLOWED[@]}"; do
  allowed=" $module ${ALLOWED[$module]} "
  while IFS= read -r -d '' f; do
    checked=$((checked + 1))
    while IFS= read -r inc; do
      target=${inc%%/*}
      [ "$target" = gossip ] && target=$(echo "$inc" | cut -d/ -f1-2)
      case "$allowed" in
        *" $target "*) ;;
        *) echo "layout: $f includes \"$inc\": $module may not depend on $target"; bad=1 ;;
      esac
    done < <(sed -n 's/^#include "\([a-z_]*\/[^"]*\)".*/\1/p' "$f")
  done < <(find "$module" -maxdepth $([ "${module%%/*}" = gossip ] && echo 1 || echo 3) \
             \( -name '*.cpp' -o -name '*.hpp' -o -name '*.cu' \) -print0)
done
# gossip/ holds its sub-folders only: a source file directly under it belongs to no module.
if ls gossip/*.cpp gossip/*.hpp >/dev/null 2>&1; then
  echo "layout: sources directly under gossip/: put them in comm, config, resilience, train or cli"
  bad=1
fi
# train/ reaches MPI through gossip/comm/mpi.hpp's wrappers only (checked calls, bounded waits).
if grep -nE '\bMPI_[A-Za-z_]+' gossip/train/*.cpp gossip/train/*.hpp; then
  echo "layout: raw MPI_ calls in gossip/train: use gossip/comm/mpi.hpp"
  bad=1
fi
[ "$checked" -gt 0 ] || { echo "layout: no sources found under $PWD"; exit 1; }
[ $bad = 0 ] && echo "layout: $checked files, every include follows the module order"
exit $bad
