# shellcheck shell=bash
# bench/compute/common.sh: sourced by the bench/compute scripts (from the repository root).
# build_bench DIR TARGET...: brings TARGETs in build directory DIR up to date: configured once
# (Release, benchmarks on, tests off) and rebuilt on every call, which does nothing when nothing
# changed, so that no script times a binary older than the source. Build output goes to stderr.
build_bench() {
  local dir=$1
  shift
  [ -f "$dir/build.ninja" ] ||
    cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF -DGG_BENCH=ON >&2
  cmake --build "$dir" --target "$@" >&2
}
# tool_reason FILE: why a tool failed, from its stderr kept in FILE: our tools' first line naming
# themselves (gg_bench_...: a usage text may follow it), else the last line, where a Python
# traceback ends.
tool_reason() {
  grep -m1 '^gg_bench' "$1" || tail -n 1 "$1"
}
