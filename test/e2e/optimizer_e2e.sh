#!/usr/bin/env bash
# e2e: the optimizer options through dp-train.
#  - lenet with AdamW (lr 1e-3) on Fashion-MNIST over cpu:2 reaches 0.885 in 3 epochs.
#  - resnet18 on synthetic data with AdamW, --no-decay-norm-bias and
#    --clip-grad-norm: an uninterrupted run, and a run resumed from one of
#    its mid-epoch checkpoints, end with the same tensors, bit for bit
#    (parameters, buffers, exp_avg / exp_avg_sq), and the same metrics,
#    the epoch's gradient norms included.
#  - mlp with AdamW (amsgrad), groups and both clippings: DDP over 2
#    processes equals one device bit for bit (split-invariant).
#  - the same resnet18 run with --checkpoint-activations ends with the same
#    tensors, bit for bit, and reports fewer activation bytes.
#  - best.safetensors holds the model alone; an epoch checkpoint the model
#    and optimizer.<state>.<param> for every state and parameter.
# Seeded, split-invariant math gives those bits to a run that ignored
# --resume as well, so every resumed run must also say where it resumed (the
# checkpoint, its epoch, batch and step) and its metrics file hold only the
# epochs after the checkpoint.
set -euo pipefail
: "${DP_TRAIN:?path to dp-train}"
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
# resumed NAME LINE EPOCHS: NAME.log holds the line LINE ("resumed from ..."), and NAME.jsonl the epochs EPOCHS only.
resumed() {
  grep -qxF "$2" "$work/$1.log" || { cat "$work/$1.log"; fail "$1: no line '$2'"; }
  local got
  got=$(python3 -c 'import json, sys; print(*[json.loads(l)["epoch"] for l in open(sys.argv[1])])' "$work/$1.jsonl")
  [ "$got" = "$3" ] || fail "$1: the resumed run trained epochs '$got', not '$3'"
  echo "$1: $2; trained epoch(s) $got"
}

"$DP_TRAIN" --model lenet --optimizer adamw --lr 1e-3 --epochs 3 --devices cpu:2 --progress off \
  --metrics "$work/lenet.jsonl" | tee "$work/lenet.txt"
python3 - "$work/lenet.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
acc = rows[-1]["test_acc"]
print(f"lenet AdamW cpu:2, 3 epochs: test accuracy {acc:.4f}")
assert acc >= 0.885, f"test accuracy {acc} below 0.885"
assert "grad_norm_mean" not in rows[-1], "no clipping, no norms"
PY

# DDP over 2 processes (the launcher's workers) with AdamW, groups and both
# clippings against one device, split-invariant: the same tensors bit for bit.
ddp=(--model mlp --data synthetic:256 --batch-size 32 --epochs 2 --seed 2 --progress off --split-invariant
     --optimizer adamw --amsgrad --lr 1e-3 --no-decay-norm-bias --clip-grad-norm 0.5 --clip-grad-value 0.02)
"$DP_TRAIN" "${ddp[@]}" --devices cpu --save-dir "$work/one" --metrics "$work/one.jsonl" > /dev/null
"$DP_TRAIN" "${ddp[@]}" --devices cpu:2 --strategy ddp --save-dir "$work/ddp" --metrics "$work/ddp.jsonl" > /dev/null
python3 - "$work" <<'PY'
import json, sys
from safetensors.numpy import load_file
work = sys.argv[1]
a, b = load_file(f"{work}/one/epoch-0002.safetensors"), load_file(f"{work}/ddp/epoch-0002.safetensors")
assert sorted(a) == sorted(b) and any(k.startswith("optimizer.max_exp_avg_sq.") for k in a)
for k in a:
    assert a[k].tobytes() == b[k].tobytes(), f"{k}: DDP over 2 processes differs from one device"
one = [json.loads(l) for l in open(f"{work}/one.jsonl")]
ddp = [json.loads(l) for l in open(f"{work}/ddp.jsonl")]
for x, y in zip(one, ddp):
    for k in ("train_loss", "test_loss", "grad_norm_mean", "grad_norm_max"):
        assert x[k] == y[k], f"epoch {x['epoch']} {k}: {x[k]} vs {y[k]}"
assert one[0]["grad_norm_max"] > 0.5, "clipping by norm acted in the first epoch"
print(f"AdamW + clipping, DDP over 2 processes == one device, bit for bit ({len(a)} tensors)")
PY

# --shard-optimizer: DataParallel over cpu:2 with each replica stepping half of AdamW's state equals
# one device bit for bit (split-invariant), and its checkpoint resumes sharded over cpu:3.
"$DP_TRAIN" "${ddp[@]}" --devices cpu:2 --shard-optimizer --save-dir "$work/sharded" --metrics "$work/sharded.jsonl" \
  > /dev/null
"$DP_TRAIN" "${ddp[@]}" --devices cpu:2 --shard-optimizer --stop-after 1 --save-dir "$work/sharded-part" > /dev/null
"$DP_TRAIN" "${ddp[@]}" --devices cpu:3 --shard-optimizer --resume "$work/sharded-part" \
  --metrics "$work/sharded-resumed.jsonl" > "$work/sharded-resumed.log"
# 256 samples in batches of 32: 8 steps an epoch.
resumed sharded-resumed "resumed from $work/sharded-part/epoch-0001.safetensors: 1 of 2 epochs done, 8 steps" 2
python3 "$here/same_tensors.py" "$work/one/epoch-0002.safetensors" "$work/sharded/epoch-0002.safetensors" \
  "$work/sharded-part/epoch-0002.safetensors"
python3 - "$work" <<'PY'
import json, sys
from safetensors.numpy import load_file
rows = [json.loads(l) for l in open(f"{sys.argv[1]}/sharded.jsonl")]
b = rows[-1]["replica_bytes"]
# The parameters are counted once, on the primary (CPU replicas read its arena); the whole optimizer
# state the first epoch's checkpoint assembled there is gone by the last epoch's end (the next step frees
# it); the rest (gradients, a half of AdamW's state each) about the same; arena entries and shards are
# aligned to 16 floats.
tensors = load_file(f"{sys.argv[1]}/sharded/epoch-0002.safetensors")
params = {k: v for k, v in tensors.items() if not k.startswith("optimizer")}
state = {k: v for k, v in tensors.items() if k.startswith("optimizer")}
p, s = sum(v.nbytes for v in params.values()), sum(v.nbytes for v in state.values())
assert len(b) == 2 and abs(b[0] - b[1] - p) <= 64 * (len(params) + len(state)) + 256, \
    f"sharded replicas hold {b}, parameters {p} bytes (the checkpoint's assembled state, {s} bytes, freed)"
print(f"--shard-optimizer cpu:2 == one device, and resumed on cpu:3, bit for bit; replica bytes {b}, parameters {p} "
      f"(the checkpoint's assembled state, {s} bytes, freed by the next step)")
PY

# --shard-optimizer under DDP: 2 processes (a shard each) equal one device bit
# for bit; stopped after epoch 1 and resumed as the hybrid 2 processes x 2
# replicas (4 shards), the same again.
"$DP_TRAIN" "${ddp[@]}" --devices cpu:2 --strategy ddp --shard-optimizer --save-dir "$work/ddp-sharded" > /dev/null
"$DP_TRAIN" "${ddp[@]}" --devices cpu:2 --strategy ddp --shard-optimizer --stop-after 1 \
  --save-dir "$work/ddp-sharded-part" > /dev/null
"$DP_TRAIN" "${ddp[@]}" --devices cpu:4 --nproc-per-node 2 --strategy ddp --shard-optimizer \
  --resume "$work/ddp-sharded-part" --metrics "$work/ddp-sharded-resumed.jsonl" > "$work/ddp-sharded-resumed.log"
resumed ddp-sharded-resumed "resumed from $work/ddp-sharded-part/epoch-0001.safetensors: 1 of 2 epochs done, 8 steps" 2
python3 "$here/same_tensors.py" "$work/one/epoch-0002.safetensors" "$work/ddp-sharded/epoch-0002.safetensors" \
  "$work/ddp-sharded-part/epoch-0002.safetensors"
echo "--shard-optimizer DDP 2 processes == one device, and resumed as the hybrid 2x2, bit for bit"

# --shard-grads (ZeRO-2): DataParallel over cpu:2 and the hybrid 2 processes x 2 replicas equal one
# device bit for bit; no replica holds more than under --shard-optimizer (this mlp's first matrix is
# most of it and a bucket alone, which every replica's gradient window keeps whole; resnet18's and
# GPT's savings are measured in test_parallel and bench/RESULTS.md).
"$DP_TRAIN" "${ddp[@]}" --devices cpu:2 --shard-grads --save-dir "$work/grads" --metrics "$work/grads.jsonl" > /dev/null
"$DP_TRAIN" "${ddp[@]}" --devices cpu:4 --nproc-per-node 2 --strategy ddp --shard-grads --save-dir "$work/ddp-grads" \
  > /dev/null
python3 "$here/same_tensors.py" "$work/one/epoch-0002.safetensors" "$work/grads/epoch-0002.safetensors" \
  "$work/ddp-grads/epoch-0002.safetensors"
python3 - "$work" <<'PY'
import json, sys
z1 = [json.loads(l) for l in open(f"{sys.argv[1]}/sharded.jsonl")][-1]["replica_bytes"]
z2 = [json.loads(l) for l in open(f"{sys.argv[1]}/grads.jsonl")][-1]["replica_bytes"]
assert len(z2) == 2 and all(b <= a for a, b in zip(z1, z2)), f"--shard-grads replicas hold {z2}, --shard-optimizer {z1}"
print(f"--shard-grads cpu:2 and hybrid 2x2 == one device bit for bit; replica bytes {z2} (--shard-optimizer {z1})")
PY

common=(--model resnet18 --data synthetic:96 --batch-size 16 --epochs 2 --devices cpu --seed 4 --progress off
        --optimizer adamw --lr 2e-3 --weight-decay 0.05 --no-decay-norm-bias --clip-grad-norm 1.0 --lr-schedule cosine)
"$DP_TRAIN" "${common[@]}" --save-dir "$work/whole" --save-every-steps 2 --keep-last 20 --metrics "$work/whole.jsonl"
ls "$work/whole"
[ -f "$work/whole/epoch-0001-batch-0000004.safetensors" ] || { echo "FAIL: no mid-epoch checkpoint"; exit 1; }
# --checkpoint-activations: every BasicBlock recomputed in backward; the same tensors at the end, bit
# for bit (parameters, running statistics, AdamW's state), and fewer activation bytes.
"$DP_TRAIN" "${common[@]}" --checkpoint-activations --save-dir "$work/ckpt" --metrics "$work/ckpt.jsonl" > /dev/null
python3 "$here/same_tensors.py" "$work/whole/epoch-0002.safetensors" "$work/ckpt/epoch-0002.safetensors"
python3 - "$work" <<'PY'
import json, sys
act = lambda f: [json.loads(l) for l in open(f"{sys.argv[1]}/{f}.jsonl")][-1]["replica_memory"][0]["activations"]
plain, ckpt = act("whole"), act("ckpt")
assert 0 < ckpt < plain, f"activation bytes {ckpt} with --checkpoint-activations, {plain} without"
print(f"--checkpoint-activations == without, bit for bit; activation bytes {ckpt:,} (without: {plain:,})")
PY
"$DP_TRAIN" "${common[@]}" --resume "$work/whole/epoch-0001-batch-0000004.safetensors" --save-dir "$work/resumed" \
  --metrics "$work/resumed.jsonl" | tee "$work/resumed.log"
# 96 samples in batches of 16: 6 steps an epoch; the checkpoint is 4 batches into the second.
resumed resumed "resumed from $work/whole/epoch-0001-batch-0000004.safetensors: 1 of 2 epochs done and 4 batches of the next, 10 steps" 2

python3 - "$work" <<'PY'
import json, sys
import numpy as np
from safetensors.numpy import load_file
from safetensors import safe_open
work = sys.argv[1]
a = load_file(f"{work}/whole/epoch-0002.safetensors")
b = load_file(f"{work}/resumed/epoch-0002.safetensors")
assert sorted(a) == sorted(b), set(a) ^ set(b)
for k in a:
    assert a[k].dtype == b[k].dtype and a[k].tobytes() == b[k].tobytes(), f"{k} differs after the resume"
params = [k for k in a if not k.startswith("optimizer.") and not k.endswith(("running_mean", "running_var", "num_batches_tracked"))]
for state in ("exp_avg", "exp_avg_sq"):
    have = {k[len("optimizer." + state + "."):] for k in a if k.startswith(f"optimizer.{state}.")}
    assert have == set(params), f"{state}: {sorted(set(params) ^ have)[:5]}"
assert not any(k.startswith("optimizer.momentum_buffer.") for k in a)
with safe_open(f"{work}/whole/epoch-0002.safetensors", "np") as f:
    opt = json.loads(f.metadata()["optimizer"])
assert opt["type"] == "AdamW" and opt["steps"] == 12 and [g["name"] for g in opt["groups"]] == ["default", "no_decay"], opt
best = load_file(f"{work}/whole/best.safetensors")
assert sorted(best) == sorted(k for k in a if not k.startswith("optimizer.")), "best.safetensors is the model alone"
whole = [json.loads(l) for l in open(f"{work}/whole.jsonl")]
resumed = [json.loads(l) for l in open(f"{work}/resumed.jsonl")]
assert [m["epoch"] for m in resumed] == [2], resumed
for k in ("train_loss", "train_acc", "test_loss", "test_acc", "grad_norm_mean", "grad_norm_max"):
    assert whole[-1][k] == resumed[-1][k], f"{k}: {whole[-1][k]} vs {resumed[-1][k]}"
assert whole[-1]["grad_norm_max"] > 1.0, "clipping at 1.0 acted on some step"
print(f"resnet18 AdamW + groups + clipping: resumed mid-epoch == uninterrupted, bit for bit ({len(a)} tensors); "
      f"grad norm mean {whole[-1]['grad_norm_mean']:.3f}, max {whole[-1]['grad_norm_max']:.3f}")
PY
