#!/usr/bin/python3
"""bench/resilience/real_failures.py: real failures under `gossipgrad supervise`, measured.

A 4-rank Fashion-MNIST run (resnet8, one epoch, configs/laptop.ini) under supervise; one rank is
SIGKILLed from outside (kill -9) at a random step. Three ways to come back:
  states   the default: every rank's saver writes its state of the last completed step, the job
           goes on from them (gossip/resilience/emergency.hpp)
  ckpt50   --emergency-dir none, full checkpoints every 50 steps: restart from the newest
  ckpt200  the same, every 200 steps
and the failure-free run. For each run: the step in flight at the kill, the step training resumed
at (steps redone = the difference), the seconds from the kill to the first step finished after
it (read from the metrics file as it grows, polled every 20 ms), the final top-1 and the wall
time. REPEAT rounds (default 3), each with its own kill step (the same in every method of the
round), the methods interleaved. Writes bench/results/real-failures-<host>.csv and .md.

--node-loss: the same job on 3 namespace nodes x 1 rank of the cluster in a box
(bench/cluster/cluster.sh, unshaped; needs root), and the failure is a lost node: every process
in the namespace of node 2 (hydra's proxy, the rank, its saver) SIGKILLed at once. states
goes on with the 2 survivors (forward); ckpt50 / ckpt200 restart from the newest checkpoint with
--shrink-on-failure (2 ranks, on the first 2 nodes: the lost machine is gone). Writes
bench/results/real-failures-node-<host>.csv and .md.

Usage: bench/resilience/real_failures.py [--repeat N] [--node-loss] [--bin build/gossip/gossipgrad]
"""
import argparse
import csv
import json
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
METHODS = {
    "states": [],
    "ckpt50": ["--emergency-dir", "none"],
    "ckpt200": ["--emergency-dir", "none"],
}
EVERY = {"states": 50, "ckpt50": 50, "ckpt200": 200, "none": 50}


def events(path):
    try:
        with open(path) as f:
            lines = f.readlines()
    except FileNotFoundError:
        return []
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            pass  # a line being written
    return out


def rank_pid(tag, rank):
    """The pid of rank `rank` of the job whose command line holds `tag` (hydra's PMI_RANK)."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
            if b"train" not in cmd or not any(tag.encode() in a for a in cmd):
                continue
            env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
        except OSError:
            continue
        if f"PMI_RANK={rank}".encode() in env:
            return int(pid)
    return None


class Cluster:
    """3 namespace nodes (bench/cluster/cluster.sh), torn down on exit; a hydra-named launcher."""

    def __init__(self, work):
        self.sh = os.path.join(ROOT, "bench", "cluster", "cluster.sh")
        self.prefix = f"ggrf{os.getpid() % 100000}"
        subprocess.run([self.sh, "--prefix", self.prefix, "up", "--nodes", "3", "--rate", "none",
                        "--delay", "0", "--jitter", "0"], check=True, stdout=subprocess.DEVNULL)
        # Its name says hydra, so supervise asks it for failure notices and lowers its -n.
        self.launcher = os.path.join(work, "mpiexec.hydra-cluster")
        with open(self.launcher, "w") as f:
            f.write("#!/usr/bin/env bash\nopts=()\n"
                    "while [[ $# -gt 0 && $1 == -* ]]; do\n  case $1 in\n"
                    "  -n | -np | -ppn) opts+=(\"$1\" \"$2\") && shift 2 ;;\n"
                    "  *) opts+=(\"$1\") && shift ;;\n  esac\ndone\n"
                    f"exec {self.sh} --prefix {self.prefix} run \"${{opts[@]}}\" -ppn 1 -- \"$@\"\n")
        os.chmod(self.launcher, 0o755)

    def kill_node(self, node):
        ns = f"{self.prefix}-n{node}"
        pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True,
                              text=True).stdout.split()
        if not pids:
            raise RuntimeError(f"no process in {ns}")
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass

    def down(self):
        subprocess.run([self.sh, "--prefix", self.prefix, "down"], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)


def run(binary, method, kill_step, victim, work, cluster=None):
    ck = os.path.join(work, "ck")
    metrics = os.path.join(work, "m.jsonl")
    job = [binary, "train", "--config", f"{ROOT}/configs/laptop.ini",
           "--data.dir", "/usr/share/datasets/fashion-mnist", "--model.width", "4",
           "--train.threads", "1", "--train.warmup_epochs", "0", "--train.epochs", "1",
           "--train.eval_batch", "1000", "--log.progress", "false",
           "--gossip.consensus_every", "0", "--gossip.timeout_s", "60",
           "--checkpoint.dir", ck, "--checkpoint.every", str(EVERY[method]),
           "--log.metrics", metrics]
    launch = [cluster.launcher, "-n", "3"] if cluster else ["mpiexec", "-n", "4"]
    extra = ["--shrink-on-failure", "--min-ranks", "2"] if cluster and method != "states" else []
    sup = [binary, "supervise", "--max-restarts", "2"] + METHODS.get(method, []) + extra + \
        ["--"] + launch + job
    env = dict(os.environ, OMP_NUM_THREADS="1")
    t0 = time.time()
    with open(os.path.join(work, "out.log"), "w") as out, \
            open(os.path.join(work, "err.log"), "w") as err:
        p = subprocess.Popen(sup, stdout=out, stderr=err, env=env)
        row = {"method": method, "kill_step": "", "resumed_at": "", "steps_redone": "",
               "recovery_s": ""}
        if method != "none":
            while True:  # wait for the kill step, then kill the victim from outside
                steps = [e["step"] for e in events(metrics) if e.get("event") == "step"]
                if steps and steps[-1] >= kill_step:
                    break
                if p.poll() is not None:
                    raise RuntimeError(f"{method}: the job ended before step {kill_step}")
                time.sleep(0.02)
            in_flight = steps[-1] + 1  # the step the ranks were in at the kill
            if cluster:
                cluster.kill_node(victim)
            else:
                pid = rank_pid(ck, victim)
                if pid is None:
                    raise RuntimeError(f"{method}: rank {victim} not found")
                os.kill(pid, signal.SIGKILL)
            killed = time.time()
            while True:  # the first step finished after the restart
                ev = events(metrics)
                starts = [i for i, e in enumerate(ev) if e.get("event") == "start"]
                if len(starts) >= 2:
                    after = [e for e in ev[starts[-1]:] if e.get("event") == "step"]
                    if after:
                        recovered = time.time()
                        first = ev[starts[-1]].get("first_step", after[0]["step"])
                        # At another rank count (forward, a shrunk restart) the steps are
                        # counted anew: the point reached, in the first run's steps.
                        first = round(first * ev[starts[0]]["steps"] / ev[starts[-1]]["steps"])
                        break
                if p.poll() is not None:
                    raise RuntimeError(f"{method}: the job ended without a restart")
                time.sleep(0.02)
            row.update(kill_step=in_flight, resumed_at=first,
                       steps_redone=max(0, in_flight - first),
                       recovery_s=round(recovered - killed, 2))
        rc = p.wait(timeout=600)
    wall = time.time() - t0
    if rc != 0:
        raise RuntimeError(f"{method}: supervise exited {rc}: see {work}/err.log")
    summary = [e for e in events(metrics) if e.get("event") == "summary"][-1]
    row.update(top1=summary["top1"], wall_s=round(wall, 1))
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--bin", default=f"{ROOT}/build/gossip/gossipgrad")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--node-loss", action="store_true",
                    help="3 namespace nodes, one lost (needs root): see the module's text")
    a = ap.parse_args()
    if not os.access(a.bin, os.X_OK):
        sys.exit(f"real_failures.py: {a.bin} is not an executable gossipgrad: build it first")
    rng = random.Random(a.seed)
    rows = []
    cluster = None
    # SIGTERM ends the run as an exception does: the namespaces are torn down (finally).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if a.node_loss:
        if os.geteuid() != 0:
            sys.exit("real_failures.py: --node-loss makes network namespaces: run it as root")
        cluster = Cluster(tempfile.mkdtemp(prefix="gg-realfail-launch-"))
    try:
        rows = rounds(a, rng, cluster)
    finally:
        if cluster:
            cluster.down()
    report(a, rows)


def rounds(a, rng, cluster):
    rows = []
    for r in range(a.repeat):
        # A lost node: the last one, since a relaunch with fewer ranks fills the nodes in order
        # (the lost node's namespace stays usable here, unlike a dead machine).
        kill_step = rng.randrange(40, 190)
        victim = 2 if cluster else rng.randrange(4)
        for method in ["none", "states", "ckpt50", "ckpt200"]:
            work = tempfile.mkdtemp(prefix="gg-realfail-")
            try:
                row = run(a.bin, method, kill_step, victim, work, cluster)
            finally:
                shutil.rmtree(work, ignore_errors=True)
            row.update(round=r, victim=victim if method != "none" else "")
            rows.append(row)
            print(f"round {r} {method:8s} kill at {row['kill_step'] or '-':>4} resumed at "
                  f"{row['resumed_at'] if row['resumed_at'] != '' else '-':>4} redone "
                  f"{row['steps_redone'] if row['steps_redone'] != '' else '-':>4} recovery "
                  f"{row['recovery_s'] or '-':>5} s top-1 {row['top1']:.4f} wall "
                  f"{row['wall_s']} s", flush=True)
    return rows


def report(a, rows):
    host = socket.gethostname()
    kind = "real-failures-node" if a.node_loss else "real-failures"
    out = os.path.join(ROOT, "bench", "results", f"{kind}-{host}")
    fields = ["round", "method", "victim", "kill_step", "resumed_at", "steps_redone",
              "recovery_s", "top1", "wall_s"]
    with open(out + ".csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    base = statistics.median(r["top1"] for r in rows if r["method"] == "none")
    if a.node_loss:
        head = [f"# Real failures: one of 3 namespace nodes lost ({host})", "",
                f"Command: `bench/resilience/real_failures.py --node-loss --repeat {a.repeat}`; "
                "resnet8 width 4, Fashion-MNIST, 1 epoch, 3 nodes x 1 rank x 1 thread of the "
                "cluster in a box (unshaped), configs/laptop.ini; every process of node 2 "
                "SIGKILLed at a random step in [40, 190), the same in every method of a round; "
                "states goes on with the 2 survivors (forward), the restarts shrink to 2 ranks. "
                "Medians over the rounds (min-max)."]
    else:
        head = [f"# Real failures: one of 4 ranks SIGKILLed ({host})", "",
                f"Command: `bench/resilience/real_failures.py --repeat {a.repeat}`; resnet8 width "
                "4, Fashion-MNIST, 1 epoch (234 steps), 4 ranks x 1 thread, configs/laptop.ini; a "
                "random rank killed with kill -9 at a random step in [40, 190), the same in every "
                "method of a round. Medians over the rounds (min-max)."]
    lines = head + ["",
             "| method | steps redone | kill to training again (s) | top-1 | vs failure-free | wall (s) |",
             "|---|---|---|---|---|---|"]

    def cell(vals, fmt):
        vals = sorted(vals)
        return f"{fmt.format(statistics.median(vals))} ({fmt.format(vals[0])}-{fmt.format(vals[-1])})"

    for m in ["none", "states", "ckpt50", "ckpt200"]:
        rs = [r for r in rows if r["method"] == m]
        name = {"none": "failure-free", "states": "emergency states (default)",
                "ckpt50": "restart, checkpoint every 50", "ckpt200": "restart, checkpoint every 200"}[m]
        redone = cell([r["steps_redone"] for r in rs], "{:.0f}") if m != "none" else "-"
        rec = cell([r["recovery_s"] for r in rs], "{:.1f}") if m != "none" else "-"
        top = statistics.median(r["top1"] for r in rs)
        lines.append(f"| {name} | {redone} | {rec} | {cell([r['top1'] for r in rs], '{:.4f}')} | "
                     f"{100 * (top - base):+.2f} pt | {cell([r['wall_s'] for r in rs], '{:.1f}')} |")
    open(out + ".md", "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
