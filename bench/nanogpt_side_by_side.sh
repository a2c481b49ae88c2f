#!/usr/bin/env bash
# fanout's dp-train beside PyTorch (bench/pytorch/nanogpt_train.py, nanoGPT's
# model) training the same character GPT on the same text, batch for batch:
# the same windows in the same order, AdamW (lr 1e-3, betas 0.9/0.99, weight
# decay 0.1 on matrices and embeddings only), clipping at norm 1 and
# nanoGPT's warmup-cosine schedule, at nanoGPT's CPU configuration (n_layer
# 4, n_head 4, n_embd 128, block 64, batch 12, dropout 0, 2000 steps). Runs,
# one after another:
#   fanout_cpu      dp-train --devices cpu    (one device, every core)
#   fanout_cpu2     dp-train --devices cpu:2  (DataParallel over two replicas)
#   pytorch_Nt      nanogpt_train.py at N threads, for N in $TORCH_THREADS
# then plots every validation curve in OUT_DIR/val_loss.png and prints a
# Markdown table (also OUT_DIR/summary.md): last evaluation's step and
# validation loss, training wall time (evaluations excluded), tokens/s.
# The initial weights differ (each framework draws its own) unless
# SAME_INIT=1, so by default the curves agree in shape and level, not value
# for value.
#
#   bash bench/nanogpt_side_by_side.sh BUILD_DIR PYTHON_WITH_TORCH OUT_DIR [STEPS]
#
# The text: $FANOUT_TEXT, else the fortunes of the Debian package `fortunes`
# concatenated as apps/train_text.sh does. STEPS (default 2000) is
# --max-steps and --lr-decay-steps; the warm-up is 100 steps from 1000 steps
# up, STEPS / 20 below; evaluations every 250 steps (STEPS / 4 below 1000
# steps) on 200 batches of validation windows. Environment: TORCH_THREADS
# (default "2"; "2 1" adds a one-thread run), SEED (0), EVAL_EVERY,
# EVAL_STEPS, WARMUP, PLOT_PYTHON (python3, with matplotlib), SKIP_FANOUT=1
# (keep OUT_DIR's fanout runs and their token cache: PyTorch runs and the
# plot only), SAME_INIT=1 (dp-train --init-from the PyTorch run's initial
# weights, written by nanogpt_train.py --save-init; needs the safetensors
# package: then the curves agree value for value, up to float rounding).
set -euo pipefail
if [ $# -lt 3 ]; then
  sed -n '/^#   bash/p' "$0" >&2
  exit 2
fi
build=$(cd "$1" && pwd) python=$2 out=$3 steps=${4:-2000}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
out=$(cd "$out" && pwd)
seed=${SEED:-0}
eval_every=${EVAL_EVERY:-$((steps >= 1000 ? 250 : (steps / 4 > 0 ? steps / 4 : 1)))}
eval_steps=${EVAL_STEPS:-200}
warmup=${WARMUP:-$((steps >= 1000 ? 100 : steps / 20))}
plot_python=${PLOT_PYTHON:-python3}
batch=12 block=64
model="gpt:gpt-char,n_layer=4,n_head=4,n_embd=128,block_size=$block,dropout=0"

corpus=${FANOUT_TEXT:-$out/fortunes.txt}
if [ -z "${FANOUT_TEXT:-}" ]; then
  mapfile -t files < <(find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' | sort)
  [ ${#files[@]} -gt 0 ] || { echo "no fortunes in /usr/share/games/fortunes: set FANOUT_TEXT=FILE" >&2; exit 1; }
  cat "${files[@]}" > "$corpus"
fi
corpus=$(cd "$(dirname "$corpus")" && pwd)/$(basename "$corpus")

# dp-train keeps text:FILE's token files in $FANOUT_CACHE_DIR/text-char-KEY,
# KEY the text's 64-bit FNV-1a-style hash in hex, with tokens.cpp's own
# offset basis (runtime/data/tokens.cpp's fnv1a).
export FANOUT_CACHE_DIR=$out/cache
key=$(python3 -c '
import sys
h = 1469598103934665603
for b in open(sys.argv[1], "rb").read():
    h = ((h ^ b) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
print("%016x" % h)' "$corpus")
tokens=$FANOUT_CACHE_DIR/text-char-$key

common=(--seed "$seed" --max-steps "$steps" --lr 1e-3 --min-lr 1e-4 --warmup-steps "$warmup"
        --lr-decay-steps "$steps" --weight-decay 0.1 --clip-grad-norm 1)
evals=(--eval-every "$eval_every" --eval-steps "$eval_steps")
fanout_evals=("${evals[@]}")
help=$("$build/apps/dp-train" --help 2>&1 || true)
if [[ $help != *--eval-every* || $help != *--eval-steps* ]]; then
  echo "warning: this dp-train has no --eval-every/--eval-steps: fanout's runs have no curves" >&2
  fanout_evals=()
fi
init=()  # SAME_INIT=1: dp-train starts from the first PyTorch run's initial weights

fanout() {  # fanout NAME DEVICES
  rm -f "$out/$1.jsonl"
  echo "== fanout $2" >&2
  "$build/apps/dp-train" --model "$model" --data "text:$corpus" --batch-size "$batch" --optimizer adamw \
    --betas 0.9,0.99 --no-decay-norm-bias --lr-schedule warmup-cosine "${common[@]}" "${fanout_evals[@]}" \
    "${init[@]}" --devices "$2" --progress off --metrics "$out/$1.jsonl" 2>&1 | tee "$out/$1.log"
}
runs=()
torch_runs() {
  local save=()
  [ "${SAME_INIT:-0}" != 1 ] || save=(--save-init "$out/init.safetensors")
  for t in ${TORCH_THREADS:-2}; do
    rm -f "$out/pytorch_${t}t.jsonl"
    echo "== pytorch, $t threads" >&2
    "$python" "$here/pytorch/nanogpt_train.py" --data "$tokens" --n-layer 4 --n-head 4 --n-embd 128 \
      --block-size "$block" --batch-size "$batch" --dropout 0 --beta1 0.9 --beta2 0.99 "${common[@]}" \
      "${evals[@]}" --threads "$t" --json "$out/pytorch_${t}t.jsonl" "${save[@]}" 2>&1 | tee "$out/pytorch_${t}t.log"
    runs+=("pytorch $t thread$([ "$t" = 1 ] || echo s)=$out/pytorch_${t}t.jsonl")
    save=()  # every run draws the same weights (the same seed)
  done
}
fanout_runs() {
  [ "${SKIP_FANOUT:-0}" = 1 ] && return
  fanout fanout_cpu cpu
  fanout fanout_cpu2 cpu:2
}

if [ "${SAME_INIT:-0}" = 1 ]; then
  # The PyTorch runs first (they need the token cache: one dp-train step writes it), then fanout from their weights.
  if [ ! -f "$tokens/meta.json" ]; then
    echo "== token cache" >&2
    "$build/apps/dp-train" --model "$model" --data "text:$corpus" --batch-size "$batch" --max-steps 1 \
      --devices cpu:2 --progress off > "$out/cache.log" 2>&1
  fi
  torch_runs
  init=(--init-from "$out/init.safetensors")
  fanout_runs
else
  fanout_runs  # the first writes the token cache
  [ -f "$tokens/meta.json" ] || { echo "dp-train left no token cache at $tokens" >&2; exit 1; }
  torch_runs
fi
runs=("fanout cpu=$out/fanout_cpu.jsonl" "fanout cpu:2=$out/fanout_cpu2.jsonl" "${runs[@]}")

"$plot_python" "$here/plot_lm_curves.py" --out "$out/val_loss.png" --tokens-per-step $((batch * block)) \
  --title "char GPT on $(basename "$corpus"): validation loss (batch $batch, block $block, $steps steps)" \
  "${runs[@]}" | tee "$out/summary.md"
