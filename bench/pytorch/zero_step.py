"""PyTorch DDP step time with and without ZeroRedundancyOptimizer (ZeRO-1),
beside dp-bench's DDP rows with and without --shard-optimizer.

Spawns --nproc processes (gloo on CPU, NCCL on GPUs), each with --threads
intra-op threads and its share of a random global batch; times --iters
AdamW steps after --warmup and prints, per configuration, the median ms per
step over --repeats runs and the optimizer state rank 0 holds.

  python zero_step.py --model resnet18 --shape 3x32x32 --batch 32 --nproc 2
"""
import argparse
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn


def state_bytes(opt):
    if hasattr(opt, "optim"):  # ZeroRedundancyOptimizer: this rank's partition
        opt = opt.optim
    return sum(t.numel() * t.element_size() for s in opt.state.values() for t in s.values()
               if torch.is_tensor(t) and t.dim() > 0)


def worker(rank, args, store, out):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import zoo
    from torch.distributed.optim import ZeroRedundancyOptimizer

    torch.set_num_threads(args.threads)
    cuda = args.device != "cpu"
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo", init_method="file://" + store, rank=rank,
                            world_size=args.nproc)
    shape = tuple(int(v) for v in args.shape.split("x"))
    local = args.batch // args.nproc
    g = torch.Generator().manual_seed(args.seed)
    x = torch.randn((args.batch,) + shape, generator=g)[rank * local:(rank + 1) * local].to(device)
    y = torch.randint(0, 10, (args.batch,), generator=g)[rank * local:(rank + 1) * local].to(device)
    rows = []
    for zero in (False, True):
        torch.manual_seed(args.seed)
        model, _ = zoo.build(args.model, shape, 10)
        model = model.to(device)
        net = nn.parallel.DistributedDataParallel(model, device_ids=[rank] if cuda else None)
        if zero:
            opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-3,
                                          weight_decay=5e-4)
        else:
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=5e-4)
        loss_fn = nn.CrossEntropyLoss()

        def step():
            opt.zero_grad(set_to_none=False)
            loss = loss_fn(net(x), y)
            loss.backward()
            opt.step()
            loss.item()

        for _ in range(args.warmup):
            step()
        times = []
        for _ in range(args.repeats):
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(args.iters):
                step()
            times.append((time.perf_counter() - t0) / args.iters)
        times.sort()
        rows.append(("pytorch ddp %d processes%s" % (args.nproc, ", ZeroRedundancyOptimizer" if zero else ""),
                     1e3 * times[len(times) // 2], state_bytes(opt)))
    if rank == 0:
        with open(out, "w") as f:
            for name, ms, b in rows:
                f.write("%-52s %10.1f %14d\n" % (name, ms, b))
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="resnet18")
    p.add_argument("--shape", default="3x32x32", help="one sample's shape, CxHxW")
    p.add_argument("--batch", type=int, default=32, help="global batch")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--threads", type=int, default=1, help="intra-op threads per process")
    p.add_argument("--device", default="cpu", help="cpu, or cuda (one GPU per process)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--iters", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    if args.batch % args.nproc:
        sys.exit("--batch must split evenly over --nproc")
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "rows.txt")
        mp.spawn(worker, args=(args, os.path.join(d, "store"), out), nprocs=args.nproc)
        print("%-52s %10s %14s" % ("configuration", "ms/step", "opt state B"))
        print(open(out).read(), end="")


if __name__ == "__main__":
    main()
