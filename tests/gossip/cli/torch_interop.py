"""PyTorch interop through .npz files with torchvision's state_dict names.

usage: torch_interop.py GOSSIPGRAD ROOT resnet8|torchvision

resnet8:     a PyTorch resnet8 built from torchvision's BasicBlock, with random weights and
             running statistics: `gossipgrad infer` on its npz gives PyTorch's eval-mode logits;
             `train --train.init_from` it, `export` the checkpoint, and PyTorch's
             load_state_dict(strict=True) takes the result, whose logits agree again.
torchvision: torchvision's resnet18 and googlenet (no aux heads), same logits comparison.

Exits 77 (ctest: skipped) with a message when /usr/bin/python3 has no torch/torchvision, or
(torchvision) when this gossipgrad has no resnet18/googlenet model.
"""
import os
import subprocess
import sys
import tempfile

import numpy as np

try:
    import torch
    import torchvision
    from torch import nn
    from torchvision.models.resnet import BasicBlock, conv1x1
except ImportError as e:
    print(f"skipped: /usr/bin/python3 has no torch/torchvision ({e})")
    sys.exit(77)

BIN, ROOT, MODE = sys.argv[1], sys.argv[2], sys.argv[3]
TOLERANCE = 1e-4  # max |logit difference| relative to the largest |logit|
torch.set_num_threads(1)
torch.manual_seed(0)
ENV = dict(os.environ, OMP_NUM_THREADS="1")


def run(*args):
    r = subprocess.run([BIN, *args], env=ENV, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"FAIL: gossipgrad {' '.join(args)} exited {r.returncode}:\n{r.stdout}{r.stderr}")
    return r.stdout


def randomise_batch_norms(model):
    """Running statistics and affine parameters away from their defaults, so that eval mode's
    use of them is actually tested."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.2, 0.2)
                m.running_mean.normal_(0.0, 0.2)
                m.running_var.uniform_(0.5, 2.0)


def save_state_dict(model, path):
    np.savez(path, **{k: v.detach().numpy() for k, v in model.state_dict().items()})


def load_npz(model, path):
    z = np.load(path)
    model.load_state_dict({k: torch.from_numpy(z[k]) for k in z.files}, strict=True)


def compare(name, model, weights, x, *extra):
    """gossipgrad infer on x with `weights` against the model's eval-mode logits."""
    with tempfile.TemporaryDirectory() as tmp:
        np.save(f"{tmp}/x.npy", x)
        run("infer", "--model", name, "--weights", weights, "--input", f"{tmp}/x.npy",
            "--output", f"{tmp}/y.npy", *extra)
        y = np.load(f"{tmp}/y.npy")
    with torch.no_grad():
        t = model.eval()(torch.from_numpy(x)).numpy()
    assert y.shape == t.shape and y.dtype == np.float32, (y.shape, t.shape, y.dtype)
    scale = float(np.abs(t).max())
    diff = float(np.abs(y - t).max())
    print(f"{name} {list(x.shape)}: max |logit| {scale:.4g}, max |gossipgrad - torch| {diff:.3g} "
          f"({diff / scale:.2e} relative)")
    assert diff <= TOLERANCE * scale, f"{name}: logits differ by {diff} (scale {scale})"


class ResNet8(nn.Module):
    """gossipgrad's resnet8 in PyTorch: 3x3 stem, one BasicBlock per stage, FC."""

    def __init__(self, width, channels, classes):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, width, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)

        def stage(cin, cout, stride):
            down = None
            if stride != 1 or cin != cout:
                down = nn.Sequential(conv1x1(cin, cout, stride), nn.BatchNorm2d(cout))
            return nn.Sequential(BasicBlock(cin, cout, stride, down))

        self.layer1 = stage(width, width, 1)
        self.layer2 = stage(width, 2 * width, 2)
        self.layer3 = stage(2 * width, 4 * width, 2)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(4 * width, classes)

    def forward(self, x):
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer3(self.layer2(self.layer1(x)))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def test_resnet8(tmp):
    model = ResNet8(4, 1, 10)
    randomise_batch_norms(model)
    save_state_dict(model, f"{tmp}/torch.npz")
    x = np.random.default_rng(0).standard_normal((5, 1, 28, 28)).astype(np.float32)
    compare("resnet8", model, f"{tmp}/torch.npz", x, "--batch", "2")
    compare("resnet8", model, f"{tmp}/torch.npz", x, "--backend", "reference")

    # PyTorch -> gossipgrad training -> checkpoint -> export -> PyTorch, strict.
    run("train", "--config", f"{ROOT}/configs/laptop.ini", "--model.width", "4",
        "--train.init_from", f"{tmp}/torch.npz", "--train.max_steps", "1", "--train.threads", "1",
        "--gossip.mode", "allreduce", "--log.progress", "false", "--log.metrics",
        f"{tmp}/m.jsonl", "--checkpoint.dir", f"{tmp}/ck", "--train.eval_batch", "2000")
    run("export", "--checkpoint", f"{tmp}/ck", "--output", f"{tmp}/exported.npz")
    back = ResNet8(4, 1, 10)
    load_npz(back, f"{tmp}/exported.npz")
    assert int(back.bn1.num_batches_tracked) == 1, back.bn1.num_batches_tracked
    changed = (back.conv1.weight - model.conv1.weight).abs().max().item()
    assert changed > 0, "one training step left the weights unchanged"
    compare("resnet8", back, f"{tmp}/exported.npz", x)


def test_torchvision(tmp):
    for name in ("resnet18", "googlenet"):
        r = subprocess.run([BIN, "info", "--model", name, "--input", "3,224,224", "--classes",
                            "1000"], env=ENV, capture_output=True, text=True)
        if r.returncode != 0:
            print(f"skipped: gossipgrad has no {name} model yet ({r.stderr.strip()})")
            sys.exit(77)
    x = np.random.default_rng(1).standard_normal((2, 3, 224, 224)).astype(np.float32)
    for name, model in [
        ("resnet18", torchvision.models.resnet18(weights=None)),
        ("googlenet", torchvision.models.googlenet(weights=None, aux_logits=False,
                                                   init_weights=True)),
    ]:
        randomise_batch_norms(model)
        save_state_dict(model, f"{tmp}/{name}.npz")
        compare(name, model, f"{tmp}/{name}.npz", x)


with tempfile.TemporaryDirectory() as tmp:
    {"resnet8": test_resnet8, "torchvision": test_torchvision}[MODE](tmp)
print(f"torch {torch.__version__}, torchvision {torchvision.__version__}: {MODE} OK")
