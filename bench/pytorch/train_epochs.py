#!/usr/bin/env python3
"""PyTorch's side of `dp-bench --epochs`: one run of real training epochs of
a fanout zoo model (bench/pytorch/zoo.py) on the data dp-bench exported, in
one of PyTorch's modes:

  one   one process, one device (cpu, or cuda:N)
  ddp   DistributedDataParallel, --nproc processes (gloo on CPUs, NCCL on
        GPUs), the global batch split evenly, DistributedSampler
  dp    nn.DataParallel over the GPUs of --devices (one process)

The data directory holds train_images.npy and test_images.npy (uint8,
N x C x H x W), train_labels.npy and test_labels.npy (int32) and meta.json
({"mean": [...], "std": [...], "classes": K}); images are normalized as
fanout's loader does, (x / 255 - mean) / std. SGD as torch.optim.SGD with a
constant learning rate; cross-entropy averaged over the global batch.

A GPT (--model gpt:PRESET,KEY=VALUE,...: bench/pytorch/gpt.py, nanoGPT's
model) reads a token directory instead (train.bin and val.bin, flat uint16,
and meta.json's vocab_size, as fanout writes them): the samples are the
windows of block_size + 1 tokens overlapping by one, as fanout's (x the
first block_size tokens, y the same shifted by one); the loss is the mean
cross-entropy over the batch's tokens, the accuracy the share of tokens
predicted.

Timing: the first --warmup-steps steps of each epoch are untimed; the
epoch time is the time of the remaining steps scaled to the whole epoch
(GPU work synchronized at both marks). Evaluation on the test set follows
each epoch and is not timed. One JSON object is written to --out.

--version prints PyTorch's version, or exits with status 4 and says that
PyTorch is not installed.
"""
import argparse
import json
import os
import resource
import sys
import tempfile
import time

import numpy as np

NOT_INSTALLED = 4


def load(data_dir):
    with open(os.path.join(data_dir, "meta.json")) as f:
        meta = json.load(f)
    arrays = {k: np.load(os.path.join(data_dir, k + ".npy"))
              for k in ("train_images", "train_labels", "test_images", "test_labels")}
    return arrays, meta


class Normalized:
    """Whole batches by index list: (uint8 images -> float, normalized), labels.
    Picklable, for DataLoader workers started by spawn."""

    def __init__(self, images, labels, mean, std):
        import torch

        self.images = torch.from_numpy(images)
        self.labels = torch.from_numpy(labels.astype(np.int64))
        c = self.images.shape[1]
        self.mean = torch.tensor(mean, dtype=torch.float32).view(1, c, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32).view(1, c, 1, 1)

    def __len__(self):
        return self.images.shape[0]

    def __getitem__(self, idx):
        import torch

        idx = torch.as_tensor(idx)
        x = (self.images[idx].float() / 255.0 - self.mean) / self.std
        return x, self.labels[idx]


def gpt_logits_class():
    """A GPT whose forward gives the logits only, so that nn.DataParallel
    gathers them as it gathers a classifier's outputs."""
    import torch.nn as nn

    class GptLogits(nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, x):
            return self.m(x)[0]

    return GptLogits


def token_cross_entropy(logits, y):
    import torch.nn.functional as F

    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))


def peak_host_bytes():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def worker(rank, args, result_path):
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.utils.data import BatchSampler, DataLoader, DistributedSampler, RandomSampler

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import zoo

    torch.set_num_threads(args.threads)
    world = args.nproc if args.mode == "ddp" else 1
    devices = [d for d in args.devices.split(",") if d]
    if devices[0] == "cpu":
        device = torch.device("cpu")
    else:
        idx = [int(d.replace("cuda:", "")) for d in devices]
        device = torch.device("cuda", idx[rank] if args.mode == "ddp" else idx[0])
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = args.tf32
        torch.backends.cudnn.allow_tf32 = args.tf32
    if args.mode == "ddp":  # DistributedDataParallel needs a process group, also of one process
        backend = args.backend if args.backend != "auto" else ("nccl" if device.type == "cuda" else "gloo")
        dist.init_process_group(backend,
                                init_method="file://" + args.store, rank=rank, world_size=world)
    torch.manual_seed(args.seed)
    tokens = args.model.startswith("gpt:")
    if tokens:
        import gpt
        import token_windows

        GptLogits = gpt_logits_class()
        meta_path = os.path.join(args.data, "meta.json")
        vocab = json.load(open(meta_path)).get("vocab_size") if os.path.exists(meta_path) else None
        config = gpt.parse_config(args.model, vocab_size=vocab)
        train = token_windows.Windows(os.path.join(args.data, "train.bin"), config.block_size)
        test = token_windows.Windows(os.path.join(args.data, "val.bin"), config.block_size)
        model = GptLogits(gpt.GPT(config))
        shape = (config.block_size,)
    else:
        arrays, meta = load(args.data)
        train = Normalized(arrays["train_images"], arrays["train_labels"], meta["mean"], meta["std"])
        test = Normalized(arrays["test_images"], arrays["test_labels"], meta["mean"], meta["std"])
        shape = tuple(arrays["train_images"].shape[1:])
        model, _ = zoo.build(args.model, shape, int(meta["classes"]))
    model = model.to(device)
    layout = None
    if args.channels_last and len(shape) == 3:  # (C, H, W) images: NHWC model and batches
        layout = torch.channels_last
        model = model.to(memory_format=layout)
    if args.mode == "ddp":
        net = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
        if args.grad_reduce_dtype == "bf16":
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
            net.register_comm_hook(None, default_hooks.bf16_compress_hook)
    elif args.mode == "dp":
        net = nn.DataParallel(model, device_ids=idx)
    else:
        net = model
    opt = zoo.make_optimizer(model, args, momentum=args.momentum, weight_decay=args.weight_decay)
    loss_fn = token_cross_entropy if tokens else nn.CrossEntropyLoss()
    # --precision: torch.autocast in the low type (16-mixed adds a GradScaler), as dp-train's.
    train_step = zoo.MixedStep(device, args.precision, args.clip_grad_norm, args.clip_grad_value)

    local_batch = args.batch // world
    if world > 1:
        sampler = DistributedSampler(train, num_replicas=world, rank=rank, shuffle=True, seed=args.seed)
    else:
        sampler = RandomSampler(train, generator=torch.Generator().manual_seed(args.seed))
    loader = DataLoader(train, sampler=BatchSampler(sampler, local_batch, drop_last=False), batch_size=None,
                        num_workers=args.workers, persistent_workers=args.workers > 0,
                        pin_memory=device.type == "cuda")

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if world > 1:
            dist.barrier()

    epochs = []
    for epoch in range(args.epochs):
        if world > 1:
            sampler.set_epoch(epoch)
        net.train()
        steps = len(loader)
        warm = min(args.warmup_steps, steps - 1)  # every epoch, as dp-train's --timing-warmup
        wait = 0.0
        rows = 0
        sync()
        t0 = time.perf_counter()
        t_warm = t0
        it = iter(loader)
        for step in range(steps):
            tw = time.perf_counter()
            x, y = next(it)
            wait += time.perf_counter() - tw
            x = x.to(device, non_blocking=True)
            if layout is not None:
                x = x.contiguous(memory_format=layout)
            y = y.to(device, non_blocking=True)
            opt.zero_grad(set_to_none=False)
            train_step(net, model, opt, loss_fn, x, y)
            if step + 1 == warm:
                sync()
                t_warm = time.perf_counter()
                wait = 0.0
            rows += y.shape[0] * world
        sync()
        t1 = time.perf_counter()
        wall = t1 - t0
        seconds = (t1 - t_warm) * steps / (steps - warm)
        # Evaluation (untimed): rank 0 on the whole test set.
        # A GPT: per token (every window holds block_size of them), in batches of the training batch.
        acc = loss_sum = 0.0
        if rank == 0:
            model.eval()
            correct = 0
            eval_batch = args.batch if tokens else args.eval_batch
            with torch.no_grad(), train_step.autocast():
                for i in range(0, len(test), eval_batch):
                    x, y = test[list(range(i, min(len(test), i + eval_batch)))]
                    out = model(x.to(device))
                    if tokens:
                        out, y = out.reshape(-1, out.size(-1)), y.reshape(-1)
                    loss_sum += float(nn.functional.cross_entropy(out, y.to(device), reduction="sum"))
                    correct += int((out.argmax(-1).cpu() == y).sum())
            samples = len(test) * (shape[0] if tokens else 1)
            acc = correct / samples
            loss_sum /= samples
        epochs.append({"epoch": epoch + 1, "epoch_seconds": seconds, "epoch_wall_seconds": wall,
                       "images_per_second": rows / seconds,
                       **({"tokens_per_second": rows * shape[0] / seconds} if tokens else {}), "data_wait_fraction": min(1.0, wait / (t1 - t_warm)),
                       "test_acc": acc, "test_loss": loss_sum})
        if world > 1:
            dist.barrier()

    # Peak memory: host bytes summed over the processes; per GPU, PyTorch's
    # allocator peak (the bytes its tensors held at most).
    host = torch.tensor([peak_host_bytes()], dtype=torch.float64)
    if device.type == "cuda":
        gpus = idx if args.mode == "dp" else [device.index]
        dev_peaks = [float(torch.cuda.max_memory_allocated(torch.device("cuda", g))) for g in gpus]
    else:
        dev_peaks = []
    if world > 1:
        dist.all_reduce(host)
        gathered = [None] * world
        dist.all_gather_object(gathered, dev_peaks)
        dev_peaks = [p for part in gathered for p in part]
    if args.mode == "ddp":
        dist.destroy_process_group()
    if rank == 0:
        result = {"framework": "pytorch", "torch": torch.__version__, "mode": args.mode, "processes": world,
                  "threads_per_process": args.threads, "channels_last": layout is not None, "epochs": epochs,
                  "peak_host_bytes": int(host.item()), "peak_device_bytes": [int(p) for p in dev_peaks]}
        with open(result_path, "w") as f:
            json.dump(result, f)


def main():
    # zoo (the models and the optimizer flags) imports torch.
    try:
        import torch
        import torch.multiprocessing as mp
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import zoo
    except ImportError as e:
        print(f"train_epochs.py: PyTorch is not installed ({e})", file=sys.stderr)
        return NOT_INSTALLED
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="store_true", help="print PyTorch's version and exit")
    p.add_argument("--data", help="directory exported by dp-bench; a GPT's: a token directory")
    p.add_argument("--model", default="lenet", help="mlp, lenet, cnn, resnet18 or gpt:PRESET,KEY=VALUE,...")
    p.add_argument("--mode", choices=["one", "ddp", "dp"], default="one")
    p.add_argument("--devices", default="cpu", help="cpu, or GPUs: cuda:0 or 0,1 (ddp: one per process)")
    p.add_argument("--nproc", type=int, default=1, help="ddp: processes")
    p.add_argument("--backend", choices=["auto", "gloo", "nccl"], default="auto",
                   help="ddp: auto is NCCL on GPUs, gloo on CPUs (gloo for a GPU shared by processes)")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads per process")
    p.add_argument("--channels-last", action="store_true",
                   help="model and batches in channels_last (NHWC), PyTorch's faster CPU layout for convolutions")
    p.add_argument("--workers", type=int, default=1, help="DataLoader worker processes per training process")
    p.add_argument("--batch", type=int, default=256, help="global batch")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--warmup-steps", type=int, default=5)
    p.add_argument("--eval-batch", type=int, default=1000)
    p.add_argument("--lr", type=float, default=0.02)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--weight-decay", type=float, default=5e-4)
    zoo.add_optimizer_args(p)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tf32", action="store_true", help="TF32 for matmul and cuDNN (CUDA)")
    p.add_argument("--precision", choices=["32", "bf16-mixed", "16-mixed"], default="32",
                   help="torch.autocast dtype (16-mixed adds a GradScaler), as dp-train's --precision")
    p.add_argument("--grad-reduce-dtype", choices=["fp32", "bf16"], default="fp32",
                   help="bf16: DDP's bf16_compress_hook, as dp-train's --grad-reduce-dtype")
    p.add_argument("--out", help="write the result object here")
    args = p.parse_args()
    if args.version:
        print(torch.__version__)
        return 0
    if not args.data or not args.out:
        p.error("--data and --out are required")
    if args.batch < 1 or args.epochs < 1 or args.warmup_steps < 0 or args.nproc < 1 or args.threads < 1:
        p.error("--batch, --epochs, --nproc and --threads must be positive, --warmup-steps non-negative")
    world = args.nproc if args.mode == "ddp" else 1
    if args.mode == "dp" and args.devices.startswith("cpu"):
        p.error("--mode dp takes GPUs")
    if args.batch % world:
        p.error(f"--batch {args.batch} cannot be split over {world} processes")
    if args.mode == "ddp":
        with tempfile.TemporaryDirectory(prefix="train-epochs-") as d:
            args.store = os.path.join(d, "store")
            mp.spawn(worker, args=(args, args.out), nprocs=world, join=True)
    else:
        worker(0, args, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
