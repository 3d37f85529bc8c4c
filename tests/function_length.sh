#!/usr/bin/env bash
# No function in gossip/ is longer than 60 lines (issue 29), from its first signature line to its
# closing brace, as universal-ctags sees them (line: and end: of each function definition). A
# lambda counts within the function that holds it; one outside any function counts on its own.
# Prints each offender (lines, file:line, name) and exits 1; exits 0 with a one-line summary
# otherwise, 77 (skipped) without universal-ctags.
#
# usage: function_length.sh [ROOT] [MAX_LINES]
set -euo pipefail
ROOT="${1:-$(dirname "$0")/..}"
MAX="${2:-60}"
cd "$ROOT"
if ! ctags --version 2>/dev/null | grep -q "Universal Ctags"; then
  echo "skip: universal-ctags is not installed"
  exit 77
fi
mapfile -t files < <(find gossip -name '*.cpp' -o -name '*.hpp' -o -name '*.cu' | sort)
((${#files[@]})) || { echo "FAIL: no sources under $ROOT/gossip"; exit 1; }
# One line per function definition: "<lines> <file>:<line> <scope::name>".
report=$(ctags --languages=C++ --map-C++=+.cu --c++-kinds=f --fields=+neKZ -o - "${files[@]}" |
  awk -F'\t' -v max="$MAX" '
    {
      name = $1; file = $2; line = end = 0; scope = ""; nested = 0
      for (i = 4; i <= NF; i++) {
        split($i, kv, ":"); key = kv[1]; value = substr($i, length(key) + 2)
        if (key == "line") line = value
        else if (key == "end") end = value
        else if (key == "scope") {
          if (value ~ /^function:/) nested = 1
          sub(/^[a-z]*:/, "", value); gsub(/__anon[0-9a-f]+/, "(anonymous)", value); scope = value
        }
      }
      if (name ~ /^__anon/) { if (nested) next; name = "(lambda)" }
      if (line == 0 || end == 0) { printf "FAIL %s:%s %s: ctags gave no end line\n", file, line, name; next }
      n = end - line + 1
      total++
      if (n > max) printf "%d %s:%d %s%s\n", n, file, line, (scope == "" ? "" : scope "::"), name
    }
    END { printf "TOTAL %d\n", total }')
if grep -q '^FAIL' <<<"$report"; then
  grep '^FAIL' <<<"$report"
  exit 1
fi
total=$(sed -n 's/^TOTAL //p' <<<"$report")
offenders=$(grep -v '^TOTAL ' <<<"$report" | sort -k1,1nr -k2,2 || true)
((total > 0)) || { echo "FAIL: ctags found no function in gossip/"; exit 1; }
if [ -n "$offenders" ]; then
  echo "function length: $(wc -l <<<"$offenders") of $total functions in gossip/ are over $MAX lines:"
  echo "$offenders" | awk '{ printf "%5d lines  %s  %s\n", $1, $2, $3 }'
  exit 1
fi
echo "function length: all $total functions in gossip/ are at most $MAX lines"
