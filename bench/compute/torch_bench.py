"""bench/compute, PyTorch side: the same training step as gg_bench_compute (forward, cross
entropy, backward, SGD momentum 0.9 / weight decay 1e-4) on a torchvision model, images/s as the
median over timed steps after warm-up, peak resident memory. Prints one CSV row in the format of
gg_bench_compute; its impl is pytorch-VERSION, with -channels_last when --channels-last.

--device cpu (the default): --precision fp32, or bf16 (the forward under
torch.autocast("cpu", bfloat16) with fp32 weights, as a PyTorch user runs bf16 on a CPU).

--device cuda: the GPU baseline. The input and labels live on the GPU, cudnn.benchmark is on,
every step ends in torch.cuda.synchronize(); --precision fp32 turns TF32 off for convolutions and
matmuls, tf32 turns it on for both, bf16 runs the forward under torch.autocast(bfloat16) with
fp32 weights; --channels-last puts the model and the input in channels_last.

--compile: the model under torch.compile and the optimizer step compiled too (PyTorch 2.x, as a
user tuning for speed runs it); the compilation happens in the warm-up steps, which are not timed
(at least 2 warm-up steps are asked for). Its impl gets -compiled."""
import argparse
import resource
import sys
import time

import torch
import torch.nn.functional as F
import torchvision


def build(name, classes):
    if name == "googlenet":
        return torchvision.models.googlenet(
            weights=None, aux_logits=False, init_weights=True, num_classes=classes
        )
    if not hasattr(torchvision.models, name):
        sys.exit(f"torch_bench.py: torchvision has no model '{name}'")
    return getattr(torchvision.models, name)(weights=None, num_classes=classes)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--res", type=int, default=224)
    ap.add_argument("--classes", type=int, default=1000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--precision", default="fp32", choices=["fp32", "tf32", "bf16"])
    ap.add_argument("--channels-last", action="store_true")
    ap.add_argument("--compile", action="store_true")
    a = ap.parse_args()
    if a.compile and not hasattr(torch, "compile"):
        sys.exit(f"torch_bench.py: --compile needs PyTorch 2.x; this is {torch.__version__}")
    if a.compile and a.warmup < 2:
        sys.exit("torch_bench.py: --compile compiles in the warm-up steps: give --warmup 2 or more")
    if a.device == "cpu" and a.precision == "tf32":
        sys.exit("torch_bench.py: tf32 is a GPU precision; on the CPU use fp32 or bf16")
    torch.manual_seed(7)
    torch.set_num_threads(a.threads)
    dev = torch.device(a.device)
    gpu = a.device == "cuda"
    if gpu:
        torch.backends.cudnn.benchmark = True
        torch.backends.cudnn.allow_tf32 = a.precision == "tf32"
        torch.backends.cuda.matmul.allow_tf32 = a.precision == "tf32"
    fmt = torch.channels_last if a.channels_last else torch.contiguous_format
    model = build(a.model, a.classes).train().to(dev, memory_format=fmt)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    forward, update = model, opt.step
    if a.compile:
        forward = torch.compile(model)
        update = torch.compile(opt.step)
    x = torch.randn(a.batch, 3, a.res, a.res, device=dev).contiguous(memory_format=fmt)
    y = torch.randint(0, a.classes, (a.batch,), device=dev)
    times = []
    for s in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast(a.device, dtype=torch.bfloat16, enabled=a.precision == "bf16"):
            loss = F.cross_entropy(forward(x), y)
        loss.backward()
        update()
        if gpu:
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        if s >= a.warmup:
            times.append(dt)
        print(f"\rtorch_bench {a.model}: step {s + 1}/{a.warmup + a.steps} {dt:.3f} s",
              end="", file=sys.stderr)
    print(file=sys.stderr)
    times.sort()
    med = times[len(times) // 2]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    params = sum(p.numel() for p in model.parameters())
    if gpu:
        print(f"# torch {torch.__version__} on {torch.cuda.get_device_name()}, peak device "
              f"memory {torch.cuda.max_memory_allocated() / 2**20:.0f} MiB", file=sys.stderr)
    impl = (f"pytorch-{torch.__version__}" + ("-channels_last" if a.channels_last else "") +
            ("-compiled" if a.compile else ""))
    print(f"{impl},{a.model},{a.batch},{a.res},{a.threads},{a.precision},"
          f"{med:.6g},{a.batch / med:.4g},{peak:.1f},{params}")


if __name__ == "__main__":
    main()
