#!/usr/bin/env python3
"""GPT-2 124M sampling on the CPU, fanout beside transformers, both with a
key-value cache: transformers' GPT2LMHeadModel (GPT2Config's defaults:
12 layers, 12 heads, 768 wide, block 1024, vocabulary 50257; random
weights, which do not change the cost), saved by save_pretrained and read
by `dp-generate --weights` in Hugging Face's layout. Both continue the same
prompt for TOKENS tokens, top-k 200, temperature 0.8, float32, on the same
thread count; transformers through model.generate (use_cache), inside
torch.inference_mode; fanout's time is its run's less a run drawing no
tokens (start-up and loading). The fastest of ROUNDS.

  python bench/pytorch/hf_generate_bench.py --dp-generate build/apps/dp-generate --tokenizer DIR [--tokens 200]
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

import torch
from gpt2_tokenizer import gpt2_encoding
from transformers import GPT2Config, GPT2LMHeadModel


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dp-generate", required=True)
    p.add_argument("--tokenizer", required=True, help="GPT-2's encoder.json and vocab.bpe")
    p.add_argument("--tokens", type=int, default=200)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--prompt", default="The meaning of life is")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config()).eval()
    ids = torch.tensor([gpt2_encoding(args.tokenizer).encode(args.prompt)])
    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(d, safe_serialization=True)
        weights = os.path.join(d, "model.safetensors")
        env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))

        def fanout(tokens):
            best = float("inf")
            for _ in range(args.rounds):
                t0 = time.perf_counter()
                subprocess.run([args.dp_generate, "--weights", weights, "--model", "gpt:gpt2,vocab_size=50257",
                                "--tokenizer", args.tokenizer, "--prompt", args.prompt, "--max-new-tokens",
                                str(tokens), "--seed", "1"], check=True, env=env, stdout=subprocess.DEVNULL)
                best = min(best, time.perf_counter() - t0)
            return best

        ours = fanout(args.tokens) - fanout(0)
    theirs = float("inf")
    with torch.inference_mode():
        for r in range(args.rounds + 1):  # the first warms up
            t0 = time.perf_counter()
            out = model.generate(ids, do_sample=True, top_k=200, temperature=0.8, max_new_tokens=args.tokens,
                                 min_new_tokens=args.tokens, use_cache=True, pad_token_id=50256)
            if r > 0:
                theirs = min(theirs, time.perf_counter() - t0)
    assert out.shape[1] == ids.shape[1] + args.tokens, out.shape
    print("GPT-2 124M, %d tokens after %d, %d threads: fanout %.2f s (%.1f ms/token), transformers %s %.2f s "
          "(%.1f ms/token): %.2fx" % (args.tokens, ids.shape[1], args.threads, ours, 1e3 * ours / args.tokens,
                                      __import__("transformers").__version__, theirs, 1e3 * theirs / args.tokens,
                                      theirs / ours))


if __name__ == "__main__":
    sys.exit(main())
