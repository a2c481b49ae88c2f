#!/usr/bin/env python3
"""How far a CUDA training test's case sits from ReLU's and max-pool's kinks.

A whole-network comparison of cuda:0 with the CPU is only meaningful where
float32 rounding cannot change a decision of the network: a ReLU input within
rounding distance of 0, or a max-pool window whose two largest values are
that close, may fall on either side on either device, and the gradient it
routes then moves every layer below by percent (seen on an H100: resnet18's
layer2.0.bn1 output at 1.9e-6 from 0, and a window of the cnn's pool2 with
its two largest values 1.6e-6 apart, each reproduced in float64 by flipping
that one decision). GPU-vs-CPU differences of such values are about 1e-6.

This script runs the test's case (weights and batches written by batch_tool)
in float64 with the same architecture in bench/pytorch/zoo.py, and prints
for every training pass the smallest |ReLU input| and the smallest gap
between the two largest positive values of a max-pool window. A case is
usable when every margin of every compared pass is at least --min (1e-5).

Usage:
  margins.py BATCH_TOOL MODEL SHAPE BATCH MODEL_SEED DATA_SEED STEPS
             [--optimizer sgd|adamw] [--lr LR] [--clip C] [--same-batch] [--scan N]
             [--min M]
--same-batch trains every pass on the first batch (as the tests that repeat
one batch do); --scan N tries DATA_SEED, DATA_SEED+1, ... and prints the
first usable one. Needs torch and safetensors (exits 77 without them).
"""
import argparse
import os
import subprocess
import sys
import tempfile

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from safetensors.torch import load_file
except ImportError as e:
    print(f"margins.py: skipped, needs torch and safetensors ({e})")
    sys.exit(77)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "pytorch"))
import zoo  # noqa: E402

MARGINS = {}
PENDING = []  # the last ReLU's (input, output, margin) until a max-pool takes it or the next op comes
# Every decision call of a pass, in order, when a list: (kind, the values
# whose distance from 0 decides, the mask of the values that count).
DECISIONS = None


def note(kind, value, values=None, mask=None):
    MARGINS[kind] = min(MARGINS.get(kind, float("inf")), value)
    if DECISIONS is not None and values is not None:
        DECISIONS.append((kind, values, torch.ones_like(values, dtype=torch.bool) if mask is None else mask))


def commit():
    if PENDING:
        pre, _, margin = PENDING.pop()
        note("relu", margin, pre)


def relu(x, inplace=False):
    commit()
    pre = x.detach().clone()
    y = ORIG_RELU(x, inplace=inplace)
    PENDING.append((pre, y, pre.abs().min().item()))
    return y


def max_pool2d(x, k, *a, **kw):
    """On a ReLU's output the decisions are the window's: its winner's sign
    and, when it is positive, its lead over the runner-up; on other input,
    the lead alone."""
    top, after_relu = window_top2(x, k, a, kw, 2)
    return pool_decisions(x, k, a, kw, top, after_relu)


def pool_decisions(x, k, a, kw, top, after_relu):
    if after_relu:
        note("relu", top[:, 0].abs().min().item(), top[:, 0])
        lead = top[:, 1] > 0
    else:
        lead = torch.ones_like(top[:, 0], dtype=torch.bool)
    if lead.any():
        note("pool", (top[:, 0] - top[:, 1])[lead].min().item(), top[:, 0] - top[:, 1], lead)
    return (ORIG_POOL3D if x.dim() == 5 else ORIG_POOL)(x, k, *a, **kw)


def window_top2(x, k, a, kw, dims):
    """The two largest values of every pooling window (no padding) of the
    last `dims` axes, and whether x is the last ReLU's output (then the
    windows are read from that ReLU's input)."""
    kk = k if isinstance(k, int) else k[0]
    stride = kw.get("stride", a[0] if a else None) or kk
    stride = stride if isinstance(stride, int) else stride[0]
    src = x.detach()
    after_relu = bool(PENDING) and PENDING[-1][1] is x
    if after_relu:
        src = PENDING.pop()[0]
    else:
        commit()
    for axis in range(src.dim() - dims, src.dim()):
        src = src.unfold(axis, kk, stride)
    return src.reshape(-1, kk ** dims).topk(2, dim=1).values, after_relu


def max_pool3d(x, k, *a, **kw):
    """max_pool2d's decisions, for 3-D windows."""
    top, after_relu = window_top2(x, k, a, kw, 3)
    return pool_decisions(x, k, a, kw, top, after_relu)


ORIG_RELU, ORIG_POOL, ORIG_POOL3D = F.relu, F.max_pool2d, F.max_pool3d
F.relu, F.max_pool2d, F.max_pool3d = relu, max_pool2d, max_pool3d


def optimizer(model, kind, lr):
    if kind == "sgd":  # testing::test_sgd()
        return torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=5e-4)
    # testing::test_adamw(): amsgrad, weight decay 0.05 except BatchNorm and biases
    decay = [p for n, p in model.named_parameters() if p.dim() > 1]
    rest = [p for n, p in model.named_parameters() if p.dim() <= 1]
    return torch.optim.AdamW([{"params": decay}, {"params": rest, "weight_decay": 0.0}], lr=lr,
                             weight_decay=0.05, amsgrad=True)


def margins(tool, a, data_seed):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "case.safetensors")
        subprocess.run([tool, a.model, a.shape, str(a.batch), str(a.model_seed), str(data_seed), str(a.steps), path],
                       check=True)
        f = load_file(path)
    init = {k[len("init."):]: v for k, v in f.items() if k.startswith("init.")}
    sample = tuple(int(s) for s in a.shape.split("x"))
    model, _ = zoo.build(a.model, sample, 10)
    model = model.double()
    model.load_state_dict({k: v.double() if v.is_floating_point() else v for k, v in init.items()})
    model.train()
    opt = optimizer(model, a.optimizer, a.lr)
    out, norms = [], []
    for step in range(a.steps):
        i = 0 if a.same_batch else step
        MARGINS.clear()
        opt.zero_grad()
        logits = model(f[f"x{i}"].double())
        commit()
        nn.CrossEntropyLoss()(logits, f[f"y{i}"].long()).backward()
        if a.optimizer == "adamw":
            norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip).item())
        opt.step()
        out.append(dict(MARGINS))
    if norms:
        print("gradient norms before clipping: " + ", ".join(f"{n:.3g}" for n in norms))
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name in ("tool", "model", "shape"):
        p.add_argument(name)
    for name in ("batch", "model_seed", "data_seed", "steps"):
        p.add_argument(name, type=int)
    p.add_argument("--optimizer", choices=("sgd", "adamw"), default="sgd")
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--same-batch", action="store_true")
    p.add_argument("--clip", type=float, default=0.1, help="AdamW runs clip the gradient norm to this")
    p.add_argument("--scan", type=int, default=1)
    p.add_argument("--min", type=float, default=1e-5)
    a = p.parse_args()
    if a.lr is None:
        a.lr = 0.02 if a.optimizer == "sgd" else 1e-3
    torch.set_num_threads(1)
    for seed in range(a.data_seed, a.data_seed + a.scan):
        ms = margins(a.tool, a, seed)
        worst = min(v for m in ms for v in m.values())
        line = "; ".join(f"pass {i + 1}: " + ", ".join(f"{k} {v:.2e}" for k, v in sorted(m.items()))
                         for i, m in enumerate(ms))
        ok = worst >= a.min
        print(f"{a.model} {a.shape} batch {a.batch} model seed {a.model_seed} data seed {seed}: {line} "
              f"-> {'usable' if ok else 'too close'} (min {a.min:g})", flush=True)
        if ok:
            return 0
    return 1


if __name__ == "__main__":
    sys.exit(main())
