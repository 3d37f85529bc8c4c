#!/usr/bin/env python3
"""The step time the accuracy study's modes would take at the paper's scale, predicted by
`gossipgrad simulate`: ResNet-50 with a P100's compute per step (bench/cluster/study.sh's p100
profile: forward 95 ms, backward 190 ms, update 5 ms, batch 64 per rank), one rank per node, a
switched network of 50 us latency at 1 and 10 Gbit/s, at each p given. Beside them MPI_Allreduce
(Rabenseifner over 4 MiB buckets, as MPICH does for large messages) and PyTorch DDP (a ring over
25 MiB buckets, gloo's and DDP's default), the same network and compute.

usage: bench/scale/predict.py [--bin GOSSIPGRAD] [--ranks 16,128] [--global H ...] [--out FILE.md]
  --global H: also model + bf16 without overlap plus an exact global average every H steps (the
  average rate that consensus control took in the accuracy study: steps / consensus_averages).
"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROFILE = {"forward_ms": 95, "backward_ms": 190, "update_ms": 5, "batch": 64}
LATENCY_US = 50


def simulate(binary, ranks, gbit, options, bucket_kb=4096):
    args = [binary, "simulate", "--config", os.path.join(ROOT, "configs/laptop.ini"), "--ranks",
            ",".join(map(str, ranks)), "--json", "--model.name", "resnet50",
            "--train.batch", str(PROFILE["batch"]), "--gossip.bucket_kb", str(bucket_kb),
            "--network.ranks_per_node", "1", "--network.inter_latency_us", str(LATENCY_US),
            "--network.inter_bandwidth_gbs", str(gbit / 8),
            "--simulate.forward_ms", str(PROFILE["forward_ms"]),
            "--simulate.backward_ms", str(PROFILE["backward_ms"]),
            "--simulate.update_ms", str(PROFILE["update_ms"])] + options
    run = subprocess.run(args, capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"predict.py: {' '.join(args)}: {run.stderr.strip()}")
    return {r["ranks"]: r for r in json.loads(run.stdout)["rows"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "build/gossip/gossipgrad"))
    ap.add_argument("--ranks", default="16,128")
    ap.add_argument("--global", dest="global_every", type=int, action="append", default=[])
    ap.add_argument("--out")
    a = ap.parse_args()
    try:
        ranks = [int(p) for p in a.ranks.split(",")]
    except ValueError:
        sys.exit(f"predict.py: --ranks {a.ranks}: give rank counts like 16,128")
    if not os.access(a.bin, os.X_OK):
        sys.exit(f"predict.py: no gossipgrad at {a.bin}: build it or give --bin")
    if any(h < 1 for h in a.global_every):
        sys.exit("predict.py: --global H needs H >= 1 (steps between the global averages)")
    bf16 = ["--gossip.model_wire", "bf16"]
    modes = [("model + bf16 (weights overlapped, the default)", ["--gossip.mode", "model"] + bf16),
             ("model + bf16, no overlap", ["--gossip.mode", "model", "--gossip.overlap_model",
                                          "false"] + bf16)]
    for h in a.global_every:
        modes.append((f"model + bf16, no overlap, a global average every {h} steps",
                      ["--gossip.mode", "model", "--gossip.overlap_model", "false",
                       "--gossip.global_every", str(h)] + bf16))
    modes += [("gossipgrad (weights + momentum, overlapped)", ["--gossip.mode", "gossipgrad"]),
              ("gossipgrad + bf16, no overlap", ["--gossip.mode", "gossipgrad",
                                                 "--gossip.overlap_model", "false"] + bf16)]
    lines = ["| link | p | mode | step ms | efficiency | vs DDP | vs MPI_Allreduce |",
             "|---|---|---|---|---|---|---|"]
    for gbit in (1, 10):
        ddp = simulate(a.bin, ranks, gbit, ["--gossip.mode", "grad"], bucket_kb=25600)
        mpi = simulate(a.bin, ranks, gbit, ["--gossip.mode", "grad"])
        for p in ranks:
            d = ddp[p]["ring_allreduce"]
            m = mpi[p]["rabenseifner_allreduce"]
            lines.append(f"| {gbit} Gbit/s | {p} | PyTorch DDP (ring, 25 MiB buckets) | "
                         f"{d['step_s'] * 1e3:.0f} | {d['efficiency']:.2f} | 1.00x | |")
            lines.append(f"| {gbit} Gbit/s | {p} | MPI_Allreduce (Rabenseifner, 4 MiB buckets) | "
                         f"{m['step_s'] * 1e3:.0f} | {m['efficiency']:.2f} | "
                         f"{d['step_s'] / m['step_s']:.2f}x | 1.00x |")
            for name, opts in modes:
                g = simulate(a.bin, [p], gbit, opts)[p]["gossip"]
                lines.append(f"| {gbit} Gbit/s | {p} | {name} | {g['step_s'] * 1e3:.0f} | "
                             f"{g['efficiency']:.2f} | {d['step_s'] / g['step_s']:.2f}x | "
                             f"{m['step_s'] / g['step_s']:.2f}x |")
    text = "\n".join(lines) + "\n"
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    print(text, end="")


if __name__ == "__main__":
    main()
