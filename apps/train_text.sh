#!/usr/bin/env bash
# Sets up a fresh machine (dependencies, build), then trains a character GPT
# (gpt-char at nanoGPT's CPU size: 4 layers, 4 heads, 128 wide, block 64) on
# the fortunes of the Debian package `fortunes` (2.5 million characters) for
# one epoch on every device, with nanoGPT's AdamW settings and warmup-cosine
# schedule, and prints a sample. FANOUT_TEXT=FILE trains on another text;
# extra arguments go to dp-train.
set -euo pipefail
# A relative FANOUT_TEXT is the caller's, read before the script moves to the repository.
if [ -n "${FANOUT_TEXT:-}" ]; then
  [ -f "$FANOUT_TEXT" ] || { echo "train_text.sh: FANOUT_TEXT=$FANOUT_TEXT is not a file" >&2; exit 1; }
  FANOUT_TEXT=$(realpath "$FANOUT_TEXT")
fi
cd "$(dirname "$0")/.."
bash apps/setup.sh
corpus=${FANOUT_TEXT:-build/fortunes.txt}
if [ -z "${FANOUT_TEXT:-}" ]; then
  mapfile -t files < <(find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' | sort)
  cat "${files[@]}" > "$corpus"
fi
# One epoch of batches of 12 windows of 65 characters, 90% of the text training;
# nanoGPT's 100 warm-up steps, or a tenth of a shorter run.
steps=$(( $(wc -m < "$corpus") * 9 / 10 / 64 / 12 ))
steps=$(( steps < 1 ? 1 : steps ))
warmup=$(( steps / 10 < 100 ? steps / 10 : 100 ))
./build/apps/dp-train --model gpt:gpt-char,n_layer=4,n_head=4,n_embd=128,block_size=64,dropout=0 \
  --data "text:$corpus" --epochs 1 --batch-size 12 --devices auto --optimizer adamw --lr 1e-3 --betas 0.9,0.99 \
  --weight-decay 0.1 --no-decay-norm-bias --clip-grad-norm 1 --lr-schedule warmup-cosine --warmup-steps "$warmup" \
  --lr-decay-steps "$steps" --save-dir build/text-run --overwrite "$@"
exec ./build/apps/dp-generate --checkpoint build/text-run/best.safetensors --prompt "Q: " --max-new-tokens 300
