#!/usr/bin/python3
"""The table, plot and simulator predictions of a bench/cluster/study.sh run.

usage: bench/cluster/summarize.py DIR [--profile p100|h100] [--bin build/gossip/gossipgrad]

Reads DIR/points.csv and the runs beside it; writes DIR/summary.csv, DIR/summary.md and, with
matplotlib, DIR/study.png. Every time is in the real link's units: the measured (dilated) time
divided by the point's dilation K. For each point: the median step time of the measured steps
(after the warm-up; gossipgrad: rank 0's step events; DDP: rank 0's steps), the exposed
communication (step minus compute), efficiency = the profile's compute per step / step time,
images/s of the whole job, the ratios to MPI_Allreduce and to DDP at the same point, and
`gossipgrad simulate`'s prediction with its error (none for DDP's fp16 and PowerSGD hooks: the simulator's
allreduce is fp32).

The predictions: gossipgrad simulate at the point's p, one rank per node, the link's rate, a
latency of 50 us (a switched 1-10 Gbit/s network) and, beside it, the testbed's own latency
(DIR/latency.csv, measured by study.sh: at p >= 4 this VM's scheduler sets it, milliseconds, as
p ranks share 2 cores), the profile's compute, the mode (gossip: grad/model/both/gossipgrad,
the momentum sent beside the weights; allreduce: Rabenseifner over
4 MiB buckets, as MPICH does for large messages; DDP: ring over 25 MiB buckets, as gloo and
DDP's default bucket cap do). The simulator has no jitter or stragglers; they enter as a compute
factor: a straggler of 1.5x slows every rank of a synchronous job to 1.5x (gossip included: a
rank waits for its partners, they for theirs). Jitter makes a collective's step last as long as
the slowest of p lognormal draws (their expected maximum), and so a gossip step with the
agreements after each step (guard.lag 0: NaN guard, stop signal), which wait for every rank.
Without them (MODE+lag) gossip's ranks wait only for their partners, but those waited for theirs
in the step before: chain_factor() plays the partners'
schedule (gossipgrad partners) for 400 steps with a draw per rank and step, each bucket's exchange
ending when the rank, the one it sends to and the one it receives from have all handed it over
(staleness 0: the next step starts when all of them have; MODE+stale, staleness 1: it starts at
once, and a bucket waits only for the same bucket's exchange of the step before), and takes the
growth of the ranks' clocks per step as the factor.
"""
import argparse
import csv
import json
import math
import os
import random
import statistics
import subprocess
import sys

PROFILES = {"p100": (95, 190, 5, 64), "h100": (35, 68, 1, 256)}  # fwd, bwd, upd ms; batch
JITTER_P99 = float(os.environ.get("GG_STUDY_JITTER", "2.5"))
STRAGGLER = 1.5


def measured(dir_, row):
    path = os.path.join(dir_, row["file"])
    warmup, k = int(row["warmup"]), float(row["dilation"])
    if row["method"].startswith("ddp"):
        d = json.load(open(path))
        steps = d["step_s"]
    else:
        events = [json.loads(line) for line in open(path)]
        steps = [e["step_s"] for e in events if e["event"] == "step"][warmup:]
    if not steps:
        raise SystemExit(f"summarize.py: {path} has no measured steps")
    return statistics.median(steps) / k


def expected_max_lognormal(n, p99, draws=20000):
    if p99 <= 1:
        return 1.0
    sigma = math.log(p99) / 2.3263478740408408
    rng = random.Random(1)
    return statistics.fmean(
        max(math.exp(rng.gauss(0, sigma)) for _ in range(n)) for _ in range(draws // n + 200))


def predict(binary, p, rate_mbit, method, factor, profile, latency_s, cache={}):
    fwd, bwd, upd, batch = profile
    if method.startswith("ddp+fp16") or method.startswith("ddp+powersgd"):
        return None  # the simulator's allreduce is fp32 (no compression hook): not modelled
    if "+pipeline" in method or "+lowrank" in method:
        return None  # simulate refuses gossip.pipeline_weights and gossip.low_rank
    key = (p, rate_mbit, method, factor, latency_s)
    if key in cache:
        return cache[key]
    # grad@rma: grad over rma (the model knows no transports); +bf16 / +fp16: 16-bit buckets;
    # +int8 / +int4: the quantized wires; +stale: the same exchange (its waiting is in the
    # compute factor)
    wire = ("bf16" if "+bf16" in method or "+fp16" in method else
            "int8" if "+int8" in method else "int4" if "+int4" in method else "fp32")
    overlap = "false" if "+nooverlap" in method else "true"
    method = method.split("@")[0].split("+")[0]
    mode = method if method in ("grad", "model", "both", "gossipgrad") else "grad"
    bucket_kb = 25600 if method == "ddp" else 4096
    args = [binary, "simulate", "--config", os.path.join(ROOT, "configs/laptop.ini"), "--ranks",
            str(p), "--json", "--model.name", "resnet50", "--train.batch", str(batch),
            "--gossip.mode", mode, "--gossip.bucket_kb", str(bucket_kb),
            "--gossip.overlap_model", overlap,
            "--network.ranks_per_node", "1", "--network.inter_latency_us", f"{latency_s * 1e6:g}",
            "--network.inter_bandwidth_gbs", str(rate_mbit / 8000),
            "--simulate.forward_ms", str(fwd * factor), "--simulate.backward_ms",
            str(bwd * factor), "--simulate.update_ms", str(upd * factor),
            # each wire only where the mode sends that buffer (gossipgrad refuses the others)
            "--gossip.wire", wire if mode in ("grad", "both") else "fp32",
            "--gossip.model_wire", wire if mode in ("model", "both", "gossipgrad") else "fp32"]
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    row = json.loads(out)["rows"][0]
    col = {"allreduce": "rabenseifner_allreduce", "ddp": "ring_allreduce"}.get(method, "gossip")
    cache[key] = row[col]["step_s"]
    return cache[key]


def schedule(binary, p, steps):
    """[(send_to, recv_from)] per step: gossipgrad's default (laptop.ini) schedule."""
    out = subprocess.run([binary, "partners", "--ranks", str(p), "--steps", str(steps),
                          "--schedule", "dissemination", "--rotate", "--json"], check=True,
                         capture_output=True, text=True).stdout
    return [(s["send_to"], s["recv_from"]) for s in json.loads(out)["steps"]]


def chain_factor(binary, p, p99, staleness, profile, buckets=25, steps=400, warmup=50):
    """Clock growth per step, in units of the median compute, of p gossiping ranks whose compute
    is drawn per step from the lognormal (median 1, that p99): see the module's text."""
    fwd, bwd = profile[0], profile[1]
    # The share of a step's compute after which bucket b is handed over (even buckets by bytes).
    share = [(fwd + bwd * (b + 1) / buckets) / (fwd + bwd) for b in range(buckets)]
    sigma = math.log(p99) / 2.3263478740408408
    rng = random.Random(1)
    start = [0.0] * p
    done = None  # done[i][b]: when rank i's exchange of bucket b ended, the step before
    clocks = []
    for send_to, recv_from in schedule(binary, p, steps):
        fire = []
        for i in range(p):
            x, at, before, times = math.exp(rng.gauss(0, sigma)), start[i], 0.0, []
            for b in range(buckets):
                at += x * (share[b] - before)
                before = share[b]
                if staleness and done:
                    at = max(at, done[i][b])  # the staging copy is free once that exchange ended
                times.append(at)
            fire.append(times)
        done = [[max(fire[i][b], fire[send_to[i]][b], fire[recv_from[i]][b])
                 for b in range(buckets)] for i in range(p)]
        start = [f[-1] if staleness else max(d) for f, d in zip(fire, done)]
        clocks.append(statistics.fmean(start))
    return (clocks[-1] - clocks[warmup]) / (steps - 1 - warmup)


def compute_factor(binary, method, condition, p, profile):
    if condition == "straggler":
        return STRAGGLER
    if condition == "jitter":
        if method.split("+")[0] in ("allreduce", "ddp") or "+lag" not in method:
            return expected_max_lognormal(p, JITTER_P99)
        return chain_factor(binary, p, JITTER_P99, 1 if "+stale" in method else 0, profile)
    return 1.0


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NOMINAL_LATENCY_S = 50e-6


def testbed_latencies(dir_):
    """{(p, K): seconds} from DIR/latency.csv: a 4 KiB exchange's time, in the real link's units."""
    path = os.path.join(dir_, "latency.csv")
    if not os.path.exists(path):
        return {}
    return {(int(r["p"]), int(r["dilation"])): float(r["exchange_4k_s"]) / int(r["dilation"])
            for r in csv.DictReader(open(path))}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir")
    ap.add_argument("--profile", default="p100", choices=sorted(PROFILES))
    ap.add_argument("--bin", default=os.path.join(ROOT, "build/gossip/gossipgrad"))
    a = ap.parse_args()
    profile = PROFILES[a.profile]
    compute = (profile[0] + profile[1] + profile[2]) / 1000
    rows = list(csv.DictReader(open(os.path.join(a.dir, "points.csv"))))
    if not rows:
        sys.exit(f"summarize.py: {a.dir}/points.csv lists no points")
    latency = testbed_latencies(a.dir)
    out = []
    for r in rows:
        p, rate = int(r["p"]), int(r["rate_mbit"])
        step = measured(a.dir, r)
        factor = compute_factor(a.bin, r["method"], r["condition"], p, profile)
        nominal = predict(a.bin, p, rate, r["method"], factor, profile, NOMINAL_LATENCY_S)
        lat = latency.get((p, int(r["dilation"])))
        pred = predict(a.bin, p, rate, r["method"], factor, profile, lat) if lat else None
        out.append({"p": p, "rate_mbit": rate, "condition": r["condition"],
                    "method": r["method"], "dilation": int(r["dilation"]), "step_s": step,
                    "exposed_s": max(0.0, step - compute), "efficiency": compute / step,
                    "images_per_s": profile[3] * p / step,
                    "predicted_nominal_s": nominal,
                    "error_nominal": step / nominal - 1 if nominal else None,
                    "testbed_latency_s": lat, "predicted_step_s": pred,
                    "error": step / pred - 1 if pred else None})
    by = {(o["p"], o["rate_mbit"], o["condition"], o["method"]): o for o in out}
    for o in out:
        for base in ("allreduce", "ddp"):
            b = by.get((o["p"], o["rate_mbit"], o["condition"], base))
            o["vs_" + base] = o["images_per_s"] / b["images_per_s"] if b else None
        q = by.get((o["p"], o["rate_mbit"], "quiet", o["method"]))
        o["efficiency_loss"] = q["efficiency"] - o["efficiency"] if q else None
    fields = list(out[0].keys())
    with open(os.path.join(a.dir, "summary.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(out)

    def num(v, fmt):
        return "" if v is None else fmt.format(v)

    lines = ["| p | link | condition | method | step (s) | exposed (s) | efficiency | images/s "
             "| vs allreduce | vs DDP | eff. loss vs quiet | predicted, 50 us (s) | error "
             "| testbed latency (ms) | predicted, testbed latency (s) | error |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for o in out:
        lines.append(
            f"| {o['p']} | {o['rate_mbit'] / 1000:g} Gbit/s | {o['condition']} | {o['method']} "
            f"| {o['step_s']:.3f} | {o['exposed_s']:.3f} | {o['efficiency']:.2f} "
            f"| {o['images_per_s']:.0f} | {num(o['vs_allreduce'], '{:.2f}x')} "
            f"| {num(o['vs_ddp'], '{:.2f}x')} | {num(o['efficiency_loss'], '{:+.3f}')} "
            f"| {num(o['predicted_nominal_s'], '{:.3f}')} | {num(o['error_nominal'], '{:+.0%}')} "
            f"| {num(o['testbed_latency_s'] and o['testbed_latency_s'] * 1e3, '{:.2f}')} "
            f"| {num(o['predicted_step_s'], '{:.3f}')} | {num(o['error'], '{:+.0%}')} |")
    # The link, not this CPU, sets the pace: half the rate, about twice the exposed communication.
    for o in out:
        full = by.get((o["p"], 2 * o["rate_mbit"], o["condition"], o["method"]))
        if full and full["exposed_s"] > 0:
            lines.append("")
            lines.append(
                f"Link check, p = {o['p']} {o['method']}: exposed communication "
                f"{full['exposed_s']:.3f} s at {full['rate_mbit'] / 1000:g} Gbit/s (K = "
                f"{full['dilation']}), {o['exposed_s']:.3f} s at {o['rate_mbit'] / 1000:g} Gbit/s "
                f"(K = {o['dilation']}): {o['exposed_s'] / full['exposed_s']:.2f}x")
    with open(os.path.join(a.dir, "summary.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    plot(a.dir, out)


def plot(dir_, out):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("summarize.py: no matplotlib (apt-get install python3-matplotlib): no plot")
        return
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    quiet = [o for o in out if o["condition"] == "quiet" and o["rate_mbit"] == 1000]
    for m in sorted({o["method"] for o in quiet}):
        pts = sorted((o["p"], o["images_per_s"], o["predicted_step_s"] or o["predicted_nominal_s"])
                     for o in quiet if o["method"] == m)
        line, = left.plot([x[0] for x in pts], [x[1] for x in pts], "o-", label=m)
        modelled = [x for x in pts if x[2]]
        left.plot([x[0] for x in modelled], [PROFILES["p100"][3] * x[0] / x[2] for x in modelled],
                  "x:", color=line.get_color())
    left.set_xlabel("ranks (one per node)")
    left.set_ylabel("images/s")
    left.set_title("1 Gbit/s, quiet (o measured, x predicted)")
    left.set_xscale("log", base=2)
    left.legend()
    p16 = [o for o in out if o["p"] == max(x["p"] for x in out) and o["rate_mbit"] == 1000]
    conds = ["quiet", "jitter", "straggler"]
    methods = sorted({o["method"] for o in p16 if o["condition"] != "quiet"})
    for i, m in enumerate(methods):
        vals = [next((o["efficiency"] for o in p16 if o["method"] == m and o["condition"] == c),
                     0) for c in conds]
        right.bar([j + i * 0.25 for j in range(len(conds))], vals, 0.25, label=m)
    right.set_xticks([j + 0.25 for j in range(len(conds))], conds)
    right.set_ylabel("efficiency (compute / step)")
    right.set_title(f"p = {max(x['p'] for x in out)}, 1 Gbit/s")
    right.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(dir_, "study.png"), dpi=100)


if __name__ == "__main__":
    main()
