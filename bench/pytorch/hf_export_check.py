"""dp-generate --export-hf against transformers: a small GPT trained by
dp-train, exported as Hugging Face's GPT-2 files, loaded by
`GPT2LMHeadModel.from_pretrained` and `AutoTokenizer.from_pretrained` from
that folder alone. Checked for each case:

  - the exported tokenizer encodes the text as tiktoken's gpt2 does on
    GPT-2's own files (text-bytes: as the text's bytes), and its vocab.json
    and merges.txt are GPT-2's (the same token: id pairs, the same merges);
  - transformers' model (float64) continues a prompt greedily with the
    tokens dp-generate --checkpoint draws at top-k 1 (float32), decoded by
    transformers' tokenizer to the same bytes (text-bytes: the ids are the
    bytes).

  python bench/pytorch/hf_export_check.py --build build --tokenizer DIR --text FILE
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch
from gpt2_tokenizer import gpt2_encoding
from transformers import AutoTokenizer, GPT2LMHeadModel

CASES = [  # (name, model spec, data option, tokenizer?)
    ("bpe, bias", "gpt:n_layer=2,n_head=4,n_embd=64,block_size=64,dropout=0,bias=true", "text", True),
    ("bpe, no bias", "gpt:n_layer=2,n_head=4,n_embd=64,block_size=64,dropout=0,bias=false", "text", True),
    ("bytes, no bias", "gpt:gpt-char,n_layer=2,n_head=4,n_embd=64,block_size=64,dropout=0", "text-bytes", False),
]


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, **kw).stdout


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default="build")
    p.add_argument("--tokenizer", required=True, help="GPT-2's encoder.json and vocab.bpe")
    p.add_argument("--text", required=True)
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--tokens", type=int, default=60)
    p.add_argument("--prompt", default="The meaning of life is")
    args = p.parse_args()
    apps = os.path.join(args.build, "apps")
    enc = gpt2_encoding(args.tokenizer)
    text = open(args.text, encoding="utf-8").read()[:200_000]
    ok = True
    with tempfile.TemporaryDirectory() as work:
        env = dict(os.environ, FANOUT_CACHE_DIR=os.path.join(work, "cache"))
        for name, spec, kind, bpe in CASES:
            run_dir, hf = os.path.join(work, "run" + str(len(name))), os.path.join(work, "hf" + str(len(name)))
            cmd = [os.path.join(apps, "dp-train"), "--model", spec, "--data", kind + ":" + args.text, "--devices",
                   "cpu", "--batch-size", "16", "--max-steps", str(args.steps), "--optimizer", "adamw", "--lr", "3e-3",
                   "--eval-steps", "8", "--progress", "off", "--save-dir", run_dir, "--metrics",
                   os.path.join(run_dir, "m.jsonl")]
            run(cmd + (["--tokenizer", args.tokenizer] if bpe else []), env=env)
            ckpt = os.path.join(run_dir, "best.safetensors")
            print(run([os.path.join(apps, "dp-generate"), "--checkpoint", ckpt, "--export-hf", hf]).decode().strip())
            tok = AutoTokenizer.from_pretrained(hf)
            model = GPT2LMHeadModel.from_pretrained(hf).double().eval()
            # The tokenizer.
            want_ids = enc.encode_ordinary(text) if bpe else list(text.encode("utf-8"))
            same_ids = tok(text)["input_ids"] == want_ids
            files = True
            if bpe:
                files = json.load(open(os.path.join(hf, "vocab.json"))) == json.load(
                    open(os.path.join(args.tokenizer, "encoder.json")))
                ours = open(os.path.join(hf, "merges.txt"), encoding="utf-8").read().splitlines()[1:]
                theirs = [l for l in open(os.path.join(args.tokenizer, "vocab.bpe"), encoding="utf-8").read()
                          .splitlines()[1:] if l]
                files &= ours == theirs
            # Greedy continuation.
            out = run([os.path.join(apps, "dp-generate"), "--checkpoint", ckpt, "--prompt", args.prompt, "--top-k", "1",
                       "--max-new-tokens", str(args.tokens)])
            ids = tok(args.prompt)["input_ids"]
            block = model.config.n_positions
            with torch.no_grad():
                for _ in range(args.tokens):
                    ids.append(int(torch.argmax(model(torch.tensor([ids[-block:]])).logits[0, -1])))
            got = bytes(tok.decode(ids), "utf-8") if bpe else bytes(ids)
            same_text = out == got + b"\n"
            case_ok = same_ids and files and same_text
            ok &= case_ok
            print("%s (%s): tokenizer %s on %d characters%s; %d greedy tokens %s" % (
                name, spec, "identical" if same_ids else "DIFFERS", len(text),
                ", files GPT-2's" if bpe and files else (", files DIFFER" if bpe else ""), args.tokens,
                "identical" if same_text else "DIFFER"))
            if not same_text:
                print("  fanout:       %r\n  transformers: %r" % (out[:200], got[:200]))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
