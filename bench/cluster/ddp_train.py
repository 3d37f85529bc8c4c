#!/usr/bin/env python3
"""PyTorch DDP training for real, the baseline of bench/cluster/real.sh: torchvision's ResNet-18
(its first convolution taking one channel, 10 classes, as gossipgrad builds it for
Fashion-MNIST) on the real Fashion-MNIST (Debian's package), SGD with momentum 0.9 and weight
decay 5e-4 (configs/laptop.ini's), no augmentation, each rank its own shard; DDP over gloo. Prints and writes (rank 0)
the median step time after the warm-up, the steps' times and the last loss.

Launched by MPICH's hydra (PMI_RANK / PMI_SIZE) or torchrun (RANK / WORLD_SIZE); every error is
one line on stderr and exit 1 (2 for bad arguments)."""
import argparse
import datetime
import gzip
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
from launch import launch_env_or_exit  # noqa: E402
from step_watchdog import StepWatchdog  # noqa: E402

import numpy as np
import torch
import torch.distributed as dist
import torchvision

PROG = "ddp_train.py"


def load_images(folder):
    path = os.path.join(folder, "train-images-idx3-ubyte.gz")
    labels = os.path.join(folder, "train-labels-idx1-ubyte.gz")
    try:
        x = np.frombuffer(gzip.open(path).read()[16:], dtype=np.uint8).reshape(-1, 1, 28, 28)
        y = np.frombuffer(gzip.open(labels).read()[8:], dtype=np.uint8)
    except OSError as e:
        sys.exit(f"{PROG}: cannot read Fashion-MNIST in {folder}: {e}")
    x = (x.astype(np.float32) / 255.0 - 0.2860) / 0.3530  # the data set's mean and deviation
    return torch.from_numpy(x), torch.from_numpy(y.astype(np.int64))


def model():
    m = torchvision.models.resnet18(weights=None, num_classes=10)
    m.conv1 = torch.nn.Conv2d(1, 64, kernel_size=7, stride=2, padding=3, bias=False)
    return m


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--batch", type=int, default=32, help="images per rank per step")
    ap.add_argument("--steps", type=int, default=20, help="measured steps")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--channels-last", action="store_true")
    ap.add_argument("--compress", choices=("none", "fp16"), default="none",
                    help="DDP's fp16_compress_hook (default none)")
    ap.add_argument("--master-addr", default="127.0.0.1")
    ap.add_argument("--master-port", type=int, default=29511)
    ap.add_argument("--ifname", default=None, help="GLOO_SOCKET_IFNAME")
    ap.add_argument("--timeout-s", type=float, default=600,
                    help="gloo's collective timeout and the bound on each step (default 600)")
    ap.add_argument("--json-out", default=None)
    a = ap.parse_args()
    if a.batch < 1 or a.steps < 1 or a.warmup < 0 or a.threads < 1:
        print(f"{PROG}: --batch, --steps and --threads must be >= 1, --warmup >= 0",
              file=sys.stderr)
        sys.exit(2)
    if a.ifname:
        os.environ["GLOO_SOCKET_IFNAME"] = a.ifname
    rank, world = launch_env_or_exit(PROG)
    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    x, y = load_images(a.data)
    dist.init_process_group("gloo", init_method=f"tcp://{a.master_addr}:{a.master_port}",
                            rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=a.timeout_s))
    net = model()
    fmt = torch.channels_last if a.channels_last else torch.contiguous_format
    net = net.to(memory_format=fmt)
    ddp = torch.nn.parallel.DistributedDataParallel(net)
    if a.compress == "fp16":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=a.lr, momentum=0.9, weight_decay=5e-4)
    shard = torch.arange(rank, x.shape[0], world)
    gen = torch.Generator().manual_seed(rank + 1)
    times, loss = [], float("nan")
    dist.barrier()
    watchdog = StepWatchdog(PROG, a.timeout_s)
    for step in range(a.warmup + a.steps):
        watchdog.arm(step)
        t0 = time.perf_counter()
        idx = shard[torch.randint(0, shard.numel(), (a.batch,), generator=gen)]
        xb = x[idx].contiguous(memory_format=fmt)
        out = ddp(xb)
        l = torch.nn.functional.cross_entropy(out, y[idx])
        opt.zero_grad(set_to_none=True)
        l.backward()
        opt.step()
        loss = float(l)
        if step >= a.warmup:
            times.append(time.perf_counter() - t0)
    watchdog.stop()
    dist.barrier()
    med = statistics.median(times)
    if rank == 0:
        print(f"{PROG}: resnet18 on {world} ranks, batch {a.batch}, {a.threads} thread(s), "
              f"{'channels_last' if a.channels_last else 'contiguous'}, hook {a.compress}: "
              f"median step {med:.3f} s, {a.batch * world / med:.1f} images/s, last loss "
              f"{loss:.3f}", flush=True)
        if a.json_out:
            with open(a.json_out, "w") as f:
                json.dump({"median_step_s": med, "step_s": times, "loss": loss, "ranks": world,
                           "batch": a.batch, "threads": a.threads,
                           "channels_last": a.channels_last, "compress": a.compress,
                           "torch": torch.__version__}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # one line, not a trace
        print(f"{PROG}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
              file=sys.stderr)
        sys.exit(1)
