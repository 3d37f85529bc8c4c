#!/usr/bin/python3
"""PyTorch DDP (gloo) with emulated compute: the peer baseline for gossipgrad's emulated runs.

Real torch.nn.parallel.DistributedDataParallel, real reducer, real buckets and real gloo
all-reduces over the parameter set (shapes and order) of a real torchvision model; only the
arithmetic of forward, backward and the optimizer is replaced by sleeping, so that 16 ranks
fit on 2 cores. The emulation matches gossipgrad's, per step and rank:

  f = slow(rank) * jitter draw   (jitter: lognormal, median 1, p99 factor J, seeded per rank)
  forward   sleep forward_ms * f
  backward  takes backward_ms * f; the gradient of parameter j (parameters in reverse order,
            as backward completes them) is ready at backward_ms * f * (bytes of the
            parameters after j, j included) / (all bytes) after backward starts, so a DDP
            bucket is ready when its last parameter is, at the byte-proportional time of
            the buckets before it and itself; DDP's hooks all-reduce it while the rest of
            "backward" still sleeps, as in real DDP
  wait      for DDP's all-reduces (loss.backward() returns when they are done)
  update    sleep update_ms * f (no optimizer step)

How: the module's forward sleeps, then chains one autograd node per parameter. Each node's
backward sleeps until its parameter's ready time and returns a fresh, unfilled full-size
gradient; as param.grad is None, autograd takes that tensor over without a copy, and DDP's
own copy (with the 1/world division) into its bucket is the only pass over the bytes, as in
a real DDP step. Sleeping releases the GIL, so gloo's threads run meanwhile. Every rank
draws every rank's factors from the same seeds, so rank 0 knows the slowest rank's compute
per step without communicating.

usage: ddp_emulate.py [options]   (one process per rank: MPICH hydra's PMI_RANK/PMI_SIZE or
torchrun's RANK/WORLD_SIZE; alone, a world of 1). Exit 2 on usage errors, 1 on failures.
"""

import argparse
import datetime
import json
import math
import os
import platform
import socket
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
from launch import launch_env as pylib_launch_env  # noqa: E402
from step_watchdog import StepWatchdog  # noqa: E402

PROG = "ddp_emulate.py"
P99_Z = 2.3263  # the standard normal's 99th percentile


class UsageError(Exception):
    pass


class Failure(Exception):
    """A runtime failure whose message is already the one line to print."""


class Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(message)


def parse_args(argv):
    p = Parser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="resnet50",
                   help="torchvision model whose parameters DDP reduces "
                        "(default resnet50, 1000 classes)")
    p.add_argument("--batch", type=int, default=32,
                   help="images per rank per step; only for images/s (default 32)")
    p.add_argument("--forward-ms", type=float, default=100.0, help="forward time (default 100)")
    p.add_argument("--backward-ms", type=float, default=200.0, help="backward time (default 200)")
    p.add_argument("--update-ms", type=float, default=10.0, help="optimizer time (default 10)")
    p.add_argument("--jitter", default="",
                   help="p99 factor J of the per-step lognormal jitter (median 1); "
                        "1 or empty: none")
    p.add_argument("--slow", default="", help="persistent stragglers RANK:FACTOR,... (e.g. 3:1.5)")
    p.add_argument("--steps", type=int, default=20, help="measured steps (default 20)")
    p.add_argument("--warmup", type=int, default=3,
                   help="steps before measuring (default 3; DDP's first step runs with one "
                        "bucket, its real buckets come after)")
    p.add_argument("--seed", type=int, default=1, help="jitter seed (default 1)")
    p.add_argument("--bucket-cap-mb", type=float, default=None,
                   help="DDP bucket_cap_mb (default: DDP's own, 25)")
    p.add_argument("--compress", choices=("none", "fp16", "bf16", "powersgd"), default="none",
                   help="DDP's communication hook: all-reduce the buckets in fp16 or bf16 "
                        "(torch's fp16_compress_hook / bf16_compress_hook), or PowerSGD "
                        "(powerSGD_hook: rank --powersgd-rank factors with error feedback and "
                        "warm start; default none)")
    p.add_argument("--powersgd-rank", type=int, default=4,
                   help="PowerSGD's matrix_approximation_rank (default 4)")
    p.add_argument("--no-broadcast-buffers", action="store_true",
                   help="DDP broadcast_buffers=False (default: DDP's True, the model's BN buffers)")
    p.add_argument("--master-addr", default=os.environ.get("MASTER_ADDR", "127.0.0.1"),
                   help="rank 0's address for the rendezvous (default $MASTER_ADDR or 127.0.0.1)")
    p.add_argument("--master-port", type=int, default=int(os.environ.get("MASTER_PORT", "29500")),
                   help="rendezvous port (default $MASTER_PORT or 29500)")
    p.add_argument("--timeout-s", type=float, default=60.0,
                   help="rendezvous and per-collective timeout, and the bound on each step (default 60)")
    p.add_argument("--ifname", default=None, help="interface for gloo (sets GLOO_SOCKET_IFNAME)")
    p.add_argument("--json-out", default=None, help="rank 0 writes the results here")
    a = p.parse_args(argv)

    for name in ("forward_ms", "backward_ms", "update_ms"):
        v = getattr(a, name)
        if not (math.isfinite(v) and v >= 0):
            raise UsageError(f"--{name.replace('_', '-')} must be >= 0, not {v}")
    if a.batch < 1:
        raise UsageError(f"--batch must be >= 1, not {a.batch}")
    if a.steps < 1:
        raise UsageError(f"--steps must be >= 1, not {a.steps}")
    if a.warmup < 0:
        raise UsageError(f"--warmup must be >= 0, not {a.warmup}")
    if a.powersgd_rank < 1:
        raise UsageError(f"--powersgd-rank must be >= 1, not {a.powersgd_rank}")
    if a.bucket_cap_mb is not None and not (math.isfinite(a.bucket_cap_mb) and a.bucket_cap_mb > 0):
        raise UsageError(f"--bucket-cap-mb must be > 0, not {a.bucket_cap_mb}")
    if not (0 < a.master_port < 65536):
        raise UsageError(f"--master-port must be in 1..65535, not {a.master_port}")
    if not (math.isfinite(a.timeout_s) and a.timeout_s > 0):
        raise UsageError(f"--timeout-s must be > 0, not {a.timeout_s}")
    a.jitter_p99 = parse_jitter(a.jitter)
    a.slow_factors = parse_slow(a.slow)
    if a.json_out is not None:
        folder = os.path.dirname(os.path.abspath(a.json_out))
        if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
            raise UsageError(f"--json-out {a.json_out}: folder {folder} is missing or not writable")
    return a


def parse_jitter(text):
    if text.strip() == "":
        return 1.0
    try:
        j = float(text)
    except ValueError:
        raise UsageError(f"--jitter '{text}' is not a number (a p99 factor >= 1, e.g. 1.3)")
    if not (math.isfinite(j) and j >= 1):
        raise UsageError(f"--jitter must be a p99 factor >= 1 (1: none), not {text}")
    return j


def parse_slow(text):
    factors = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        rank, sep, factor = item.partition(":")
        try:
            r, f = int(rank), float(factor)
        except ValueError:
            r, f = -1, float("nan")
        if not sep or r < 0 or not (math.isfinite(f) and f > 0):
            raise UsageError(f"--slow item '{item}' is not RANK:FACTOR (rank >= 0, factor > 0)")
        if r in factors:
            raise UsageError(f"--slow names rank {r} twice")
        factors[r] = f
    return factors


def launch_env():
    """(rank, world size) from MPICH hydra's PMI_* or torchrun's RANK/WORLD_SIZE; else (0, 1)."""
    try:
        return pylib_launch_env()
    except ValueError as e:
        raise UsageError(str(e))


def compute_factors(args, world, total_steps):
    """factors[r][s]: rank r's compute factor at step s, the same on every rank."""
    import numpy as np

    sigma = math.log(args.jitter_p99) / P99_Z
    rows = []
    for r in range(world):
        slow = args.slow_factors.get(r, 1.0)
        if sigma > 0:
            rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([args.seed, r])))
            rows.append(slow * rng.lognormal(0.0, sigma, total_steps))
        else:
            rows.append(np.full(total_steps, slow))
    return np.stack(rows)


def model_layout(name):
    """[(shape, dtype)] of the torchvision model's parameters and of its buffers, in order."""
    import torch
    import torchvision

    if name not in torchvision.models.list_models():
        raise UsageError(
            f"--model {name}: not a torchvision model (e.g. resnet50, resnet18, vgg16)")
    with torch.no_grad():
        model = torchvision.models.get_model(name, weights=None)
    params = [(tuple(p.shape), p.dtype) for p in model.parameters()]
    buffers = [(tuple(b.shape), b.dtype) for b in model.buffers()]
    return params, buffers


def make_emulated_module(params, buffers, forward_ms, backward_ms):
    import torch

    class StepClock:
        """What the current step's backward nodes need: when backward started, and f."""
        backward_start = 0.0
        factor = 1.0

    class GradientReady(torch.autograd.Function):
        """Passes x through; in backward, the parameter's gradient is ready at its time."""

        @staticmethod
        def forward(ctx, x, param, ready_fraction):
            ctx.shape = param.shape
            ctx.ready_fraction = ready_fraction
            return x.clone()

        @staticmethod
        def backward(ctx, grad_x):
            ready_at = (StepClock.backward_start
                        + backward_ms / 1e3 * StepClock.factor * ctx.ready_fraction)
            wait = ready_at - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            grad_x = grad_x if ctx.needs_input_grad[0] else None
            return grad_x, torch.empty(ctx.shape), None

    class EmulatedModel(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weights = torch.nn.ParameterList(
                torch.nn.Parameter(torch.zeros(shape, dtype=dtype)) for shape, dtype in params)
            for i, (shape, dtype) in enumerate(buffers):
                self.register_buffer(f"buffer{i}", torch.zeros(shape, dtype=dtype))
            # Backward completes the parameters last to first: parameter j's gradient is
            # ready when the bytes of parameters j..end are done.
            sizes = [p.numel() * p.element_size() for p in self.weights]
            total = sum(sizes)
            after = 0
            self.ready_fraction = [0.0] * len(sizes)
            for j in reversed(range(len(sizes))):
                after += sizes[j]
                self.ready_fraction[j] = after / total

        def forward(self, x):
            time.sleep(forward_ms / 1e3 * StepClock.factor)
            for param, fraction in zip(self.weights, self.ready_fraction):
                x = GradientReady.apply(x, param, fraction)
            return x

    return EmulatedModel(), StepClock


def percentile(values, q):
    import numpy as np

    return float(np.percentile(np.asarray(values), q))


def write_json_atomically(path, obj):
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def first_line(exc):
    lines = [s.strip() for s in str(exc).splitlines() if s.strip()]
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def run(args, rank, world):
    # c10d logs a failed rendezvous itself, in glog lines; the one line below says it all.
    # TORCH_CPP_LOG_LEVEL=WARNING (or INFO) in the environment brings them back.
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")
    try:
        import importlib

        for needed in ("numpy", "torchvision"):
            importlib.import_module(needed)
        import torch
        import torch.distributed as dist
    except ImportError as e:
        raise Failure(f"needs PyTorch, torchvision and numpy for /usr/bin/python3 ({e})")

    for r in args.slow_factors:
        if r >= world:
            raise UsageError(f"--slow names rank {r}, but the world has {world} ranks")
    if args.ifname is not None:
        try:
            socket.if_nametoindex(args.ifname)
        except OSError:
            raise UsageError(f"--ifname {args.ifname}: no such interface in this network namespace")
        os.environ["GLOO_SOCKET_IFNAME"] = args.ifname
    torch.set_num_threads(1)  # many ranks share few cores; the emulation needs no intra-op threads

    params, buffers = model_layout(args.model)
    total_steps = args.warmup + args.steps
    factors = compute_factors(args, world, total_steps)
    module, clock = make_emulated_module(params, buffers, args.forward_ms, args.backward_ms)
    grad_bytes = sum(p.numel() * p.element_size() for p in module.weights)
    buffer_bytes = sum(b.numel() * b.element_size() for b in module.buffers())

    # gloo aborts (op.preamble.length <= op.nbytes) or hangs when PowerSGD's hook runs over
    # several buckets in flight, under Debian's torch 1.13 and PyPI's 2.15 alike (2026-11-29).
    if args.compress == "powersgd" and (args.bucket_cap_mb or 25.0) * 2**20 < grad_bytes:
        raise UsageError(f"--compress powersgd needs one bucket: --bucket-cap-mb >= "
                         f"{math.ceil(grad_bytes / 2**20)} for {args.model} (gloo aborts or hangs "
                         "with several PowerSGD buckets in flight)")
    where = f"{args.master_addr}:{args.master_port}"
    try:
        dist.init_process_group("gloo", init_method=f"tcp://{where}", rank=rank,
                                world_size=world,
                                timeout=datetime.timedelta(seconds=args.timeout_s))
    except Exception as e:
        raise Failure(f"rendezvous of {world} ranks at {where} failed "
                           f"(timeout {args.timeout_s:g} s): {first_line(e)}")

    ddp_kwargs = dict(gradient_as_bucket_view=True,
                      broadcast_buffers=not args.no_broadcast_buffers)
    if args.bucket_cap_mb is not None:
        ddp_kwargs["bucket_cap_mb"] = args.bucket_cap_mb
    ddp = torch.nn.parallel.DistributedDataParallel(module, **ddp_kwargs)
    if args.compress == "powersgd":
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
        # Compressed from the warm-up's second step on (DDP's first step has one bucket).
        state = psgd.PowerSGDState(process_group=None,
                                   matrix_approximation_rank=args.powersgd_rank,
                                   start_powerSGD_iter=2, use_error_feedback=True,
                                   warm_start=True)
        ddp.register_comm_hook(state, psgd.powerSGD_hook)
    elif args.compress != "none":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        hook = {"fp16": default_hooks.fp16_compress_hook,
                "bf16": getattr(default_hooks, "bf16_compress_hook", None)}[args.compress]
        if hook is None:
            raise UsageError(f"--compress bf16: torch {torch.__version__} has no bf16_compress_hook")
        ddp.register_comm_hook(None, hook)
    bucket_cap_mb = args.bucket_cap_mb if args.bucket_cap_mb is not None else 25.0

    if rank == 0:
        print(f"{PROG}: {args.model} ({sum(p.numel() for p in module.weights)} parameters, "
              f"{grad_bytes / 1e6:.1f} MB of gradients), DDP gloo, {world} ranks, bucket cap "
              f"{bucket_cap_mb:g} MB; emulated compute {args.forward_ms:g}+{args.backward_ms:g}"
              f"+{args.update_ms:g} ms, jitter p99 {args.jitter_p99:g}, slow "
              f"{args.slow or 'none'}; torch {torch.__version__} on {platform.node()}",
              flush=True)

    step_s, compute_s = [], []
    x = torch.zeros(1)
    every = max(1, args.steps // 10)
    dist.barrier()
    last = time.perf_counter()
    watchdog = StepWatchdog(PROG, args.timeout_s)
    for step in range(total_steps):
        watchdog.arm(step)
        clock.factor = float(factors[rank][step])
        loss = ddp(x)
        clock.backward_start = time.perf_counter()
        loss.backward()  # returns once DDP's all-reduces are done
        time.sleep(args.update_ms / 1e3 * clock.factor)
        for p in module.weights:
            p.grad = None
        now = time.perf_counter()
        if step >= args.warmup:
            step_s.append(now - last)
            slowest = float(factors[:, step].max())
            compute_s.append((args.forward_ms + args.backward_ms + args.update_ms) / 1e3 * slowest)
            n = len(step_s)
            if rank == 0 and (n % every == 0 or n == args.steps):
                print(f"step {n}/{args.steps}: {step_s[-1]:.3f} s (compute {compute_s[-1]:.3f} s), "
                      f"median {percentile(step_s, 50):.3f} s", flush=True)
        last = now
    watchdog.stop()

    logging_data = {}
    try:
        logging_data = ddp._get_ddp_logging_data()
    except Exception:
        pass
    # DDP's first step runs one bucket; its buckets (by arrival order) come from then on.
    sizes = logging_data.get("rebuilt_bucket_sizes") or logging_data.get("bucket_sizes") or ""
    bucket_bytes = [int(b) for b in sizes.replace(",", " ").split()]
    dist.barrier()
    dist.destroy_process_group()

    if rank != 0:
        return
    median = percentile(step_s, 50)
    compute = percentile(compute_s, 50)
    result = {
        "emulated": True,
        "model": args.model,
        "param_count": sum(p.numel() for p in module.weights),
        "param_tensors": len(params),
        "gradient_bytes": grad_bytes,
        "buffer_bytes": buffer_bytes,
        "ddp_bucket_cap_mb": bucket_cap_mb,
        "ddp_bucket_bytes": bucket_bytes,
        "ddp_gradient_as_bucket_view": True,
        "ddp_broadcast_buffers": not args.no_broadcast_buffers,
        "backend": "gloo",
        "compress": args.compress,
        "world_size": world,
        "batch": args.batch,
        "forward_ms": args.forward_ms,
        "backward_ms": args.backward_ms,
        "update_ms": args.update_ms,
        "jitter_p99": args.jitter_p99,
        "slow": {str(r): f for r, f in sorted(args.slow_factors.items())},
        "seed": args.seed,
        "steps": args.steps,
        "warmup": args.warmup,
        "step_s": step_s,
        "compute_s_per_step": compute_s,
        "median_step_s": median,
        "p90_step_s": percentile(step_s, 90),
        "compute_s": compute,
        "exposed_comm_s": median - compute,
        "images_per_s": args.batch * world / median,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "host": platform.node(),
        "ifname": args.ifname,
    }
    print(f"{PROG}: {args.model} on {world} ranks: median step {median:.3f} s "
          f"(p90 {result['p90_step_s']:.3f}), compute {compute:.3f} s, exposed comm "
          f"{median - compute:.3f} s, {result['images_per_s']:.1f} images/s", flush=True)
    if args.json_out:
        write_json_atomically(args.json_out, result)


def main(argv):
    try:
        args = parse_args(argv)
        rank, world = launch_env()
        run(args, rank, world)
    except UsageError as e:
        print(f"{PROG}: {e} (see {PROG} --help)", file=sys.stderr)
        return 2
    except Failure as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 1
    except Exception as e:
        print(f"{PROG}: {first_line(e)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
