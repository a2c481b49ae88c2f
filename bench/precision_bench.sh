#!/usr/bin/env bash
# What the mixed-precision modes cost on CPU devices, fanout beside PyTorch
# in one run: dp-bench step mode (one device and DataParallel over DEVICES)
# and bench/pytorch/train_throughput.py (one process on every core, CPU
# autocast) for lenet and resnet18 in 32, bf16-mixed and 16-mixed, SGD.
# Where the CPU has bfloat16 instructions both multiply bf16-mixed in
# bfloat16; elsewhere, and for 16-mixed, the rows show what the modes cost
# around float32 kernels (GPUs are where the modes pay; see bench/gpu).
#   bash bench/precision_bench.sh BUILD_DIR PYTHON OUT_DIR [DEVICES]
set -euo pipefail
build=$1 python=$2 out=$3 devices=${4:-cpu:2}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
for spec in "lenet 1x28x28 256 10" "resnet18 3x32x32 32 4"; do
  set -- $spec
  for p in 32 bf16-mixed 16-mixed; do
    "$build/apps/dp-bench" --model "$1" --input "$2" --batch-size "$3" --devices "$devices" --no-ddp \
      --warmup 2 --steps "$4" --repeats 3 --precision "$p" --json "$out/fanout.jsonl" | tee -a "$out/fanout.txt"
    # PyTorch's float16 on CPU takes over a minute per resnet18 step: one step after one warm-up.
    warm=2 iters=$(($4 * 3))
    [ "$p" = 16-mixed ] && warm=1 iters=1
    "$python" "$here/pytorch/train_throughput.py" --device cpu --models "$1" --batch "$3" --warmup "$warm" \
      --iters "$iters" --lr 0.01 --precision "$p" | tee -a "$out/pytorch.jsonl"
  done
done
