#!/usr/bin/env bash
# The options' strings are read in gossip/config only (issue 29): no code elsewhere compares an
# option's value with a string literal. Fixed-choice options are enums (issue 55), which a string
# cannot be compared with at all; this keeps the free-form ones (c.gossip.mode, c.data.source,
# c_.checkpoint.resume, ...) behind config's typed view (mixing_of, data_source, resume_auto,
# ...). Fails with the offending lines.
set -euo pipefail
ROOT="${1:-$(dirname "$0")/..}"
cd "$ROOT"
sections='data|model|train|gossip|apoptosis|checkpoint|guard|fault|log|network|emulate|simulate'
pattern="\\b(c|c_|cfg|config)(\\.|->)($sections)\\.[a-z_]+ *(==|!=) *\""
found=$(grep -rnE "$pattern" gossip bench --include='*.cpp' --include='*.hpp' |
  grep -v '^gossip/config/' || true)
if [ -n "$found" ]; then
  echo "option strings compared outside gossip/config (use its typed view):"
  echo "$found"
  exit 1
fi
# The check can fail: the same pattern finds the comparisons config itself makes.
grep -rqE "$pattern" gossip/config || { echo "FAIL: the pattern matches nothing in gossip/config"; exit 1; }
echo "option strings: compared in gossip/config only"
