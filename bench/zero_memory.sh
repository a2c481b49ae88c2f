#!/usr/bin/env bash
# Per-replica memory and step time of a GPT with AdamW on DataParallel cpu:2
# under each sharding: none, --shard-optimizer (ZeRO-1), --shard-grads
# (ZeRO-2), each without and with --checkpoint-activations; then, with
# --python, PyTorch's DDP and ZeroRedundancyOptimizer (each without and
# with activation checkpointing) and FSDP SHARD_GRAD_OP over 2 Gloo
# processes (bench/pytorch/zero_memory.py). Memory in MiB per replica
# (replica 0 / replica 1), from the epoch metrics' replica_memory.
# Random tokens (nanoGPT's uint16 train.bin/val.bin); the step is nanoGPT's
# (AdamW, betas 0.9/0.95, weight decay 0.1 off the one-dimensional
# parameters, clipping at 1.0, dropout 0).
#
# On a GPU (bench/gpu/run_gpu.sh's memory step): --devices 0,0, --modes
# without --shard-grads and --extra "--precision bf16-mixed"; replicas on
# one repeated GPU share its pool, and its activations are split evenly
# between them.
#
#   bench/zero_memory.sh [--build DIR] [--model gpt:gpt2,block_size=256] [--batch 2] [--steps 4]
#                        [--devices cpu:2] [--modes none,none+ckpt,...] [--extra "FLAGS"] [--python PY]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$here/../build model=gpt:gpt2,block_size=256 batch=2 steps=4 python= devices=cpu:2 extra=
modes=none,none+ckpt,--shard-optimizer,--shard-optimizer+ckpt,--shard-grads,--shard-grads+ckpt
while [ $# -gt 0 ]; do
  case $1 in
    --build) build=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --devices) devices=$2; shift 2 ;;
    --modes) modes=$2; shift 2 ;;
    --extra) extra=$2; shift 2 ;;
    --python) python=$2; shift 2 ;;
    *) echo "usage: $0 [--build DIR] [--model SPEC] [--batch N] [--steps N] [--devices D] [--modes M,...]" \
         "[--extra FLAGS] [--python PY]" >&2; exit 2 ;;
  esac
done
read -r -a extra_flags <<< "$extra"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 - "$work/tokens" <<'PY'
import json, os, sys
import numpy as np
d = sys.argv[1]
os.makedirs(d)
rng = np.random.default_rng(0)
rng.integers(0, 50257, 1 << 20, dtype=np.uint16).tofile(f"{d}/train.bin")
rng.integers(0, 50257, 4096, dtype=np.uint16).tofile(f"{d}/val.bin")
json.dump({"vocab_size": 50304}, open(f"{d}/meta.json", "w"))
PY
echo "| configuration | params | grads | optimizer state | activations | total | ms/step |"
echo "| --- | --- | --- | --- | --- | --- | --- |"
for mode in ${modes//,/ }; do
  flags=("${extra_flags[@]}")
  [ "${mode%+ckpt}" != none ] && flags+=("${mode%+ckpt}")
  [ "${mode%+ckpt}" != "$mode" ] && flags+=(--checkpoint-activations)
  "$build/apps/dp-train" --model "$model" --data "tokens:$work/tokens" --devices "$devices" --batch-size "$batch" \
    --optimizer adamw --lr 6e-4 --betas 0.9,0.95 --weight-decay 0.1 --no-decay-norm-bias --clip-grad-norm 1.0 \
    --max-steps "$steps" --timing-warmup 1 --progress off --workers 0 --metrics "$work/$mode.jsonl" "${flags[@]}" \
    > "$work/$mode.log"
  python3 - "$work/$mode.jsonl" "$mode" "$steps" "$devices" <<'PY'
import json, sys
m = [json.loads(l) for l in open(sys.argv[1])][-1]
r = m["replica_memory"]
ms = 1e3 * m["steady_epoch_seconds"] / int(sys.argv[3])  # the steps after the first, scaled to all
mib = lambda f: " / ".join(f"{f(x) / 2**20:.0f}" for x in r)
total = lambda x: x["params"] + x["grads"] + x["buffers"] + x["optimizer_state"] + x["activations"]
name = sys.argv[2].replace("+ckpt", " --checkpoint-activations")
print(f"| fanout {sys.argv[4]}, {name} | {mib(lambda x: x['params'])} | {mib(lambda x: x['grads'])} | "
      f"{mib(lambda x: x['optimizer_state'])} | {mib(lambda x: x['activations'])} | {mib(total)} | {ms:.0f} |")
PY
done
if [ -n "$python" ]; then
  "$python" "$here/pytorch/zero_memory.py" --model "$model" --batch "$batch" --steps "$steps"
fi
