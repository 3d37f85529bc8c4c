#!/usr/bin/env python3
"""The main job's recipe under PyTorch DDP (gloo): gossipgrad's resnet8 on the real Fashion-MNIST,
every setting read from the settings gossipgrad itself resolved (`gossipgrad train --config
configs/laptop.ini ... --dry-run` prints them as INI; bench/mainjob/run.sh passes that file as
--settings), so both sides run one recipe. Launched by MPICH's hydra (PMI_RANK / PMI_SIZE, as
bench/cluster/ddp_train.py) or torchrun (RANK / WORLD_SIZE).

What matches gossipgrad (kernels/models.cpp, kernels/optimizer.cpp, shuffle/loader.cpp,
gossip/train/{trainer,data,loop,step_hooks}.cpp):
- model: resnet8 (3x3 stem conv without bias + BN + ReLU, one torchvision BasicBlock per stage
  at width, 2x and 4x width, strides 1/2/2, 1x1 conv + BN downsample where the shape changes,
  global average pool, FC), torchvision's state_dict names (gossipgrad's model.npz loads with
  strict=True); BN eps 1e-5, momentum 0.1, running_var unbiased.
- init: convolutions normal(0, sqrt(2 / fan_out)) (Kaiming fan-out, torchvision's), BN weight 1
  and bias 0, FC weight and bias U(-1/sqrt(fan_in), 1/sqrt(fan_in)); seeded with train.seed,
  every rank starts from rank 0's weights (DDP broadcasts them).
- loss: softmax cross entropy, the mean over the rank's batch; DDP averages the gradients over
  the ranks (at 2 ranks gossip's partner average is the same average).
- SGD as torch.optim.SGD (gossipgrad implements PyTorch's update): momentum, Nesterov, weight
  decay added to the gradient of EVERY parameter, batch-norm weights and biases and the FC bias
  included (gossipgrad decays its one flat parameter buffer).
- learning rate: peak train.lr * global batch / train.base_batch, set per step: linear warm-up
  peak * (s + 1) / W over W = round(train.warmup_epochs * steps per epoch) steps, then cosine
  from peak to 0 over the remaining steps of the run (train.max_steps shortens the run and the
  schedule alike, as in gossipgrad).
- data: x = (pixel / 255 - mean) / std with the mean and std of the training set's pixels; per
  epoch a permutation of the 60,000 training images, each rank its contiguous 1/p slice of it,
  floor(slice / batch) full batches (the rest dropped); augmentation (data.augment) a random crop
  with zero padding 2 (the border is pixel 0, before normalisation) and a horizontal flip with
  probability 1/2, per image.
- evaluation after every epoch and after the last step, on the 10,000 test images, of the ranks'
  average model: parameters and batch-norm running statistics averaged over the ranks, each rank
  evaluating its ceil(n / p) slice in batches of train.eval_batch, the sums all-reduced; the
  ranks' own statistics are put back afterwards. DDP does not sync the buffers in forward
  (forward_sync_buffers=False, broadcast_buffers=False before 2.x's rename) so that each rank's
  running statistics track its own batches, as gossipgrad's do (and DDP saves a broadcast per
  step).
- threads: train.threads, or (0) the machine's cores over the ranks on this node, as gossipgrad
  (all online cores, as std::thread::hardware_concurrency counts them, not the ones a rank is
  bound to); the launcher's binding (run.sh: hydra's -bind-to core, as quickstart.sh) is the
  same for both.
- images/s: as gossipgrad's summary: the global batch times the steps over the sum of the step
  times, a step's time running from the end of the previous step (batch assembly included) and
  evaluation left out; the first steps are counted.

What differs: the random streams (permutation, crops, flips, initial weights are drawn from
torch's generators, not gossipgrad's mt19937 streams: same distributions, other draws); the batch
is assembled on the training thread (gossipgrad's loader thread builds it ahead; its time is
reported as data_s); DDP's default bucket (25 MB: resnet8's gradients travel as one bucket after
backward) against gossipgrad's 128 KB buckets sent during backward.

Every error is one line on stderr: exit 2 for bad arguments or settings this script does not
implement, 1 for a failure while running."""
import argparse
import configparser
import datetime
import gzip
import inspect
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
from launch import launch_env_or_exit  # noqa: E402
from step_watchdog import StepWatchdog  # noqa: E402

PROG = "ddp_resnet8.py"


class Refusal(Exception):
    """A setting or argument this script cannot run: one line, exit 2."""


# ---------------------------------------------------------------- the model (no torch at import
# time outside these functions, so that --help and refusals are fast)


def resnet8(width, channels, classes):
    import torch
    from torch import nn

    class BasicBlock(nn.Module):
        """torchvision's BasicBlock: conv3x3-bn-relu-conv3x3-bn (+ downsample) + identity, relu."""

        def __init__(self, cin, cout, stride):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.relu = nn.ReLU(inplace=True)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.downsample = None
            if stride != 1 or cin != cout:
                self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, 0, bias=False),
                                                nn.BatchNorm2d(cout))

        def forward(self, x):
            y = self.relu(self.bn1(self.conv1(x)))
            y = self.bn2(self.conv2(y))
            return self.relu(y + (x if self.downsample is None else self.downsample(x)))

    class ResNet8(nn.Module):
        """gossipgrad's resnet8 (kernels/models.cpp): 3x3 stem, one BasicBlock per stage, FC."""

        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(channels, width, 3, 1, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(width)
            self.relu = nn.ReLU(inplace=True)
            self.layer1 = nn.Sequential(BasicBlock(width, width, 1))
            self.layer2 = nn.Sequential(BasicBlock(width, 2 * width, 2))
            self.layer3 = nn.Sequential(BasicBlock(2 * width, 4 * width, 2))
            self.avgpool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(4 * width, classes)

        def forward(self, x):
            x = self.relu(self.bn1(self.conv1(x)))
            x = self.layer3(self.layer2(self.layer1(x)))
            return self.fc(torch.flatten(self.avgpool(x), 1))

    net = ResNet8()
    with torch.no_grad():  # gossipgrad's init_params
        for m in net.modules():
            if isinstance(m, nn.Conv2d):
                fan_out = m.weight.shape[0] * m.weight.shape[2] * m.weight.shape[3]
                m.weight.normal_(0.0, math.sqrt(2.0 / fan_out))
            elif isinstance(m, nn.BatchNorm2d):
                m.weight.fill_(1.0)
                m.bias.zero_()
            elif isinstance(m, nn.Linear):
                bound = 1.0 / math.sqrt(m.weight.shape[1])
                m.weight.uniform_(-bound, bound)
                m.bias.uniform_(-bound, bound)
    return net


# ---------------------------------------------------------------- the settings


def load_settings(path):
    """The INI that `gossipgrad train --dry-run` prints; refuses what this script does not run."""
    cp = configparser.ConfigParser(interpolation=None)
    try:
        with open(path) as f:
            cp.read_file(f)
    except (OSError, configparser.Error) as e:
        raise Refusal(f"--settings {path}: cannot read it as gossipgrad's resolved INI ({e})")

    def get(section, key):
        try:
            return cp.get(section, key).strip()
        except configparser.Error:
            raise Refusal(f"--settings {path}: no {section}.{key} (not `gossipgrad train "
                          f"--dry-run` output?)")

    def num(section, key, kind=float):
        v = get(section, key)
        try:
            return kind(v)
        except ValueError:
            raise Refusal(f"--settings {path}: {section}.{key} = '{v}' is not a number")

    def flag(section, key):
        v = get(section, key).lower()
        if v not in ("true", "false"):
            raise Refusal(f"--settings {path}: {section}.{key} = '{v}' is not true or false")
        return v == "true"

    s = {
        "source": get("data", "source"), "dir": get("data", "dir"),
        "augment": flag("data", "augment"), "shuffle": get("data", "shuffle"),
        "model": get("model", "name"), "width": num("model", "width", int),
        "batch_norm": flag("model", "batch_norm"), "precision": get("train", "precision"),
        "batch": num("train", "batch", int), "epochs": num("train", "epochs", int),
        "lr": num("train", "lr"), "base_batch": num("train", "base_batch", int),
        "momentum": num("train", "momentum"), "weight_decay": num("train", "weight_decay"),
        "nesterov": flag("train", "nesterov"), "warmup_epochs": num("train", "warmup_epochs"),
        "seed": num("train", "seed", int), "threads": num("train", "threads", int),
        "max_steps": num("train", "max_steps", int), "eval_batch": num("train", "eval_batch", int),
        "init_from": get("train", "init_from"), "virtual_ranks": num("train", "virtual_ranks", int),
        "stop_at": num("train", "stop_at", int), "interval": num("log", "interval"),
    }
    # What the DDP side implements; anything else would run another recipe under the same name.
    wants = [
        (s["source"] == "fashion-mnist", f"data.source = {s['source']}: only fashion-mnist"),
        (s["shuffle"] == "off", f"data.shuffle = {s['shuffle']}: only off (a per-epoch "
                                "permutation, each rank its slice)"),
        (s["model"] == "resnet8", f"model.name = {s['model']}: only resnet8"),
        (s["batch_norm"], "model.batch_norm = false: only resnet8 with batch norm"),
        (s["precision"] == "fp32", f"train.precision = {s['precision']}: only fp32"),
        (s["init_from"] == "", "train.init_from: only a random initialisation"),
        (s["virtual_ranks"] == 0, "train.virtual_ranks: only real ranks"),
        (s["stop_at"] == 0, "train.stop_at: only whole runs"),
        (s["batch"] >= 1 and s["epochs"] >= 1 and s["eval_batch"] >= 1 and s["width"] >= 1,
         "train.batch, train.epochs, train.eval_batch and model.width must be >= 1"),
    ]
    for ok, why in wants:
        if not ok:
            raise Refusal(f"--settings {path}: {why}; run.sh's DDP peer runs laptop.ini's recipe")
    return s


# ---------------------------------------------------------------- the data


def read_idx(path, header):
    try:
        with gzip.open(path) as f:
            return f.read()[header:]
    except OSError as e:
        raise Refusal(f"cannot read {path}: {e} (Debian: apt-get install dataset-fashion-mnist)")


def load_split(folder, prefix):
    import numpy as np
    import torch

    x = np.frombuffer(read_idx(os.path.join(folder, f"{prefix}-images-idx3-ubyte.gz"), 16),
                      dtype=np.uint8)
    y = np.frombuffer(read_idx(os.path.join(folder, f"{prefix}-labels-idx1-ubyte.gz"), 8),
                      dtype=np.uint8)
    if x.size != y.size * 28 * 28:
        raise Refusal(f"{folder}: {prefix} images and labels disagree ({x.size} bytes for "
                      f"{y.size} labels)")
    return torch.from_numpy(x.reshape(-1, 1, 28, 28).copy()), torch.from_numpy(y.astype(np.int64))


def normaliser(train_x):
    """A 256-entry table pixel -> (pixel/255 - mean) / std, the training set's mean and std of
    pixel/255 (gossipgrad's pixel_statistics)."""
    import torch

    counts = torch.bincount(train_x.flatten(), minlength=256).double()
    v = torch.arange(256, dtype=torch.float64) / 255.0
    n = counts.sum()
    mean = float((counts * v).sum() / n)
    std = math.sqrt(max(1e-12, float((counts * v * v).sum() / n) - mean * mean))
    return ((v - mean) / std).float(), mean, std


def augmented_batch(xu8, lut, gen, augment, pad=2):
    """uint8 (B,1,H,W) -> normalised float, with gossipgrad's random crop (zero padding `pad`,
    the border pixel 0 before normalisation) and horizontal flip, per image."""
    import torch
    import torch.nn.functional as F

    x = lut[xu8.long()]
    if not augment:
        return x
    b, _, h, w = x.shape
    xp = F.pad(x, (pad, pad, pad, pad), value=float(lut[0]))
    dy = torch.randint(0, 2 * pad + 1, (b,), generator=gen)
    dx = torch.randint(0, 2 * pad + 1, (b,), generator=gen)
    flip = torch.randint(0, 2, (b,), generator=gen).bool()
    cols = torch.arange(w).expand(b, w)
    cols = torch.where(flip[:, None], cols.flip(1), cols) + dx[:, None]
    rows = torch.arange(h).expand(b, h) + dy[:, None]
    out = xp[torch.arange(b)[:, None, None], 0, rows[:, :, None], cols[:, None, :]]
    return out.unsqueeze(1)


# ---------------------------------------------------------------- the run


def ranks_on_node(world):
    for k in ("MPI_LOCALNRANKS", "LOCAL_WORLD_SIZE"):
        if os.environ.get(k, "").isdigit() and int(os.environ[k]) > 0:
            return int(os.environ[k])
    return world


def lr_at(step, peak, warmup, total):
    """gossipgrad's LrSchedule::at (kernels/optimizer.cpp), final fraction 0."""
    if step < warmup:
        return peak * (step + 1) / warmup
    span = max(1, total - warmup)
    t = min(1.0, max(0.0, (step - warmup) / span))
    return peak * 0.5 * (1.0 + math.cos(math.pi * t))


def run(a, s):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    rank, world = launch_env_or_exit(PROG)
    threads = s["threads"] if s["threads"] > 0 else max(1, (os.cpu_count() or 1) // ranks_on_node(world))
    torch.set_num_threads(threads)
    t_start = time.perf_counter()
    train_x, train_y = load_split(s["dir"], "train")
    test_x, test_y = load_split(s["dir"], "t10k")
    lut, mean, std = normaliser(train_x)
    per = train_x.shape[0] // world
    per_epoch = per // s["batch"]
    if per_epoch < 1:
        raise Refusal(f"train.batch = {s['batch']} is too large: {train_x.shape[0]} samples over "
                      f"{world} ranks give no full batch")
    total = per_epoch * s["epochs"]
    if s["max_steps"] > 0:
        total = min(total, s["max_steps"])
    global_batch = s["batch"] * world
    peak = s["lr"] * global_batch / s["base_batch"]
    warmup = int(math.floor(s["warmup_epochs"] * per_epoch + 0.5))  # llround

    if "GLOO_SOCKET_IFNAME" not in os.environ:
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # one node: loopback, whatever the hostname
    dist.init_process_group("gloo", init_method=f"file://{os.path.abspath(a.store)}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=a.timeout_s))
    torch.manual_seed(s["seed"])
    net = resnet8(s["width"], 1, 10)
    params = sum(p.numel() for p in net.parameters())
    fmt = torch.channels_last if a.channels_last else torch.contiguous_format
    net = net.to(memory_format=fmt)
    # Each rank's running statistics its own (the initial ones are equal on every rank anyway):
    # forward_sync_buffers=False where DDP has it (it deprecates broadcast_buffers), else
    # broadcast_buffers=False (PyTorch 1.13).
    DDP = torch.nn.parallel.DistributedDataParallel
    no_sync = ("forward_sync_buffers" if "forward_sync_buffers" in inspect.signature(DDP).parameters
               else "broadcast_buffers")
    ddp = DDP(net, **{no_sync: False})
    opt = torch.optim.SGD(ddp.parameters(), lr=peak, momentum=s["momentum"],
                          nesterov=s["nesterov"], weight_decay=s["weight_decay"])
    aug_gen = torch.Generator().manual_seed(s["seed"] * 1000003 + rank + 1)

    def evaluate():
        """The ranks' average model on the test set (parameters and running statistics averaged,
        this rank's own put back after)."""
        own = {k: v.detach().clone() for k, v in net.state_dict().items()}
        with torch.no_grad():
            for k, v in net.state_dict().items():
                if v.is_floating_point():
                    dist.all_reduce(v)
                    v.div_(world)
        net.eval()
        n = test_x.shape[0]
        share = (n + world - 1) // world
        lo, hi = min(n, rank * share), min(n, (rank + 1) * share)
        eb = max(1, min(s["eval_batch"], share))
        sums = torch.zeros(3, dtype=torch.float64)  # loss sum, correct, samples
        with torch.no_grad():
            for i in range(lo, hi, eb):
                xb = lut[test_x[i:min(hi, i + eb)].long()].contiguous(memory_format=fmt)
                yb = test_y[i:min(hi, i + eb)]
                out = net(xb)
                sums[0] += float(F.cross_entropy(out, yb, reduction="sum"))
                sums[1] += float((out.argmax(1) == yb).sum())
                sums[2] += yb.numel()
        dist.all_reduce(sums)
        net.train()
        net.load_state_dict(own)
        return float(sums[1] / sums[2]), float(sums[0] / sums[2])

    if rank == 0:
        print(f"{PROG}: torch {torch.__version__}, {world} ranks x {threads} threads, resnet8 "
              f"width {s['width']} ({params} params), "
              f"{'channels_last' if a.channels_last else 'contiguous'}, DDP over gloo; "
              f"{train_x.shape[0]} train / {test_x.shape[0]} test samples, pixel mean {mean:.6f} "
              f"std {std:.6f}, global batch {global_batch}, {per_epoch} steps/epoch, {total} steps, "
              f"peak lr {peak:.4g}, warm-up {warmup} steps", flush=True)
    losses, evals = [], []
    train_s = data_s = 0.0
    step = 0
    last_print = -1e9
    dist.barrier()
    since = time.perf_counter()
    watchdog = StepWatchdog(PROG, a.timeout_s)
    for epoch in range((total + per_epoch - 1) // per_epoch):
        pg = torch.Generator().manual_seed(s["seed"] * 1000003 + 7919 * (epoch + 1))
        order = torch.randperm(train_x.shape[0], generator=pg)[rank * per:(rank + 1) * per]
        for i in range(per_epoch):
            if step >= total:
                break
            watchdog.arm(step)  # its evaluation, if any, counts to the step
            t0 = time.perf_counter()
            idx = order[i * s["batch"]:(i + 1) * s["batch"]]
            xb = augmented_batch(train_x[idx], lut, aug_gen, s["augment"]).contiguous(
                memory_format=fmt)
            yb = train_y[idx]
            data_s += time.perf_counter() - t0
            lr = lr_at(step, peak, warmup, total)
            for g in opt.param_groups:
                g["lr"] = lr
            loss = F.cross_entropy(ddp(xb), yb)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(float(loss))
            now = time.perf_counter()
            train_s += now - since
            since = now
            step += 1
            if rank == 0 and (now - last_print >= s["interval"] or step == total):
                last_print = now
                ips = global_batch * step / train_s
                print(f"step {step:6d}/{total}  epoch {epoch + 1}  loss {losses[-1]:.4f}  lr "
                      f"{lr:.4f}  {ips:.0f} img/s", flush=True)
            if step % per_epoch == 0 or step == total:
                top1, test_loss = evaluate()
                evals.append({"epoch": epoch + 1, "step": step, "top1": top1, "loss": test_loss})
                if rank == 0:
                    print(f"epoch {epoch + 1}: test top-1 {100 * top1:.2f}%  loss {test_loss:.4f}",
                          flush=True)
                since = time.perf_counter()  # evaluation is not training time
    watchdog.stop()
    dist.barrier()
    result = {
        "torch": torch.__version__, "ranks": world, "threads": threads, "params": params,
        "channels_last": a.channels_last, "steps": step, "steps_per_epoch": per_epoch,
        "global_batch": global_batch, "train_s": train_s, "data_s": data_s,
        "images_per_s": global_batch * step / train_s if train_s > 0 else 0.0,
        "top1": evals[-1]["top1"] if evals else None, "evals": evals, "losses": losses,
        "wall_s": time.perf_counter() - t_start, "peak_lr": peak, "warmup_steps": warmup,
        "pixel_mean": mean, "pixel_std": std,
    }
    if rank == 0:
        print(f"{PROG}: done: {step} steps, {result['images_per_s']:.0f} img/s (training time "
              f"{train_s:.1f} s, of which batch assembly {data_s:.1f} s), final test top-1 "
              f"{100 * result['top1']:.2f}%", flush=True)
        if a.json_out:
            tmp = a.json_out + ".tmp"
            with open(tmp, "w") as f:
                json.dump(result, f)
            os.replace(tmp, a.json_out)
    dist.destroy_process_group()


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2
        print(f"{PROG}: {message} (see --help)", file=sys.stderr)
        sys.exit(2)


def main(argv):
    ap = Parser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--settings", required=True,
                    help="gossipgrad's resolved settings (gossipgrad train ... --dry-run > FILE)")
    ap.add_argument("--store", required=True,
                    help="a file path that does not exist yet: the ranks' rendezvous (FileStore)")
    ap.add_argument("--channels-last", action="store_true", help="model and inputs channels_last")
    ap.add_argument("--json-out", default=None, help="rank 0 writes the result here")
    ap.add_argument("--timeout-s", type=float, default=600,
                    help="gloo's collective timeout and the bound on each step")
    a = ap.parse_args(argv)
    try:
        s = load_settings(a.settings)
        run(a, s)
    except Refusal as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # one line, not a trace
        text = str(e).splitlines()[0] if str(e) else ""
        print(f"{PROG}: {type(e).__name__}: {text}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
