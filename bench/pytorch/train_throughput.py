#!/usr/bin/env python3
"""PyTorch eager training throughput, the reference for fanout's numbers.

Measures steady-state training images/s (forward, cross-entropy, backward,
SGD step) of the same architectures fanout's model zoo builds:

  resnet18  torchvision resnet18 with the CIFAR stem (conv1 3x3 stride 1,
            no max pool), 10 classes, batch 256 of 3x32x32
  lenet     LeNet-5 as models/zoo/zoo.cpp (conv1 5x5 pad 2 for 28x28 input,
            max pools 2, fc 120-84-10), batch 512 of 1x28x28
  mlp, cnn  as bench/pytorch/zoo.py writes them, batch 256 of 1x28x28
  heatmap3d the 3-D encoder-decoder, 4 landmarks, batch 8 of 1x32x32x32,
            mean squared error against random dense targets

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

PyTorch at its best eager recipe (--best): torch.autocast in bfloat16
(--precision bf16-mixed; 16-mixed adds a GradScaler), channels_last
activations and weights, cudnn.benchmark, and the fused optimizer
(fused=True where torch has it, else foreach). --compile adds
torch.compile(model) on top, as its own row (a compile that fails or
exceeds --compile-timeout is reported, not fatal).
"""
import argparse
import json
import sys
import time

import torch
import torch.nn as nn

import zoo  # bench/pytorch/zoo.py, beside this script

DEFAULT_BATCH = {"resnet18": 256, "lenet": 512, "mlp": 256, "cnn": 256, "heatmap3d": 8}


def sample_shape(name, args):
    if args.shape:
        return tuple(int(s) for s in args.shape.lower().split("x"))
    return zoo.SAMPLE_SHAPE[name]


def build(name, args):
    if name not in DEFAULT_BATCH:
        raise SystemExit(f"unknown model {name!r} (known: {', '.join(DEFAULT_BATCH)})")
    return zoo.build(name, sample_shape(name, args), 4 if name in zoo.DENSE else 10)


def set_tf32(mode):
    if mode == "on":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    elif mode == "off":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    # "default": leave PyTorch's defaults (matmul False, cuDNN True).


def make_fused_optimizer(model, args):
    """The same torch.optim object as zoo.make_optimizer, fused where torch has it."""
    import inspect
    opt = zoo.make_optimizer(model, args)
    accepted = inspect.signature(type(opt).__init__).parameters
    defaults = {k: v for k, v in opt.defaults.items() if k in accepted and k not in ("fused", "foreach")}
    for flag in ("fused", "foreach"):
        try:
            return type(opt)(opt.param_groups, **defaults, **{flag: True}), flag
        except (RuntimeError, TypeError, ValueError):
            continue
    return opt, "single-tensor"


def measure(name, batch, args, device):
    model, source = build(name, args)
    model = model.to(device).train()
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last_3d if name in zoo.DENSE else torch.channels_last)
    if args.fused_optimizer:
        opt, opt_impl = make_fused_optimizer(model, args)
    else:
        opt, opt_impl = zoo.make_optimizer(model, args), "default"
    train_step = zoo.MixedStep(device, args.precision, args.clip_grad_norm, args.clip_grad_value)
    net = model
    compile_status = None
    if args.compile:
        try:
            net = torch.compile(model)
            compile_status = "ok"
        except Exception as e:  # noqa: BLE001
            compile_status = f"failed: {str(e).splitlines()[0][:200]}"
    shape = (batch,) + sample_shape(name, args)
    gen = torch.Generator().manual_seed(args.seed)
    x_host = torch.randn(shape, generator=gen)
    if name in zoo.DENSE:
        loss_fn = nn.MSELoss()
        with torch.no_grad():
            out_shape = model(x_host[:1].to(device)).shape[1:]
        y_host = torch.rand((batch,) + tuple(out_shape), generator=gen)
    else:
        loss_fn = nn.CrossEntropyLoss()
        y_host = torch.randint(0, 10, (batch,), generator=gen)
    if device.type == "cuda" and args.input == "host":
        x_host, y_host = x_host.pin_memory(), y_host.pin_memory()
    if args.channels_last and x_host.dim() in (4, 5):
        x_host = x_host.contiguous(memory_format=torch.channels_last if x_host.dim() == 4 else torch.channels_last_3d)
    x_dev, y_dev = x_host.to(device), y_host.to(device)

    def step():
        if args.input == "host":
            x = x_host.to(device, non_blocking=True)
            y = y_host.to(device, non_blocking=True)
        else:
            x, y = x_dev, y_dev
        opt.zero_grad(set_to_none=False)  # fanout zeroes its gradient arena too
        return train_step(net, model, opt, loss_fn, x, y)

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
        "threads": torch.get_num_threads(),
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
        "precision": args.precision,
        "channels_last": args.channels_last,
        "optimizer": args.optimizer,
        "optimizer_impl": opt_impl,
        "compile": compile_status,
        "train_flops_per_step": flops,
        "tflops_per_second": round(flops * args.iters / seconds / 1e12, 2) if flops else None,
    }


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="resnet18,lenet",
                   help="comma-separated: resnet18, lenet, mlp, cnn, heatmap3d")
    p.add_argument("--batch", type=int, default=0,
                   help="batch size for every model (0: 256 resnet18, mlp, cnn; 512 lenet; 8 heatmap3d)")
    p.add_argument("--shape", default="", help="sample shape CxHxW (CxDxHxW for heatmap3d); default: the model's")
    p.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: PyTorch's default)")
    p.add_argument("--warmup", type=int, default=20, help="untimed steps first")
    p.add_argument("--iters", type=int, default=100, help="timed steps")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--tf32", choices=["on", "off", "default"], default="default")
    p.add_argument("--cudnn-benchmark", action="store_true", help="torch.backends.cudnn.benchmark = True")
    p.add_argument("--input", choices=["host", "device"], default="host",
                   help="host: copy the batch from pinned memory each step; device: keep it on the GPU")
    p.add_argument("--device", default="cuda:0", help="cuda:N, or cpu for a smoke test")
    p.add_argument("--seed", type=int, default=0)
    zoo.add_optimizer_args(p)
    p.add_argument("--precision", choices=["32", "bf16-mixed", "16-mixed"], default="32",
                   help="torch.autocast dtype (16-mixed adds a GradScaler), as dp-train's --precision")
    p.add_argument("--channels-last", action="store_true", help="model and input in channels_last memory format")
    p.add_argument("--fused-optimizer", action="store_true", help="fused=True (else foreach=True) torch.optim")
    p.add_argument("--best", action="store_true",
                   help="PyTorch's best eager recipe: --precision bf16-mixed --channels-last --fused-optimizer "
                        "and cudnn.benchmark")
    p.add_argument("--compile", action="store_true", help="torch.compile(model) (its own row)")
    args = p.parse_args()
    if args.best:
        args.precision = "bf16-mixed" if args.precision == "32" else args.precision
        args.channels_last = args.fused_optimizer = args.cudnn_benchmark = True

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("train_throughput.py: no CUDA device visible to PyTorch", file=sys.stderr)
        return 2
    if args.warmup < 0 or args.iters < 1:
        raise SystemExit("--warmup must be >= 0 and --iters >= 1")
    if args.threads > 0:
        torch.set_num_threads(args.threads)
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
