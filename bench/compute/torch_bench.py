"""bench/compute, PyTorch side: the same training step as gg_bench_compute (forward, cross
entropy, backward, SGD momentum 0.9 / weight decay 1e-4) on a torchvision model, images/s as the
median over timed steps after warm-up, peak resident memory. Prints one CSV row in the format of
gg_bench_compute."""
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
    a = ap.parse_args()
    torch.manual_seed(7)
    torch.set_num_threads(a.threads)
    model = build(a.model, a.classes).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    x = torch.randn(a.batch, 3, a.res, a.res)
    y = torch.randint(0, a.classes, (a.batch,))
    times = []
    for s in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
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
    print(f"pytorch-{torch.__version__},{a.model},{a.batch},{a.res},{a.threads},fp32,"
          f"{med:.6g},{a.batch / med:.4g},{peak:.1f},{params}")


if __name__ == "__main__":
    main()
