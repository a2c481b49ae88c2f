#!/usr/bin/env python3
"""fanout against PyTorch on the same weights and batch: each zoo model's
training-mode logits, every parameter's gradient of the mean loss, and the
parameters and BatchNorm buffers after two SGD steps (lr 0.05, momentum 0.9,
weight decay 5e-4), all computed by torch_tool (fanout, CPU) and by the same
architecture in bench/pytorch/zoo.py loaded with fanout's initial tensors.

The reference is PyTorch in float64. Tolerances, each relative to the
largest magnitude of its tensor: logits 1e-5, gradients 1e-4, and the
parameters' change over the two steps 1e-4 (the parameters themselves move
by little of their size) beyond the two float32 roundings of each stored
parameter (2 * eps32 * |p| per element); buffers after the steps 1e-5.
resnet18's two steps are not compared: after one step at lr 0.05 its
second forward puts activations on ReLU's kink (channel 142 of layer3.1's
bn1 output holds values of exactly 0 in float64), float32 rounding decides
their side, and BatchNorm spreads a flip over the channel (seen: 2,143 of
the 2,304 weights of channel 142 of layer3.1.conv1 off by more than 1e-3 of
the tensor's change, the worst by 2.5e-2; PyTorch's own float32 run misses
1e-4 on 39 of the 62 tensors). Its logits and gradients are compared.

Every check is printed; the script fails on any miss and shows that the
comparison can fail: fanout's gradient of lenet's conv2 with its kernels
transposed under the same shape must miss.

Usage: torch_conformance.py [TORCH_TOOL]  (or TORCH_TOOL in the environment)
Needs torch and safetensors; exits 77 (skipped) without torch.
"""
import os
import subprocess
import sys
import tempfile

try:
    import torch
    import torch.nn as nn
    from safetensors.torch import load_file
except ImportError as e:
    print(f"torch_conformance.py: skipped, needs torch and safetensors ({e})")
    sys.exit(77)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "pytorch"))
import zoo  # noqa: E402

# (model, sample shape, batch, whether its two steps are compared)
CASES = [("mlp", "1x28x28", 16, True), ("lenet", "1x28x28", 16, True), ("cnn", "1x28x28", 16, True),
         ("resnet18", "3x32x32", 8, False), ("heatmap3d", "1x16x16x16", 4, True)]


def rel(a, b, slack=None):
    scale = max(b.abs().max().item(), 1e-30)
    diff = (a.double() - b.double()).abs()
    if slack is not None:
        diff = (diff - slack).clamp(min=0)
    return diff.max().item() / scale


def pytorch_run(name, sample, init, x, y, dtype):
    """PyTorch in `dtype`: (training-mode logits, gradients, state after two SGD steps)."""
    model, _ = zoo.build(name, sample, 4 if name in zoo.DENSE else 10)
    model = model.to(dtype)
    model.load_state_dict({k: v.to(dtype) if v.is_floating_point() else v for k, v in init.items()})
    model.train()
    x = x.to(dtype)
    y = y.long() if name not in zoo.DENSE else y.to(dtype)
    loss_fn = nn.MSELoss() if name in zoo.DENSE else nn.CrossEntropyLoss()
    logits = model(x).detach()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    opt.zero_grad()
    loss_fn(model(x), y).backward()
    grads = {k: p.grad.detach().clone() for k, p in model.named_parameters()}
    opt.step()
    opt.zero_grad()
    loss_fn(model(x), y).backward()
    opt.step()
    return logits, grads, {k: v.detach().clone() for k, v in model.state_dict().items()}


def main():
    tool = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("TORCH_TOOL")
    if not tool:
        raise SystemExit("usage: torch_conformance.py TORCH_TOOL")
    torch.set_num_threads(1)
    failures, checks = [], 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, shape, batch, steps in CASES:
            path = os.path.join(tmp, f"{name}.safetensors")
            subprocess.run([tool, name, shape, str(batch), "7", path], check=True)
            f = load_file(path)
            sample = tuple(int(s) for s in shape.split("x"))
            init = {k[len("init."):]: v for k, v in f.items() if k.startswith("init.")}
            logits, grads, state = pytorch_run(name, sample, init, f["x"], f["y"], torch.float64)

            def check(what, got, want, tol, slack=None):
                nonlocal checks
                checks += 1
                r = rel(got, want, slack)
                ok = r <= tol
                print(f"{name:9s} {what:40s} {r:9.2e} {'ok' if ok else 'MISS'} (tol {tol:g})")
                if not ok:
                    failures.append(f"{name} {what}")

            check("logits", f["logits"], logits, 1e-5)
            for pname, g in grads.items():
                check(f"grad {pname}", f["grad." + pname], g, 1e-4)
            if name == "lenet":  # the comparison can fail: conv2's gradient with its kernels transposed
                bad = rel(f["grad.conv2.weight"].transpose(2, 3).contiguous(), grads["conv2.weight"])
                print(f"{name:9s} {'grad conv2.weight, kernels transposed':40s} {bad:9.2e} (must miss 1e-4)")
                checks += 1
                if bad <= 1e-4:
                    failures.append("the transposed gradient was not detected")
            for k, v in state.items() if steps else []:
                got = f["step2." + k]
                if not v.is_floating_point():
                    checks += 1
                    if not torch.equal(got.long(), v.long()):
                        failures.append(f"{name} {k}")
                    continue
                if k not in grads:
                    check(f"2 steps: buffer {k}", got, v, 1e-5)
                    continue
                # A parameter: what the two steps changed, beyond two float32
                # roundings of the stored value.
                slack = 2 * torch.finfo(torch.float32).eps * v.abs()
                check(f"2 steps: {k}", got.double() - init[k].double(), v - init[k].double(), 1e-4, slack)
    print(f"{checks - len(failures)} of {checks} checks within tolerance")
    if failures:
        print("misses: " + ", ".join(failures))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
