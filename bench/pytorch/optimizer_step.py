"""The optimizer step alone in PyTorch, as bench/optim_bench.cpp times fanout's:
median milliseconds of opt.step() plus opt.zero_grad(set_to_none=False) on a
zoo model with random gradients (normal, std 1e-2), lr 1e-3, weight decay
5e-4, SGD with momentum 0.9, on the CPU with torch's defaults (for CPU
tensors: the single-tensor path) and with foreach=True.

  python3 bench/pytorch/optimizer_step.py --model resnet18 --optimizers sgd,adam,adamw
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import zoo  # noqa: E402  (bench/pytorch/zoo.py)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="resnet18")
    p.add_argument("--input", default="3x32x32", help="CxHxW")
    p.add_argument("--optimizers", default="sgd,adam,adamw")
    p.add_argument("--clip-grad-norm", type=float, default=0.0)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    shape = tuple(int(v) for v in args.input.split("x"))
    torch.manual_seed(1)
    model, _ = zoo.build(args.model, shape, 10)
    params = [q for q in model.parameters()]
    n = sum(q.numel() for q in params)
    for name in args.optimizers.split(","):
        for foreach in (None, True):
            kw = dict(lr=1e-3, weight_decay=5e-4, foreach=foreach)
            opt = {"sgd": lambda: torch.optim.SGD(params, momentum=0.9, **kw),
                   "adam": lambda: torch.optim.Adam(params, **kw),
                   "adamw": lambda: torch.optim.AdamW(params, **kw)}[name]()
            ms = []
            for r in range(args.repeats + 1):
                total = 0.0
                for _ in range(args.steps):
                    for q in params:
                        q.grad = torch.randn_like(q) * 1e-2
                    t0 = time.perf_counter()
                    if args.clip_grad_norm > 0:
                        torch.nn.utils.clip_grad_norm_(params, args.clip_grad_norm)
                    opt.step()
                    opt.zero_grad(set_to_none=False)
                    total += time.perf_counter() - t0
                if r > 0:
                    ms.append(1e3 * total / args.steps)
            med = statistics.median(ms)
            print(json.dumps({"framework": "pytorch", "model": args.model, "optimizer": name,
                              "foreach": bool(foreach), "parameters": n, "ms_per_step": round(med, 3),
                              "ns_per_parameter": round(1e6 * med / n, 3), "threads": torch.get_num_threads(),
                              "clip_grad_norm": args.clip_grad_norm, "torch": torch.__version__}), flush=True)


if __name__ == "__main__":
    main()
