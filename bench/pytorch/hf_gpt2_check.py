"""dp-generate on Hugging Face's GPT-2 layout: a GPT2LMHeadModel (transformers,
random weights drawn wide enough that each token's logits have a clear
maximum) saved by save_pretrained, read by `dp-generate --weights` as
nanoGPT's from_pretrained reads it; both continue the same prompt greedily
(top-k 1), fanout in float32 on the CPU, transformers in float64, and the
tokens must agree. The activation is the exact GELU (activation_function
"gelu"), nanoGPT's and fanout's; GPT-2's checkpoints use the tanh form
("gelu_new"), whose outputs differ by up to about 1e-3 of an activation,
as they do in nanoGPT. The prompt is encoded and the continuation decoded
with tiktoken on GPT-2's files in DIR (encoder.json and vocab.bpe).

  python bench/pytorch/hf_gpt2_check.py --dp-generate build/apps/dp-generate --tokenizer DIR
"""
import argparse
import os
import subprocess
import sys
import tempfile

import torch
from gpt2_tokenizer import gpt2_encoding
from transformers import GPT2Config, GPT2LMHeadModel


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dp-generate", required=True)
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--tokens", type=int, default=60)
    p.add_argument("--prompt", default="The meaning of life is")
    args = p.parse_args()
    enc = gpt2_encoding(args.tokenizer)
    ok = True
    for layers, heads, width, block in ((2, 4, 64, 128), (4, 12, 192, 64)):
        torch.manual_seed(layers)
        cfg = GPT2Config(vocab_size=50257, n_positions=block, n_embd=width, n_layer=layers, n_head=heads,
                         activation_function="gelu", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                         initializer_range=0.3)
        model = GPT2LMHeadModel(cfg).eval()
        with tempfile.TemporaryDirectory() as d:
            model.save_pretrained(d, safe_serialization=True)
            spec = "gpt:n_layer=%d,n_head=%d,n_embd=%d,block_size=%d,vocab_size=50257,bias=true,dropout=0" % (
                layers, heads, width, block)
            out = subprocess.run([args.dp_generate, "--weights", os.path.join(d, "model.safetensors"), "--model", spec,
                                  "--tokenizer", args.tokenizer, "--prompt", args.prompt, "--top-k", "1",
                                  "--max-new-tokens", str(args.tokens)], check=True, capture_output=True).stdout
        ids = enc.encode(args.prompt)
        model = model.double()
        with torch.no_grad():
            for _ in range(args.tokens):
                logits = model(torch.tensor([ids[-block:]])).logits[0, -1]
                ids.append(int(torch.argmax(logits)))
        want = (enc.decode_bytes(ids) + b"\n")
        same = out == want
        ok &= same
        print("%s: %d greedy tokens %s: %r" % (spec, args.tokens, "identical" if same else "DIFFER", want[:60]))
        if not same:
            print("  fanout:       %r\n  transformers: %r" % (out[:200], want[:200]))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
