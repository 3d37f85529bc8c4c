#!/usr/bin/env python3
"""The first TRAIN and TEST images of Debian's Fashion-MNIST as idx files in OUT (a small data set
that loads and evaluates in a fraction of a second). Usage: fmnist_subset.py OUT TRAIN TEST"""
import gzip
import os
import sys

src, out = "/usr/share/datasets/fashion-mnist", sys.argv[1]
os.makedirs(out)
for split, n in (("train", int(sys.argv[2])), ("t10k", int(sys.argv[3]))):
    for kind, head, size in (("images-idx3", 16, 784), ("labels-idx1", 8, 1)):
        raw = gzip.open(f"{src}/{split}-{kind}-ubyte.gz").read()
        data = bytearray(raw[:head + n * size])
        data[4:8] = n.to_bytes(4, "big")
        with open(f"{out}/{split}-{kind}-ubyte", "wb") as f:
            f.write(data)
