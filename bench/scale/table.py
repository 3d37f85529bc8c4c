#!/usr/bin/env python3
"""bench/scale: the table and plot of the runs in RUNS (p<P>-<mode>-s<seed>.jsonl from run.sh).

Usage: table.py RUNS OUT CPU  -> OUT.csv, OUT.md, OUT.png (gnuplot, when installed); the
commands that made the runs are RUNS/commands.txt (run.sh appends each invocation's).
Bytes per step are what one rank sends in a step: the gossip exchanges' payload as the run
counted it, plus, with -global<H>, an exact global average every H steps priced as a ring
allreduce of the weights (2 (p - 1) / p x 4 bytes per parameter), and so each global average
consensus control took (-cc<B>), spread over the steps; allreduce is the ring's own.
"""
import json, os, re, shutil, statistics, subprocess, sys

runs, out, cpu = sys.argv[1:4]
commands_file = os.path.join(runs, "commands.txt")
commands = [l.strip() for l in open(commands_file)] if os.path.exists(commands_file) else []
rows = []
for name in sorted(os.listdir(runs)):
    m = re.fullmatch(r"p(\d+)-(.+)-s(\d+)\.jsonl", name)
    if not m:
        continue
    p, mode, seed = int(m[1]), m[2], int(m[3])
    events = [json.loads(l) for l in open(os.path.join(runs, name))]
    start = next(e for e in events if e["event"] == "start")
    summary = next((e for e in events if e["event"] == "summary"), None)
    evals = [e for e in events if e["event"] == "eval"]
    if summary is None or not evals:
        print(f"table.py: {name} did not finish: left out", file=sys.stderr)
        continue
    last = evals[-1]
    params = start["params"]
    ring = 2 * (p - 1) / p * 4 * params
    g = re.search(r"-global(\d+)", mode)
    averages = summary.get("consensus_averages", 0)  # consensus control's global averages
    if mode.startswith("allreduce"):
        sent = ring
    else:
        sent = (summary["sent_bytes_per_step"] + (ring / int(g[1]) if g else 0) +
                ring * averages / summary["steps"])
    rt = last.get("rank_top1", {})
    rows.append(dict(p=p, mode=mode, seed=seed, top1=last["top1"], rank_min=rt.get("min"),
                     rank_median=rt.get("median"), rank_max=rt.get("max"),
                     rank_samples=rt.get("samples"), consensus=last["consensus"],
                     steps=summary["steps"], wall_s=summary["wall_s"], bytes_per_step=sent,
                     ring_bytes=ring, global_batch=start["global_batch"],
                     consensus_averages=averages))
if not rows:
    sys.exit("table.py: no finished run in " + runs)
cols = list(rows[0])
with open(out + ".csv", "w") as f:
    f.write(",".join(cols) + "\n")
    for r in rows:
        f.write(",".join("" if r[c] is None else str(r[c]) for c in cols) + "\n")

modes = list(dict.fromkeys(r["mode"] for r in rows))
ps = sorted({r["p"] for r in rows})
def cell(p, mode):
    return [r for r in rows if r["p"] == p and r["mode"] == mode]
def mean(v):
    return statistics.mean(v) if v else None
pct = lambda v: "–" if v is None else f"{100 * v:.2f}"
lines = [f"# Accuracy against the rank count on virtual ranks ({os.path.basename(out)})", "",
         f"Machine: {cpu}. Commands (each appends its runs to {os.path.basename(runs)}/):", ""] + \
        [f"- `{c}`" for c in commands] + ["",
         "Fashion-MNIST, resnet8 (configs/laptop.ini), every p on VIRTUAL ranks (one process; "
         "exact: tests/gossip/cli/virtual_ranks.sh). Top-1 of the ranks' average model after the "
         "last epoch (mean over seeds when several, each seed's in the CSV); 'vs allreduce': the "
         "mean over seeds of the difference to allreduce with the same seed (each in brackets); "
         "'own' is each rank's "
         "own model on the first test samples (min / median / max over the ranks); consensus: mean "
         "squared distance of the ranks' weights to their average; bytes: what one rank sends per "
         "step, beside a ring allreduce's.", "",
         "| p | global batch | steps | mode | top-1 % | vs allreduce | own top-1 % min / median / max | consensus | MB / step / rank | x ring allreduce | wall s |",
         "|---|---|---|---|---|---|---|---|---|---|---|"]
for p in ps:
    base = mean([r["top1"] for r in cell(p, "allreduce")])
    for mode in modes:
        c = cell(p, mode)
        if not c:
            continue
        t = mean([r["top1"] for r in c])
        # Against allreduce run with the same seed (seeds differ by points at large p), the
        # mean of the pairs, each pair's in brackets; without a paired seed, mean against mean.
        by_seed = {r["seed"]: r["top1"] for r in cell(p, "allreduce")}
        pairs = [r["top1"] - by_seed[r["seed"]] for r in c if r["seed"] in by_seed]
        if base is None or mode == "allreduce":
            gap = "–"
        elif pairs:
            gap = f"{100 * mean(pairs):+.2f}" + (
                " (" + ", ".join(f"{100 * d:+.2f}" for d in pairs) + ")" if len(pairs) > 1 else "")
        else:
            gap = f"{100 * (t - base):+.2f} (unpaired)"
        own = " / ".join(pct(mean([r[k] for r in c if r[k] is not None]))
                         for k in ("rank_min", "rank_median", "rank_max"))
        seeds = "" if len(c) == 1 else f" ({len(c)} seeds)"
        if any(r["consensus_averages"] for r in c):
            seeds += f" ({mean([r['consensus_averages'] for r in c]):.0f} global averages)"
        lines.append(f"| {p} | {c[0]['global_batch']} | {c[0]['steps']} | {mode}{seeds} | {pct(t)} | {gap} | {own} | "
                     f"{mean([r['consensus'] for r in c]):.3g} | {mean([r['bytes_per_step'] for r in c]) / 1e6:.3f} | "
                     f"{mean([r['bytes_per_step'] for r in c]) / c[0]['ring_bytes']:.2f} | {mean([r['wall_s'] for r in c]):.0f} |")
open(out + ".md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))

if shutil.which("gnuplot"):
    data = out + ".plot.dat"
    positive = False  # any mode with a consensus distance above 0 (the log scale needs one)
    with open(data, "w") as f:
        for mode in modes:
            f.write(f'"{mode}"\n')
            for p in ps:
                c = cell(p, mode)
                if c:
                    # Allreduce's distance is 0: no point on the log scale (NaN is gnuplot's "none").
                    d = mean([r['consensus'] for r in c])
                    positive = positive or d > 0
                    f.write(f"{p} {100 * mean([r['top1'] for r in c])} {d if d > 0 else 'NaN'}\n")
            f.write("\n\n")
    script = f"""set terminal pngcairo size 1200,480
set output '{out}.png'
set multiplot layout 1,2
set logscale x 2
set xlabel 'ranks p (virtual)'
set key bottom left
set ylabel 'test top-1 (%)'
set title 'Top-1 of the average model'
plot for [i=0:{len(modes) - 1}] '{data}' index i using 1:2 with linespoints title columnheader(1)
{"set logscale y" if positive else "set yrange [-1:1]"}
set ylabel 'consensus distance'
set title 'Consensus distance at the end'
set key top left
plot for [i=0:{len(modes) - 1}] '{data}' index i using 1:3 with linespoints title columnheader(1)
unset multiplot
"""
    try:
        subprocess.run(["gnuplot"], input=script, text=True, check=True)
    finally:
        os.remove(data)
