#!/usr/bin/env bash
# `gossipgrad partners`: the JSON is exactly the documented object and every schedule in it is
# checked against an independent Python model (permutations, inverse send/recv, the docs/gossip.md
# formulas, the diffusion step count); the table agrees with it; usage errors exit 2 with one line.
set -uo pipefail
BIN="$1"
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
fail=0

# The JSON cases are collected (one line of arguments each) and run and checked by one Python
# process: a Python start per case was half of this test's time.
cases=()
check_json() { cases+=("$*"); }

for p in 1 2 3 5 8 12 16 31 64; do
  for s in dissemination ring random; do
    check_json --ranks "$p" --schedule "$s" --steps $((2 * p + 8))
    check_json --ranks "$p" --schedule "$s" --steps $((2 * p + 8)) --rotate --seed 7
  done
done
for p in 1 2 4 8 32 64; do
  check_json --ranks "$p" --schedule hypercube --steps 20
  check_json --ranks "$p" --schedule hypercube --steps 20 --rotate
done
check_json --ranks 13                                   # default: one round of steps
check_json --ranks 1 --schedule random
check_json --ranks 200 --schedule ring --steps 250      # diffusion takes 199 steps
check_json --ranks 1000 --schedule dissemination --steps 3
printf '%s\n' "${cases[@]}" >"$TMP/cases.txt"
python3 - "$BIN" "$TMP/cases.txt" <<'PY' || fail=1
import json, subprocess, sys

def check(text, args):
    def opt(name, default):
        return args[args.index(name) + 1] if name in args else default
    p = int(opt("--ranks", None))
    kind = opt("--schedule", "dissemination")
    rotate = "--rotate" in args
    R = max(1, (p - 1).bit_length())  # ceil(log2 p), at least 1
    steps = int(opt("--steps", R))

    assert text.endswith("\n") and text.count("\n") == 1, "one line of JSON"
    doc = json.loads(text)
    assert list(doc) == ["ranks", "schedule", "steps", "diffusion_steps"], list(doc)
    assert doc["ranks"] == p and doc["schedule"] == kind
    assert isinstance(doc["diffusion_steps"], int)
    assert len(doc["steps"]) == steps, (len(doc["steps"]), steps)
    for t, st in enumerate(doc["steps"]):
        assert list(st) == ["step", "send_to", "recv_from"], list(st)
        assert st["step"] == t
        send, recv = st["send_to"], st["recv_from"]
        assert sorted(send) == list(range(p)) and sorted(recv) == list(range(p)), "permutation"
        for v in range(p):
            assert recv[send[v]] == v, "recv_from inverts send_to"
            assert p == 1 or send[v] != v, "self-send"
        if kind == "hypercube":
            assert send == recv
        if not rotate:
            k = t % R
            for v in range(p):
                if p == 1:
                    want = (0, 0)
                elif kind == "dissemination":
                    want = ((v + 2**k) % p, (v - 2**k) % p)
                elif kind == "hypercube":
                    want = (v ^ 2**k, v ^ 2**k)
                elif kind == "ring":
                    want = ((v + 1) % p, (v - 1) % p)
                else:
                    continue
                assert (send[v], recv[v]) == want, (t, v, send[v], recv[v], want)

    # Diffusion from the printed schedule: reach[v] is a bitmask of the ranks whose start value has
    # arrived at v; x_v <- (x_v + x_recv_from(v)) / 2 merges the masks.
    full = (1 << p) - 1
    reach = [1 << v for v in range(p)]
    d = 0 if all(r == full for r in reach) else None
    for t, st in enumerate(doc["steps"]):
        if d is not None:
            break
        reach = [reach[v] | reach[st["recv_from"][v]] for v in range(p)]
        if all(r == full for r in reach):
            d = t + 1
    if d is None:
        assert doc["diffusion_steps"] == -1 or doc["diffusion_steps"] > steps, doc["diffusion_steps"]
    else:
        assert doc["diffusion_steps"] == d, (doc["diffusion_steps"], d)
    if kind == "dissemination":
        assert 0 <= doc["diffusion_steps"] <= (p - 1).bit_length()

bad = 0
for line in open(sys.argv[2]):
    args = line.split()
    r = subprocess.run([sys.argv[1], "partners", *args, "--json"], capture_output=True, text=True)
    if r.returncode != 0:
        print(f"FAIL: partners {line.strip()} --json exited non-zero: {r.stderr.strip()}")
        bad = 1
        continue
    try:
        check(r.stdout, args)
        print(f"ok: partners {line.strip()} --json")
    except Exception as e:  # a failed assertion, or output that is not the documented JSON
        print(f"FAIL: partners {line.strip()} --json: {e!r}")
        bad = 1
sys.exit(bad)
PY

# Same seed, same schedule; another seed, another one.
a=$("$BIN" partners --ranks 12 --schedule random --steps 6 --json)
b=$("$BIN" partners --ranks 12 --schedule random --steps 6 --json)
c=$("$BIN" partners --ranks 12 --schedule random --steps 6 --seed 2 --json)
[ "$a" = "$b" ] || { echo "FAIL: random schedule is not reproducible"; fail=1; }
[ "$a" != "$c" ] || { echo "FAIL: random schedule ignores --seed"; fail=1; }

# The table: a header, one row per step, the summary naming the same diffusion count as the JSON.
"$BIN" partners --ranks 8 --steps 5 >"$TMP/table" || { echo "FAIL: table"; fail=1; }
rows=$(grep -cE '^ +[0-9]+  0->' "$TMP/table")
[ "$rows" -eq 5 ] || { echo "FAIL: table has $rows step rows, want 5"; cat "$TMP/table"; fail=1; }
grep -q '^ *2  0->4 1->5 2->6 3->7 4->0 5->1 6->2 7->3$' "$TMP/table" ||
  { echo "FAIL: table row for step 2"; cat "$TMP/table"; fail=1; }
grep -q 'after 3 steps' "$TMP/table" || { echo "FAIL: table summary"; cat "$TMP/table"; fail=1; }
"$BIN" partners --ranks 5000 --schedule random --rotate >"$TMP/wide" || { echo "FAIL: wide"; fail=1; }
awk 'length > 120 { bad = 1 } END { exit bad }' "$TMP/wide" ||
  { echo "FAIL: rows of a wide schedule are not trimmed"; fail=1; }
"$BIN" partners --help | grep -q -- "--schedule" || { echo "FAIL: partners --help"; fail=1; }

expect() {  # expect NAME PATTERN -- ARGS...
  local name="$1" pattern="$2"; shift 3
  "$BIN" "$@" >"$TMP/out" 2>"$TMP/err"; local rc=$?
  local lines; lines=$(wc -l <"$TMP/err")
  if [ "$rc" -ne 2 ] || [ "$lines" -ne 1 ] || [ -s "$TMP/out" ] || ! grep -q -- "$pattern" "$TMP/err"; then
    echo "FAIL: $name: exit $rc, $lines stderr lines:"; cat "$TMP/err" "$TMP/out"; fail=1
  else
    echo "ok: $name -> $(cat "$TMP/err")"
  fi
}
expect "unknown schedule" "valid: dissemination, hypercube, ring, random" -- partners --ranks 4 --schedule star
expect "hypercube on 6 ranks" "power-of-two rank count, got p=6" -- partners --ranks 6 --schedule hypercube
expect "zero ranks" "ranks 0" -- partners --ranks 0
expect "too many ranks" "ranks 65537" -- partners --ranks 65537
expect "missing ranks" "ranks" -- partners --schedule ring
expect "ranks not a number" "ranks" -- partners --ranks lots
expect "zero steps" "steps 0" -- partners --ranks 4 --steps 0
expect "too many steps" "steps 100001" -- partners --ranks 4 --steps 100001
expect "bad seed" "seed" -- partners --ranks 4 --seed -3
expect "unknown option" "bogus" -- partners --ranks 4 --bogus
exit $fail
