"""Per-process memory and step time of a GPT under PyTorch's sharding on CPU
processes (Gloo), beside bench/zero_memory.sh's fanout rows: DDP with
AdamW, DDP with ZeroRedundancyOptimizer (ZeRO-1), each also with every
Block under activation checkpointing (torch.utils.checkpoint, non-reentrant,
as apply_activation_checkpointing wraps it), and FSDP SHARD_GRAD_OP (ZeRO-2)
where the backend runs it.

Each of --nproc processes (one intra-op thread each) trains --steps steps
of nanoGPT's step (AdamW, betas 0.9/0.95, its two groups, random tokens,
dropout 0) on its rows of a global batch and reports, after the last step
and before zero_grad: the bytes of the parameters, of the gradients it
holds (p.grad of every parameter it sees; FSDP: its flat parameters'), of
its optimizer state, the process's peak resident set, and the median
ms/step after the first.

  /tmp/torchenv/bin/python bench/pytorch/zero_memory.py --model gpt:gpt2,block_size=256 --batch 2
"""
import argparse
import os
import resource
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

HERE = os.path.dirname(os.path.abspath(__file__))


def tensor_bytes(ts):
    seen, total = set(), 0
    for t in ts:
        if t is None or not torch.is_tensor(t) or t.dim() == 0 or t.data_ptr() in seen:
            continue
        seen.add(t.data_ptr())
        total += t.numel() * t.element_size()
    return total


def worker(rank, args, mode, store, out):
    sys.path.insert(0, HERE)
    import gpt
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
    from torch.distributed.optim import ZeroRedundancyOptimizer

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=args.nproc)
    config = gpt.parse_config(args.model)
    g = torch.Generator().manual_seed(0)
    local = args.batch // args.nproc
    idx = torch.randint(0, 50257, (args.batch, config.block_size + 1), generator=g)[rank * local:(rank + 1) * local]
    x, y = idx[:, :-1].contiguous(), idx[:, 1:].contiguous()
    lines = []
    torch.manual_seed(0)
    model = gpt.GPT(config)
    ckpt = mode.endswith("-ckpt")
    mode = mode.removesuffix("-ckpt")
    if ckpt:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_activation_checkpointing
        apply_activation_checkpointing(model, check_fn=lambda m: isinstance(m, gpt.Block))
    try:
        if mode == "fsdp":
            net = FSDP(model, sharding_strategy=ShardingStrategy.SHARD_GRAD_OP, use_orig_params=True)
            opt = torch.optim.AdamW(net.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1)
            params = list(net.parameters())
        else:
            net = torch.nn.parallel.DistributedDataParallel(model)
            groups = model.optimizer_groups(0.1)
            if mode == "zero":
                opt = ZeroRedundancyOptimizer(groups[0]["params"], optimizer_class=torch.optim.AdamW, lr=6e-4,
                                              betas=(0.9, 0.95), weight_decay=0.1)
                opt.add_param_group(groups[1])
            else:
                opt = torch.optim.AdamW(groups, lr=6e-4, betas=(0.9, 0.95))
            params = list(model.parameters())
        times = []
        for s in range(args.steps):
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            _, loss = net(x, y)
            loss.backward()
            if mode == "fsdp":
                net.clip_grad_norm_(1.0)
            else:
                torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            times.append(time.perf_counter() - t0)
        inner = opt.optim if hasattr(opt, "optim") else opt
        state = tensor_bytes(t for s in inner.state.values() for t in s.values())
        grads = tensor_bytes(p.grad for p in params)
        if mode == "fsdp":  # the flat parameters FSDP holds and their (sharded) gradients
            flat = [m._flat_param for m in FSDP.fsdp_modules(net) if getattr(m, "_flat_param", None) is not None]
            grads = tensor_bytes(f.grad for f in flat)
            pbytes = tensor_bytes(flat)
        else:
            pbytes = tensor_bytes(params)
        ms = 1e3 * sorted(times[1:])[len(times[1:]) // 2]
        lines.append(f"{mode}{'-ckpt' if ckpt else ''} rank {rank}: params {pbytes} grads {grads} state {state} "
                     f"peak_rss {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024} ms {ms:.0f}")
    except Exception as e:  # a backend without the collective the mode needs
        lines.append(f"{mode} rank {rank}: fails: {type(e).__name__}: {str(e).splitlines()[0][:160]}")
    with open(f"{out}.{rank}", "w") as f:
        f.write("\n".join(lines) + "\n")
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="gpt:gpt2,block_size=256")
    p.add_argument("--batch", type=int, default=2, help="global batch (rows)")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--modes", default="ddp,ddp-ckpt,zero,zero-ckpt,fsdp")
    args = p.parse_args()
    for mode in args.modes.split(","):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "rows")
            mp.spawn(worker, args=(args, mode, os.path.join(d, "store"), out), nprocs=args.nproc)
            for r in range(args.nproc):
                print(open(f"{out}.{r}").read(), end="", flush=True)


if __name__ == "__main__":
    main()
