#!/usr/bin/env python3
"""Checks the sample-id logs of `gossipgrad train --log.samples PREFIX` (PREFIX.<rank>, one line
per executed step: "step epoch id id ..."). Every step a rank ran twice (a redo) saw the same
samples; in every epoch checked, the ranks' batches together hold every one of the `count`
samples exactly once; and the number of redone steps is the expected one."""
import argparse
import collections
import glob
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("prefix")
    ap.add_argument("--count", type=int, required=True, help="samples in the data set")
    ap.add_argument("--epochs", type=int, required=True)
    ap.add_argument("--skip-epoch", type=int, action="append", default=[],
                    help="an epoch not checked (the one a forward recovery reshuffled)")
    ap.add_argument("--redone", type=int, default=0, help="expected (rank, step) lines repeated")
    ap.add_argument("--min-ranks", type=int, default=1, help="ranks expected to log at all")
    a = ap.parse_args()
    errors = []
    seen = {}  # (rank, step) -> (epoch, ids)
    redone = 0
    files = sorted(f for f in glob.glob(a.prefix + ".*") if f.rsplit(".", 1)[1].isdigit())
    if len(files) < a.min_ranks:
        sys.exit(f"FAIL: {len(files)} sample logs, expected {a.min_ranks}")
    for path in files:
        rank = int(path.rsplit(".", 1)[1])
        for line in open(path):
            f = line.split()
            step, epoch, ids = int(f[0]), int(f[1]), tuple(int(x) for x in f[2:])
            key = (rank, step)
            if key in seen:
                redone += 1
                if seen[key] != (epoch, ids):
                    errors.append(f"rank {rank} step {step} redone with other samples")
            seen[key] = (epoch, ids)
    per_epoch = collections.defaultdict(collections.Counter)
    for (rank, step), (epoch, ids) in seen.items():
        per_epoch[epoch].update(i for i in ids if i >= 0)
    for e in range(a.epochs):
        if e in a.skip_epoch:
            continue
        c = per_epoch.get(e, collections.Counter())
        twice = sum(1 for n in c.values() if n > 1)
        missing = a.count - len(c)
        if twice or missing or set(c) != set(range(a.count)):
            errors.append(f"epoch {e}: {missing} samples missing, {twice} seen more than once")
    if redone != a.redone:
        errors.append(f"{redone} steps redone, expected {a.redone}")
    for msg in errors:
        print("FAIL:", msg)
    if errors:
        sys.exit(1)
    print(f"samples conserved: {len(files)} ranks, {len(seen)} rank-steps, {redone} redone")


if __name__ == "__main__":
    main()
