#!/usr/bin/env python3
"""Reads the runs of bench/resilience/run.sh (DIR/<strategy>-<fraction>.jsonl, none-0 the
failure-free one) and writes OUT.csv, OUT.md and OUT.png (matplotlib, else gnuplot)."""
import collections
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys


def load(path):
    events = [json.loads(line) for line in open(path)]
    summary = next(e for e in events if e["event"] == "summary")
    faults = [e for e in events if e["event"] == "fault"]
    return {
        "top1": summary["top1"],
        "wall_s": summary["wall_s"],
        "ranks_end": summary.get("ranks", 0),
        "failures": len(faults),
        "steps_redone": sum(e["steps_redone"] for e in faults),
        "recovery_s": sum(e["recovery_s"] for e in faults),
    }


def main():
    src, out, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    runs = collections.defaultdict(list)  # (strategy, fraction) -> repeats
    for path in sorted(glob.glob(os.path.join(src, "*.jsonl"))):
        strategy, fraction, _ = os.path.basename(path)[:-6].rsplit("-", 2)
        runs[(strategy, int(fraction))].append(load(path))
    rows = []
    for (strategy, fraction), reps in runs.items():
        # The plan depends on the seed only: failures and redone steps are the same in every
        # repeat; times are medians, top-1 the mean.
        r = dict(reps[0])
        r["strategy"] = strategy
        r["mtbf_steps"] = steps // fraction if fraction else 0
        r["repeats"] = len(reps)
        r["wall_s"] = statistics.median(x["wall_s"] for x in reps)
        r["wall_min"] = min(x["wall_s"] for x in reps)
        r["wall_max"] = max(x["wall_s"] for x in reps)
        r["recovery_s"] = statistics.median(x["recovery_s"] for x in reps)
        r["top1"] = statistics.mean(x["top1"] for x in reps)
        rows.append(r)
    base = next(r for r in rows if r["strategy"] == "none")
    order = {"none": 0, "restart": 1, "rollback": 2, "forward": 3}
    rows.sort(key=lambda r: (-r["mtbf_steps"] if r["mtbf_steps"] else -1e9, order[r["strategy"]]))
    for r in rows:
        r["overhead_pct"] = 100 * (r["wall_s"] / base["wall_s"] - 1)
    cols = ["strategy", "mtbf_steps", "failures", "steps_redone", "recovery_s", "ranks_end",
            "top1", "repeats", "wall_s", "wall_min", "wall_max", "overhead_pct"]
    with open(out + ".csv", "w") as f:
        f.write(",".join(cols) + "\n")
        for r in rows:
            f.write(",".join(f"{r[c]:.4f}" if isinstance(r[c], float) else str(r[c])
                             for c in cols) + "\n")
    with open(out + ".md", "w") as f:
        f.write(f"Runs of {steps} steps, {base['repeats']} repeats each. MTBF in steps (0: no "
                "failures); recovery: seconds over all failures (median of the repeats); wall: "
                "median (min-max); overhead: median wall time against the failure-free run's.\n\n")
        f.write("| strategy | MTBF (steps) | failures | steps redone | recovery (s) | ranks at "
                "the end | top-1 | wall (s) | overhead |\n")
        f.write("|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
        for r in rows:
            f.write(f"| {r['strategy']} | {r['mtbf_steps']} | {r['failures']} | "
                    f"{r['steps_redone']} | {r['recovery_s']:.2f} | {r['ranks_end']} | "
                    f"{100 * r['top1']:.2f}% | {r['wall_s']:.1f} ({r['wall_min']:.1f}-"
                    f"{r['wall_max']:.1f}) | {r['overhead_pct']:+.0f}% |\n")
    plot(rows, out)


def plot(rows, out):
    strategies = ["restart", "rollback", "forward"]
    rates = sorted({r["mtbf_steps"] for r in rows if r["mtbf_steps"]}, reverse=True)
    base = next(r for r in rows if r["strategy"] == "none")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        plt = None
    if plt is not None:
        fig, ax = plt.subplots(1, 2, figsize=(10, 4))
        for s in strategies:
            xs = [m for m in rates]
            get = lambda m, k: next(r[k] for r in rows if r["strategy"] == s and r["mtbf_steps"] == m)
            ax[0].plot([str(m) for m in xs], [100 * get(m, "top1") for m in xs], "o-", label=s)
            ax[1].plot([str(m) for m in xs], [get(m, "overhead_pct") for m in xs], "o-", label=s)
        ax[0].axhline(100 * base["top1"], color="gray", ls="--", label="no failures")
        ax[0].set(xlabel="MTBF (steps)", ylabel="final top-1 (%)")
        ax[1].set(xlabel="MTBF (steps)", ylabel="wall-time overhead (%)")
        ax[0].legend()
        fig.tight_layout()
        fig.savefig(out + ".png", dpi=100)
        return
    if shutil.which("gnuplot") is None:
        print("no matplotlib or gnuplot: no PNG", file=sys.stderr)
        return
    data = out + ".dat"
    with open(data, "w") as f:
        for i, m in enumerate(rates):
            vals = []
            for s in strategies:
                r = next(r for r in rows if r["strategy"] == s and r["mtbf_steps"] == m)
                vals += [100 * r["top1"], r["overhead_pct"]]
            f.write(f"{i} {m} " + " ".join(f"{v:.3f}" for v in vals) + "\n")
    script = f"""
set terminal pngcairo size 1000,400
set output '{out}.png'
set multiplot layout 1,2
set xlabel 'MTBF (steps)'
set xtics ({", ".join(f'"{m}" {i}' for i, m in enumerate(rates))})
set xrange [-0.5:{len(rates) - 0.5}]
set ylabel 'final top-1 (%)'
set key top left
plot '{data}' u 1:3 w lp t 'restart', '' u 1:5 w lp t 'rollback', '' u 1:7 w lp t 'forward', \
  {100 * base['top1']:.3f} dt 2 lc 'gray' t 'no failures'
set ylabel 'wall-time overhead (%)'
set key top left
plot '{data}' u 1:4 w lp t 'restart', '' u 1:6 w lp t 'rollback', '' u 1:8 w lp t 'forward'
unset multiplot
"""
    try:
        subprocess.run(["gnuplot"], input=script, text=True, check=True)
    finally:  # a failed plot leaves no data file behind either
        os.remove(data)


if __name__ == "__main__":
    main()
