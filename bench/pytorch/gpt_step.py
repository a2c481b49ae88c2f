#!/usr/bin/env python3
"""PyTorch CPU training throughput of a GPT (bench/pytorch/gpt.py, nanoGPT's
model.py architecture), the reference for fanout's GPT step on the CPU.

A step is nanoGPT's: forward with the loss (cross-entropy over every token),
backward, clip_grad_norm_(1.0), AdamW (nanoGPT's two groups, weight decay
0.1 on the matrices and embeddings), zero_grad(set_to_none=True). Eager
mode, float32, dropout 0 (but in char-dropout), random token ids and
targets (this measures compute, not a data loader). Configurations:

  char  nanoGPT's CPU run of shakespeare_char: n_layer 4, n_head 4,
        n_embd 128, block 64, batch 12, vocab 65, no bias
        (lr 1e-3, betas 0.9/0.99)
  char-dropout  char with dropout 0.2 (shakespeare_char's rate)
  gpt2  GPT-2 small (12 layers, 12 heads, 768, vocab 50304, bias; 124,475,904
        parameters at block 1024),
        --gpt2-batch (1) of --gpt2-block tokens (default 256; 1024 is nanoGPT's)
        (lr 6e-4, betas 0.9/0.95)
  shakespeare  nanoGPT's GPU run of shakespeare_char (6, 6, 384, block 256,
        batch 64, vocab 65, no bias; dropout 0 here)
  head  one layer of width 64 under GPT-2's vocabulary (50257), batch 8 of
        256: a step spent mostly in the tied head and the loss over
        2048 x 50257 logits

--device cuda runs on the GPU (TF32 on, as fanout's --allow-tf32 rows) and
--precision bf16-mixed under torch.autocast(bfloat16), with
F.scaled_dot_product_attention's fused kernels.

Threads: torch.set_num_threads(--threads) (default: every core), the
count fanout's run is given. Timing: --warmup steps, then --iters steps,
wall clock. One JSON line per configuration on stdout:
  {"framework": "pytorch", "model": "gpt:...", "batch": ..., "block": ...,
   "threads": ..., "ms_per_step": ..., "tokens_per_second": ...}

  python3 bench/pytorch/gpt_step.py [--configs char,gpt2] [--threads 2]
"""
import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt  # noqa: E402  (bench/pytorch/gpt.py)


def configs(args):
    return {
        "char": (gpt.GPTConfig(block_size=64, vocab_size=65, n_layer=4, n_head=4, n_embd=128, dropout=0.0,
                               bias=False), 12, 1e-3, (0.9, 0.99),
                 "gpt:gpt-char,n_layer=4,n_head=4,n_embd=128,block_size=64,dropout=0,vocab_size=65"),
        "char-dropout": (gpt.GPTConfig(block_size=64, vocab_size=65, n_layer=4, n_head=4, n_embd=128, dropout=0.2,
                                       bias=False), 12, 1e-3, (0.9, 0.99),
                         "gpt:gpt-char,n_layer=4,n_head=4,n_embd=128,block_size=64,dropout=0.2,vocab_size=65"),
        "gpt2": (gpt.GPTConfig(block_size=args.gpt2_block), args.gpt2_batch, 6e-4, (0.9, 0.95),
                 f"gpt:gpt2,block_size={args.gpt2_block}"),
        "shakespeare": (gpt.GPTConfig(block_size=256, vocab_size=65, n_layer=6, n_head=6, n_embd=384, dropout=0.0,
                                      bias=False), 64, 1e-3, (0.9, 0.99), "gpt:gpt-char,dropout=0"),
        "head": (gpt.GPTConfig(block_size=256, vocab_size=50257, n_layer=1, n_head=1, n_embd=64, dropout=0.0,
                               bias=False), 8, 1e-3, (0.9, 0.95),
                 "gpt:gpt-char,n_layer=1,n_head=1,n_embd=64,block_size=256,dropout=0,vocab_size=50257"),
    }


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--configs", default="char,gpt2")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=10, help="timed steps (gpt2: a fifth of them, at least 2)")
    p.add_argument("--gpt2-block", type=int, default=256)
    p.add_argument("--gpt2-batch", type=int, default=1)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--precision", default="32", choices=["32", "bf16-mixed"])
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    dev = torch.device(args.device)
    if args.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    autocast = torch.autocast(args.device, dtype=torch.bfloat16, enabled=args.precision == "bf16-mixed")
    known = configs(args)
    for name in args.configs.split(","):
        if name not in known:
            raise SystemExit(f"unknown configuration {name!r} (known: {', '.join(known)})")
        config, batch, lr, betas, spec = known[name]
        torch.manual_seed(1)
        model = gpt.GPT(config).to(dev)
        model.train()
        opt = torch.optim.AdamW(model.optimizer_groups(0.1), lr=lr, betas=betas)
        params = list(model.parameters())
        t = config.block_size
        x = torch.randint(0, config.vocab_size, (batch, t)).to(dev)
        y = torch.randint(0, config.vocab_size, (batch, t)).to(dev)

        def step():
            with autocast:
                _, loss = model(x, y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss.item()

        for _ in range(args.warmup):
            step()
        iters = args.iters if name != "gpt2" or args.device == "cuda" else max(2, args.iters // 5)
        sync()
        start = time.perf_counter()
        for _ in range(iters):
            step()
        sync()
        seconds = time.perf_counter() - start
        print(json.dumps({
            "framework": "pytorch", "torch": torch.__version__, "model": spec, "config": name,
            "parameters": model.num_params(non_embedding=False), "batch": batch, "block": t, "threads": args.threads,
            "device": args.device, "precision": args.precision,
            "steps": iters, "ms_per_step": round(1e3 * seconds / iters, 3),
            "tokens_per_second": round(batch * t * iters / seconds, 1),
        }), flush=True)


if __name__ == "__main__":
    main()
