#!/usr/bin/env python3
"""bench/scale: gossip's gap to allreduce against the length of the run.

Usage: length.py MODE CSV...  (the CSVs table.py wrote, one per run length of the same recipe)

For every rank count p and number of steps in the CSVs: the mean top-1 of allreduce and of MODE
over the seeds both were run with, their difference paired by seed (each seed's in brackets),
and, from one length to the next, the factor by which the mean difference shrank. When the last
two lengths shrank it, the number of steps at which the same factor per doubling would bring the
difference to within 0.5 points: a projection from two points, printed as one, not a measurement.
The same (p, steps, mode, seed) in two CSVs is refused: the CSVs do not record the recipe
(learning rate, width, ...), so runs of two recipes at one length could not be told apart.
"""
import csv, math, statistics, sys

if len(sys.argv) < 3:
    sys.exit("usage: length.py MODE CSV...  (CSVs written by bench/scale/table.py)")
mode, files = sys.argv[1], sys.argv[2:]
runs = {}  # (p, steps, mode, seed) -> top-1
for path in files:
    try:
        rows = list(csv.DictReader(open(path)))
    except OSError as e:
        sys.exit(f"length.py: cannot read {path}: {e.strerror}")
    for r in rows:
        try:
            key = (int(r["p"]), int(r["steps"]), r["mode"], int(r["seed"]))
            top1 = float(r["top1"])
        except (KeyError, TypeError, ValueError):
            sys.exit(f"length.py: {path} is not a CSV of bench/scale/table.py (columns p, steps, "
                     "mode, seed, top1)")
        if key in runs:
            sys.exit(f"length.py: p = {key[0]}, {key[1]} steps, {key[2]}, seed {key[3]} is in two "
                     "of the CSVs: pass one CSV per run length")
        runs[key] = top1
if mode == "allreduce":
    sys.exit("length.py: MODE is the gossip mode compared with allreduce, not allreduce itself")
modes = sorted({k[2] for k in runs})
if mode not in modes:
    sys.exit(f"length.py: no run of mode {mode} in the CSVs (they hold: {', '.join(modes)})")

print(f"| p | steps | allreduce | {mode} | difference, same seeds | seeds | shrank by |")
print("|---|---|---|---|---|---|---|")
for p in sorted({k[0] for k in runs}):
    gaps = []  # (steps, mean difference in points)
    for steps in sorted({k[1] for k in runs if k[0] == p}):
        seeds = sorted(s for (pp, st, m, s) in runs
                       if (pp, st, m) == (p, steps, mode) and (p, steps, "allreduce", s) in runs)
        if not seeds:
            continue
        a = [100 * runs[(p, steps, "allreduce", s)] for s in seeds]
        g = [100 * runs[(p, steps, mode, s)] for s in seeds]
        d = [y - x for x, y in zip(a, g)]
        gap = statistics.mean(d)
        shrank = f"{gaps[-1][1] / gap:.2f}x" if gaps and gap != 0 else ""
        gaps.append((steps, gap))
        each = f" ({', '.join(f'{x:+.2f}' for x in d)})" if len(d) > 1 else ""
        print(f"| {p} | {steps} | {statistics.mean(a):.2f} | {statistics.mean(g):.2f} | "
              f"{gap:+.2f}{each} | {len(seeds)} | {shrank} |")
    if len(gaps) >= 2:
        (s0, g0), (s1, g1) = gaps[-2], gaps[-1]
        if g1 > -0.5:
            print(f"\np = {p}: within 0.5 points of allreduce at {s1} steps ({g1:+.2f}).")
        elif g0 < g1 < 0 and s1 > s0:
            # |gap| ~ steps^-a through the last two lengths; where does it reach 0.5?
            a = math.log(g0 / g1) / math.log(s1 / s0)
            need = s1 * (g1 / -0.5) ** (1 / a)
            print(f"\np = {p}: from {s0} to {s1} steps the difference shrank "
                  f"{g0 / g1:.2f}x per {s1 / s0:g}x the steps; at that rate it would reach -0.5 "
                  f"at about {need:.0f} steps (a projection from two lengths).")
        else:
            print(f"\np = {p}: the difference did not shrink from {s0} to {s1} steps "
                  f"({g0:+.2f} -> {g1:+.2f}): no projection.")
