#!/usr/bin/env python3
"""Property test of the option rules (issue 31): random pairs of non-default option values, each
either runs or is refused before training, in one line, exit 2; and --dry-run under the same
mpirun gives the same verdict as the real run. A warning "not on this machine" in the dry run
(a check of this machine's files or CPU) allows the real run to refuse.

usage: option_pairs.py GOSSIPGRAD ROOT MPIEXEC [PAIRS] [SEED]   (GG_PAIRS_SEED overrides SEED)
"""
import itertools
import os
import random
import shutil
import subprocess
import sys
import tempfile

BIN, ROOT, MPIEXEC = sys.argv[1:4]
PAIRS = int(sys.argv[4]) if len(sys.argv) > 4 else 24
SEED = int(os.environ.get("GG_PAIRS_SEED", sys.argv[5] if len(sys.argv) > 5 else "31"))

# A value other than the default for options that change what a run does (laptop.ini's run).
VALUES = {
    "gossip.mode": ["grad", "model", "allreduce"],
    "gossip.schedule": ["hypercube", "ring", "random"],
    "gossip.rotate": ["false"],
    "gossip.transport": ["shm", "rma", "p2p"],
    "gossip.hierarchy": ["node"],
    "gossip.threading": ["concurrent", "chained"],
    "gossip.comm_threads": ["3"],
    "gossip.staleness": ["1"],
    "gossip.late": ["skip"],
    "gossip.overlap_model": ["false"],
    "gossip.global_every": ["2"],
    "gossip.model_every": ["2"],
    "gossip.wire": ["bf16"],
    "gossip.model_wire": ["bf16"],
    "gossip.error_feedback": ["true"],
    "gossip.rounding": ["stochastic"],
    "gossip.choco": ["true"],
    "gossip.low_rank": ["2"],
    "data.shuffle": ["ids"],
    "data.shuffle_per_step": ["4"],
    "train.weight_layout": ["plain"],
    "train.nesterov": ["true"],
    "train.momentum": ["0"],
    "apoptosis.enable": ["true"],
    "fault.inject": ["1:1"],
    "fault.strategy": ["restart"],
    "emulate.forward_ms": ["1"],
    "emulate.slow": ["1:2"],
    "checkpoint.dir": ["ck"],
    "checkpoint.every": ["1"],
    "train.stop_at": ["1"],
    "guard.lag": ["1"],
    "log.timeline": ["tl.json"],
}

# Synthetic samples: loading and evaluating Fashion-MNIST was two thirds of each 2-step run, and
# no option here depends on the data (the 24 pairs of seed 31 get the same verdicts and lines).
BASE = ["train", "--config", os.path.join(ROOT, "configs/laptop.ini"), "--model.name", "cnn",
        "--model.width", "4", "--log.progress", "false", "--train.threads", "1",
        "--train.max_steps", "2", "--train.eval_batch", "1000", "--gossip.consensus_every", "0",
        "--gossip.timeout_s", "20", "--data.source", "synthetic:1x28x28:10:2000"]


def run(cmd, cwd):
    try:
        p = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=120, env=dict(os.environ, OMP_NUM_THREADS="1"))
        return p.returncode, p.stdout.decode(errors="replace")
    except subprocess.TimeoutExpired as e:
        return 124, (e.stdout or b"").decode(errors="replace")


def main():
    rng = random.Random(SEED)
    pairs = list(itertools.combinations(sorted(VALUES), 2))
    rng.shuffle(pairs)
    failures = 0
    for a, b in pairs[:PAIRS]:
        opts = [f"--{a}", rng.choice(VALUES[a]), f"--{b}", rng.choice(VALUES[b])]
        work = tempfile.mkdtemp()
        try:
            dry_rc, dry = run([MPIEXEC, "-n", "2", BIN] + BASE + opts + ["--dry-run"], work)
            real_rc, real = run([MPIEXEC, "-n", "2", BIN] + BASE + opts +
                                ["--log.metrics", "m.jsonl"], work)
            metrics = os.path.join(work, "m.jsonl")
            trained = os.path.exists(metrics) and '"event":"step"' in open(metrics).read()
        finally:
            shutil.rmtree(work, ignore_errors=True)
        errors = [l for l in real.splitlines() if "error:" in l]
        machine = "not on this machine" in dry
        why = []
        if real_rc not in (0, 2):
            why.append(f"real run exit {real_rc}")
        if dry_rc not in (0, 2):
            why.append(f"dry run exit {dry_rc}")
        if real_rc == 2 and len(errors) != 1:
            why.append(f"refused with {len(errors)} error lines")
        if real_rc == 2 and trained:
            why.append("refused after training had started")
        if dry_rc != real_rc and not (dry_rc == 0 and real_rc == 2 and machine):
            why.append(f"dry run says {dry_rc}, real run {real_rc}")
        verdict = "refused: " + errors[0] if real_rc == 2 and errors else f"exit {real_rc}"
        print(("FAIL " if why else "ok   ") + " ".join(opts) + " -> " + verdict)
        if why:
            failures += 1
            print("  " + "; ".join(why))
            print("  dry: " + " | ".join(dry.splitlines()[-3:]))
            print("  real: " + " | ".join(real.splitlines()[-4:]))
    print(f"{'FAIL' if failures else 'PASS'}: {PAIRS} random option pairs (seed {SEED}), "
          f"{failures} broke the rules")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
