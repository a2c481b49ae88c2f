#!/usr/bin/env python3
"""PyTorch eager training throughput, the reference for fanout's numbers.

Measures steady-state training images/s (forward, cross-entropy, backward,
SGD step) of the same architectures fanout's model zoo builds:

  resnet18  torchvision resnet18 with the CIFAR stem (conv1 3x3 stride 1,
            no max pool), 10 classes, batch 256 of 3x32x32
  lenet     LeNet-5 as models/zoo/zoo.cpp (conv1 5x5 pad 2 for 28x28 input,
            max pools 2, fc 120-84-10), batch 512 of 1x28x28

SGD with momentum 0.9 and weight decay 5e-4 (dp-train's defaults). Random
inputs and labels: this measures compute, not a data loader. By default the
batch is copied from pinned host memory each step (as fanout's engine takes
host batches); --input device keeps it on the GPU.

Timing: --warmup steps, then --iters steps between two
torch.cuda.synchronize() calls, wall clock. One JSON line per model on
stdout:
  {"framework": "pytorch", "model": ..., "batch": ..., "images_per_second": ...,
   "gpu": ..., ...}

TF32: --tf32 default leaves PyTorch's defaults (matmul off, cuDNN on);
on/off set both. Run: python3 bench/pytorch/train_throughput.py [--models resnet18,lenet]
"""
import argparse
import json
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

DEFAULT_BATCH = {"resnet18": 256, "lenet": 512}
SAMPLE_SHAPE = {"resnet18": (3, 32, 32), "lenet": (1, 28, 28)}


class LeNet(nn.Module):
    """models/zoo/zoo.cpp lenet: conv1 5x5 -> 6 (padding 2 for 28x28), relu,
    maxpool 2, conv2 5x5 -> 16, relu, maxpool 2, fc1 -> 120, relu, fc2 -> 84,
    relu, fc3 -> classes."""

    def __init__(self, in_channels=1, size=28, classes=10):
        super().__init__()
        pad = (32 - size + 1) // 2 if size < 32 else 0
        self.conv1 = nn.Conv2d(in_channels, 6, 5, padding=pad)
        self.conv2 = nn.Conv2d(6, 16, 5)
        s = ((size + 2 * pad - 4) // 2 - 4) // 2
        self.fc1 = nn.Linear(16 * s * s, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


class BasicBlock(nn.Module):
    """torchvision's BasicBlock, for machines without torchvision."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class ResNet18Cifar(nn.Module):
    """torchvision resnet18 layout with the CIFAR stem, written out by hand."""

    def __init__(self, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.Identity()
        layers, cin = [], 64
        for i, cout in enumerate((64, 128, 256, 512)):
            stride = 1 if i == 0 else 2
            layers.append(nn.Sequential(BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)))
            cin = cout
        self.layer1, self.layer2, self.layer3, self.layer4 = layers
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512, classes)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet18_cifar(classes=10):
    """(model, source): torchvision's resnet18 with conv1 3x3/1 and no max
    pool when torchvision imports, else the hand-written copy."""
    try:
        import torchvision

        m = torchvision.models.resnet18(num_classes=classes)
        m.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
        m.maxpool = nn.Identity()
        return m, "torchvision " + torchvision.__version__
    except ImportError:
        return ResNet18Cifar(classes), "hand-written (no torchvision)"


def build(name):
    if name == "resnet18":
        return resnet18_cifar(10)
    if name == "lenet":
        return LeNet(1, 28, 10), "hand-written"
    raise SystemExit(f"unknown model {name!r} (known: {', '.join(DEFAULT_BATCH)})")


def set_tf32(mode):
    if mode == "on":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    elif mode == "off":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    # "default": leave PyTorch's defaults (matmul False, cuDNN True).


def measure(name, batch, args, device):
    model, source = build(name)
    model = model.to(device).train()
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)
    loss_fn = nn.CrossEntropyLoss()
    shape = (batch,) + SAMPLE_SHAPE[name]
    gen = torch.Generator().manual_seed(args.seed)
    x_host = torch.randn(shape, generator=gen)
    y_host = torch.randint(0, 10, (batch,), generator=gen)
    if device.type == "cuda" and args.input == "host":
        x_host, y_host = x_host.pin_memory(), y_host.pin_memory()
    x_dev, y_dev = x_host.to(device), y_host.to(device)

    def step():
        if args.input == "host":
            x = x_host.to(device, non_blocking=True)
            y = y_host.to(device, non_blocking=True)
        else:
            x, y = x_dev, y_dev
        opt.zero_grad(set_to_none=False)  # fanout zeroes its gradient arena too
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    # Floating-point operations of one training step (forward and backward of
    # the convolutions and matrix products, as torch.utils.flop_counter
    # counts them; elementwise work is not counted): the numerator of the
    # FLOP utilisation.
    flops = None
    try:
        from torch.utils.flop_counter import FlopCounterMode
        with FlopCounterMode(display=False) as fc:
            step()
        flops = fc.get_total_flops()
    except Exception:  # noqa: BLE001  (an old PyTorch without the counter)
        pass

    for _ in range(args.warmup):
        step()
    sync()
    t0 = time.perf_counter()
    for _ in range(args.iters):
        loss = step()
    sync()
    seconds = time.perf_counter() - t0
    final_loss = float(loss.item())
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return {
        "framework": "pytorch",
        "model": name,
        "batch": batch,
        "images_per_second": round(batch * args.iters / seconds, 1),
        "gpu": gpu,
        "step_ms": round(1000.0 * seconds / args.iters, 3),
        "iters": args.iters,
        "warmup": args.warmup,
        "input": args.input,
        "tf32": args.tf32,
        "matmul_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
        "cudnn_tf32": bool(torch.backends.cudnn.allow_tf32),
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
        "model_source": source,
        "torch": torch.__version__,
        "final_loss": round(final_loss, 4),
        "train_flops_per_step": flops,
        "tflops_per_second": round(flops * args.iters / seconds / 1e12, 2) if flops else None,
    }


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="resnet18,lenet", help="comma-separated: resnet18, lenet")
    p.add_argument("--batch", type=int, default=0, help="batch size for every model (0: 256 resnet18, 512 lenet)")
    p.add_argument("--warmup", type=int, default=20, help="untimed steps first")
    p.add_argument("--iters", type=int, default=100, help="timed steps")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--tf32", choices=["on", "off", "default"], default="default")
    p.add_argument("--cudnn-benchmark", action="store_true", help="torch.backends.cudnn.benchmark = True")
    p.add_argument("--input", choices=["host", "device"], default="host",
                   help="host: copy the batch from pinned memory each step; device: keep it on the GPU")
    p.add_argument("--device", default="cuda:0", help="cuda:N, or cpu for a smoke test")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("train_throughput.py: no CUDA device visible to PyTorch", file=sys.stderr)
        return 2
    if args.warmup < 0 or args.iters < 1:
        raise SystemExit("--warmup must be >= 0 and --iters >= 1")
    set_tf32(args.tf32)
    torch.backends.cudnn.benchmark = args.cudnn_benchmark
    torch.manual_seed(args.seed)
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        batch = args.batch or DEFAULT_BATCH.get(name, 0)
        if name not in DEFAULT_BATCH:
            raise SystemExit(f"unknown model {name!r} (known: {', '.join(DEFAULT_BATCH)})")
        print(json.dumps(measure(name, batch, args, device)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
