"""bench/loader baseline: torchvision transforms + PIL on the same JPEG files, one thread.

usage: python3 torchvision_bench.py DIR [SECONDS]; prints the same CSV rows as gg_bench_loader
(without the header). The files are read into memory first, as in the C++ benchmark.
"""
import io
import os
import sys
import time

import torch
from PIL import Image
from torchvision import transforms as T

torch.set_num_threads(1)
root, seconds = sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 5.0
paths = sorted(os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs
               if f.lower().endswith((".jpg", ".jpeg")))
files = [open(p, "rb").read() for p in paths]
norm = T.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
pipelines = {
    "train": T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(), norm]),
    "eval": T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor(), norm]),
}
for name, tf in pipelines.items():
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        img = Image.open(io.BytesIO(files[n % len(files)])).convert("RGB")
        tf(img)
        n += 1
    dt = time.perf_counter() - t0
    print(f"torchvision,{name},1,{n},{dt:.3f},{n / dt:.1f}", flush=True)
