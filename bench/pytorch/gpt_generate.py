#!/usr/bin/env python3
"""PyTorch CPU generation speed of a GPT (bench/pytorch/gpt.py), the way
nanoGPT's sample.py generates: for each new token the whole context (its
last block_size tokens) runs forward, the head only on the last position
(nanoGPT's inference shortcut), and the logits are divided by the
temperature, cut to the top k, softmaxed and drawn from. No key-value cache
(nanoGPT has none). Random weights (the cost does not depend on them), eval
mode, torch.no_grad, float32, one prompt token.

  python3 bench/pytorch/gpt_generate.py --model SPEC --vocab-size V --tokens N [--threads 2] [--rounds 3]

SPEC is fanout's model name ("gpt:gpt-char,dropout=0"). Prints one JSON line:
  {"framework": "pytorch", "model": ..., "tokens": N, "threads": ..., "seconds": ..., "ms_per_token": ...}
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt  # noqa: E402  (bench/pytorch/gpt.py)


def last_logits(model, idx):
    t = idx.size(1)
    pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
    x = model.transformer.drop(model.transformer.wte(idx) + model.transformer.wpe(pos))
    for block in model.transformer.h:
        x = block(x)
    return model.lm_head(model.transformer.ln_f(x[:, [-1], :]))[:, -1, :]


@torch.no_grad()
def generate(model, idx, n, temperature=0.8, top_k=200):
    for _ in range(n):
        cond = idx if idx.size(1) <= model.config.block_size else idx[:, -model.config.block_size:]
        logits = last_logits(model, cond) / temperature
        if top_k:
            v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
            logits[logits < v[:, [-1]]] = -float("inf")
        idx = torch.cat((idx, torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)), dim=1)
    return idx


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--vocab-size", type=int, required=True)
    ap.add_argument("--tokens", type=int, default=255)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--rounds", type=int, default=3, help="the fastest round is reported")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = gpt.GPT(gpt.parse_config(args.model, args.vocab_size)).eval()
    best = float("inf")
    generate(model, torch.zeros((1, 1), dtype=torch.long), 4)  # warm-up
    for _ in range(args.rounds):
        start = time.perf_counter()
        generate(model, torch.zeros((1, 1), dtype=torch.long), args.tokens)
        best = min(best, time.perf_counter() - start)
    print(json.dumps({"framework": "pytorch", "model": args.model, "tokens": args.tokens, "threads": args.threads,
                      "seconds": round(best, 3), "ms_per_token": round(1000 * best / args.tokens, 3)}))


if __name__ == "__main__":
    main()
