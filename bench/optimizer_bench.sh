#!/usr/bin/env bash
# Cost of each optimizer, fanout beside PyTorch in one run:
#  1. the optimizer step alone on resnet18's and lenet's parameters:
#     optim-bench (one CPU device) and bench/pytorch/optimizer_step.py
#     (every core), SGD, Adam, AdamW, and AdamW with clipping by norm;
#  2. whole training steps: dp-bench step mode (one device, DataParallel over
#     DEVICES) and bench/pytorch/train_throughput.py (one process on every
#     core) for the same model, batch and optimizer, SGD and AdamW interleaved.
#   bash bench/optimizer_bench.sh BUILD_DIR PYTHON OUT_DIR [DEVICES]
set -euo pipefail
build=$1 python=$2 out=$3 devices=${4:-cpu:2}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
run() {  # run MODEL INPUT BATCH STEPS OPTIMIZER
  local model=$1 input=$2 batch=$3 steps=$4 opt=$5
  "$build/apps/dp-bench" --model "$model" --input "$input" --batch-size "$batch" --devices "$devices" --no-ddp \
    --warmup 2 --steps "$steps" --repeats 3 --optimizer "$opt" --json "$out/fanout.jsonl" | tee -a "$out/fanout.txt"
  local lr=0.01  # dp-bench step mode's rates
  [ "$opt" = sgd ] || lr=1e-3
  "$python" "$here/pytorch/train_throughput.py" --device cpu --models "$model" --batch "$batch" --warmup 2 \
    --iters "$((steps * 3))" --optimizer "$opt" --lr "$lr" | tee -a "$out/pytorch.jsonl"
}
[ "${SKIP_STEP_ONLY:-0}" = 1 ] || for spec in "resnet18 3x32x32" "lenet 1x28x28"; do
  set -- $spec
  "$build/bench/optim-bench" --model "$1" --input "$2" | tee -a "$out/optim_step.txt"
  "$build/bench/optim-bench" --model "$1" --input "$2" --optimizers adamw --clip-grad-norm 1 | tee -a "$out/optim_step.txt"
  "$python" "$here/pytorch/optimizer_step.py" --model "$1" --input "$2" | tee -a "$out/optim_step.jsonl"
  "$python" "$here/pytorch/optimizer_step.py" --model "$1" --input "$2" --optimizers adamw --clip-grad-norm 1 \
    | tee -a "$out/optim_step.jsonl"
done
for opt in sgd adamw; do run lenet 1x28x28 256 20 "$opt"; done
for opt in sgd adamw; do run resnet18 3x32x32 32 5 "$opt"; done
