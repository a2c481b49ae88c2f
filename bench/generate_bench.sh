#!/usr/bin/env bash
# Generation speed on the CPU: dp-generate with the key-value cache, with
# --no-kv-cache (the whole context for every token, as nanoGPT's sample.py),
# and PyTorch generating as sample.py does (bench/pytorch/gpt_generate.py),
# each TOKENS new tokens after a one-token prompt, the fastest of ROUNDS.
# dp-generate's time is its run's minus a run drawing no tokens (loading the
# checkpoint); PyTorch's excludes start-up. The checkpoint comes from one
# dp-train step on a small text (the weights do not change the cost).
#
#   bash bench/generate_bench.sh BUILD_DIR PYTHON_WITH_TORCH [MODEL] [TOKENS] [ROUNDS]
#
# MODEL (fanout's name, default gpt:gpt-char,dropout=0: nanoGPT's
# shakespeare_char, block 256), TOKENS (default 255: the prompt and the new
# tokens fill the block, the cache's case; past block_size both ways run
# the whole window for each token), ROUNDS (default 3).
# Threads: every core for both (THREADS sets both counts).
set -euo pipefail
if [ $# -lt 2 ]; then
  sed -n '/^#   bash/p' "$0" >&2
  exit 2
fi
build=$(cd "$1" && pwd) python=$2 model=${3:-gpt:gpt-char,dropout=0} tokens=${4:-255} rounds=${5:-3}
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export FANOUT_CACHE_DIR="$work/cache"  # dp-train's token files, removed with the rest
threads=${THREADS:-$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)}
export OMP_NUM_THREADS=$threads  # dp-generate's CPU device takes this many
# A text of 65 distinct characters (shakespeare_char's vocabulary size).
python3 -c '
import random, string
r = random.Random(1)
chars = string.ascii_letters + ",.;:!?- \n\x27&$3"
print("".join(r.choice(chars) for _ in range(200000)), end="")' > "$work/text.txt"
"$build/apps/dp-train" --model "$model" --data "text:$work/text.txt" --devices cpu --batch-size 2 --max-steps 1 \
  --progress off --save-dir "$work/run" > /dev/null
ckpt="$work/run/best.safetensors"
vocab=$(python3 -c "import sys; print(len(set(open(sys.argv[1], encoding='utf-8').read())))" "$work/text.txt")
seconds() {  # the fastest of $rounds runs of dp-generate with the given flags
  local best=
  for _ in $(seq "$rounds"); do
    local s e
    s=$(date +%s.%N)
    "$build/apps/dp-generate" --checkpoint "$ckpt" --seed 1 "$@" > /dev/null
    e=$(date +%s.%N)
    best=$(python3 -c "import sys; a=float(sys.argv[1]); b=sys.argv[2]; print(min(a, float(b)) if b else a)" \
      "$(python3 -c "print($e - $s)")" "$best")
  done
  echo "$best"
}
load=$(seconds --max-new-tokens 0)
cached=$(seconds --max-new-tokens "$tokens")
whole=$(seconds --max-new-tokens "$tokens" --no-kv-cache)
torch_json=$("$python" "$here/pytorch/gpt_generate.py" --model "$model" --vocab-size "$vocab" --tokens "$tokens" \
  --rounds "$rounds" --threads "$threads")
python3 - "$model" "$tokens" "$load" "$cached" "$whole" "$torch_json" <<'PY'
import json, sys
model, tokens, load, cached, whole, torch_json = sys.argv[1:]
tokens, load, cached, whole = int(tokens), float(load), float(cached), float(whole)
pt = json.loads(torch_json)
rows = [("fanout, key-value cache", cached - load), ("fanout, --no-kv-cache", whole - load),
        (f"PyTorch {pt['threads']} threads, sample.py's way", pt["seconds"])]
print(f"| {model}, {tokens} tokens | s | ms/token | vs PyTorch |")
print("|---|---|---|---|")
for name, s in rows:
    print(f"| {name} | {s:.2f} | {1000 * s / tokens:.2f} | {pt['seconds'] / s:.2f}x |")
PY
