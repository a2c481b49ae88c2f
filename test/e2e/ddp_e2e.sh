#!/usr/bin/env bash
# e2e: dp-train --strategy ddp against one device, through the launcher.
# - 20 SGD steps (synthetic:960, global batch 48, 1 epoch) of mlp and lenet:
#   DDP over 1, 2 and 3 processes and hybrid 2x2 equal one device within
#   1e-5 relative (per tensor, max |a - b| / max |b|); with --split-invariant,
#   bit-identical parameters.
# - --accumulate 4 of batch 12 equals batch 48 (one device and DDP).
# - Rank 0 alone prints and saves; --log-dir keeps one log per rank.
# - Bad launch input: one line, non-zero exit.
set -euo pipefail
: "${DP_TRAIN:?path to dp-train}"
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$work"

train() {  # name model args...
  local name=$1 model=$2
  shift 2
  "$DP_TRAIN" --model "$model" --data synthetic:960 --epochs 1 --batch-size "${batch:-48}" --lr-schedule constant --seed 3 \
    --progress off --workers 0 --save-dir "$work/$name" "$@" > "$work/$name.out" 2> "$work/$name.err" ||
    { echo "run $name failed:"; cat "$work/$name.out" "$work/$name.err"; exit 1; }
}

for model in mlp lenet; do
  for si in "" "--split-invariant"; do
    tag=$model${si:+-si}
    train "$tag-one" $model --devices cpu $si
    train "$tag-ddp1" $model --devices cpu --strategy ddp $si
    train "$tag-ddp2" $model --devices cpu:2 --strategy ddp $si
    train "$tag-ddp3" $model --devices cpu:3 --strategy ddp $si
    train "$tag-hybrid" $model --devices cpu:4 --strategy ddp --nproc-per-node 2 $si
  done
done
batch=12 train acc-one mlp --devices cpu --accumulate 4
batch=12 train acc-ddp2 mlp --devices cpu:2 --strategy ddp --accumulate 4
batch=12 train acc-si-ddp2 mlp --devices cpu:2 --strategy ddp --accumulate 4 --split-invariant

python3 - "$work" <<'PY'
import sys
import numpy as np
from safetensors.numpy import load_file
work = sys.argv[1]
def params(name):
    t = load_file(f"{work}/{name}/epoch-0001.safetensors")
    return {k: v for k, v in t.items() if not k.startswith("optimizer.")}
def compare(a, b, exact):
    pa, pb = params(a), params(b)
    assert pa.keys() == pb.keys(), f"{a} vs {b}: different tensors"
    worst = 0.0
    for k in pb:
        if exact:
            assert pa[k].tobytes() == pb[k].tobytes(), f"{a} vs {b}: {k} differs"
        else:
            d = float(np.max(np.abs(pa[k].astype(np.float64) - pb[k]))) / max(float(np.max(np.abs(pb[k]))), 1e-30)
            worst = max(worst, d)
    print(f"{a} vs {b}: " + ("bit-identical" if exact else f"max relative difference {worst:.2e}"))
    assert exact or worst <= 1e-5, f"{a} vs {b}: {worst} > 1e-5"
for model in ("mlp", "lenet"):
    for si in ("", "-si"):
        ref = f"{model}{si}-one"
        for mode in ("ddp1", "ddp2", "ddp3", "hybrid"):
            compare(f"{model}{si}-{mode}", ref, exact=bool(si))
compare("acc-one", "mlp-one", exact=False)
compare("acc-ddp2", "mlp-one", exact=False)
compare("acc-si-ddp2", "mlp-si-one", exact=True)
PY

# Each run took the optimizer steps it should: 20 (48 rows per step, also with accumulation).
python3 - "$work" <<'PY'
import sys, json
from safetensors import safe_open
work = sys.argv[1]
for name, steps in (("mlp-ddp2", 20), ("lenet-hybrid", 20), ("acc-ddp2", 20)):
    with safe_open(f"{work}/{name}/epoch-0001.safetensors", "np") as f:
        got = int(f.metadata()["step"])
    assert got == steps, f"{name}: {got} optimizer steps, expected {steps}"
print("optimizer steps as expected")
PY

# Rank 0 alone prints; the summary appears once.
count=$(grep -c '^epoch 1/1' "$work/mlp-ddp3.out")
[ "$count" = 1 ] || { echo "expected one summary line, got $count"; exit 1; }
grep -q '^ddp: 3 processes' "$work/mlp-ddp3.out"
[ ! -s "$work/mlp-ddp3.err" ] || { echo "unexpected stderr:"; cat "$work/mlp-ddp3.err"; exit 1; }

# --log-dir keeps each rank's output.
"$DP_TRAIN" --model mlp --data synthetic:96 --epochs 1 --batch-size 48 --devices cpu:2 --strategy ddp \
  --progress off --log-dir "$work/logs" > /dev/null
for f in "$work/logs/rank-0.log" "$work/logs/rank-1.log"; do
  [ -f "$f" ] || fail "--log-dir wrote no $f"
done
grep -q 'final test accuracy' "$work/logs/rank-0.log"
# A second run into the same --log-dir appends after a mark (the first run's output stays); a run
# started while another holds the directory is refused, naming the holder.
"$DP_TRAIN" --model mlp --data synthetic:96 --epochs 1 --batch-size 48 --devices cpu:2 --strategy ddp \
  --progress off --log-dir "$work/logs" > /dev/null
[ "$(grep -c 'final test accuracy' "$work/logs/rank-0.log")" -eq 2 ] &&
  grep -q -e '^--- dp-train: a new run (pid [0-9]*, ' "$work/logs/rank-1.log" ||
  { cat "$work/logs/rank-0.log"; fail "--log-dir: the second run did not append after a mark"; }
exec 9> "$work/logs/.fanout-node-0.lock"
flock -n 9 && printf 4242 >&9
if "$DP_TRAIN" --model mlp --data synthetic:96 --epochs 1 --batch-size 48 --devices cpu:2 --strategy ddp \
     --progress off --log-dir "$work/logs" > /dev/null 2> "$work/logs-held.err"; then
  fail "--log-dir held by another run: accepted"
fi
exec 9>&-
grep -qF "dp-train: error: --log-dir $work/logs is in use by another run (pid 4242): give each run its own" \
  "$work/logs-held.err" || { cat "$work/logs-held.err"; fail "--log-dir held: the error does not name it"; }

# Checkpoints: rank 0 writes them; a DDP run stopped after epoch 2 and
# resumed equals the uninterrupted run (metrics and parameters); a resume on
# another world size warns and trains on to the end (exit 0).
ck=(--model lenet --data synthetic:960 --epochs 4 --batch-size 48 --seed 2 --progress off --devices cpu:2
    --strategy ddp --augment crop:2,flip)
"$DP_TRAIN" "${ck[@]}" --save-dir "$work/full" --metrics "$work/full.jsonl" > /dev/null
"$DP_TRAIN" "${ck[@]}" --save-dir "$work/part" --metrics "$work/part.jsonl" --stop-after 2 > /dev/null
cp "$work/part/epoch-0002.safetensors" "$work/epoch2.safetensors"
"$DP_TRAIN" "${ck[@]}" --resume "$work/part" --metrics "$work/part.jsonl" > "$work/resume.out"
grep -q 'resumed from .*epoch-0002.safetensors: 2 of 4 epochs done' "$work/resume.out"
python3 - "$work" <<'PY'
import json, sys
from safetensors.numpy import load_file
work = sys.argv[1]
def rows(name):
    return [{k: v for k, v in json.loads(l).items() if k in ("epoch", "train_loss", "train_acc", "test_loss", "test_acc", "lr")}
            for l in open(f"{work}/{name}.jsonl")]
assert rows("full") == rows("part"), (rows("full"), rows("part"))
a, b = load_file(f"{work}/full/epoch-0004.safetensors"), load_file(f"{work}/part/epoch-0004.safetensors")
assert a.keys() == b.keys() and all(a[k].tobytes() == b[k].tobytes() for k in a), "resumed DDP run differs"
print("DDP resume: metrics and checkpoint identical to the uninterrupted run")
PY
rc=0
"$DP_TRAIN" "${ck[@]/cpu:2/cpu:3}" --resume "$work/epoch2.safetensors" \
  > "$work/resume3.out" 2> "$work/resume3.err" || rc=$?
[ "$rc" = 0 ] || { cat "$work/resume3.out" "$work/resume3.err"; fail "resume on world size 3 exited with $rc"; }
grep -qF 'dp-train: warning: world_size was 2 in the checkpoint, now 3: the run will not continue exactly' \
  "$work/resume3.err" || { cat "$work/resume3.err"; fail "resume on world size 3: no world_size warning"; }
grep -q 'resumed from .*epoch2.safetensors: 2 of 4 epochs done' "$work/resume3.out" || { cat "$work/resume3.out"; fail "resume on world size 3: no resume line"; }
grep -q '^epoch 4/4' "$work/resume3.out" || { cat "$work/resume3.out"; fail "resume on world size 3 did not train to epoch 4"; }

# Bad launch input: one line on stderr, non-zero exit, nothing started.
bad() {  # expected-substring args...
  local want=$1
  shift
  set +e
  "$DP_TRAIN" --model mlp --data synthetic:96 --epochs 1 --progress off "$@" > "$work/bad.out" 2> "$work/bad.err"
  local rc=$?
  set -e
  [ $rc -ne 0 ] || { echo "expected failure for: $*"; exit 1; }
  [ "$(wc -l < "$work/bad.err")" = 1 ] || { echo "expected one line for: $*"; cat "$work/bad.err"; exit 1; }
  grep -qF -- "$want" "$work/bad.err" || { echo "expected '$want' for: $*"; cat "$work/bad.err"; exit 1; }
  echo "refused as expected: $*: $(cat "$work/bad.err")"
}
bad "--nproc-per-node must be at least 1" --devices cpu:2 --strategy ddp --nproc-per-node 0
bad "cannot split 3 devices evenly over 2 processes" --devices cpu:3 --strategy ddp --nproc-per-node 2
bad "--rdzv: bad rendezvous 'tcp:host'" --devices cpu:2 --strategy ddp --rdzv tcp:host
bad "expected redis:HOST:PORT" --devices cpu:2 --strategy ddp --rdzv redis:localhost
bad "cannot reach the Redis rendezvous at 127.0.0.1:1" --devices cpu:2 --strategy ddp --rdzv redis:127.0.0.1:1
bad "bad --strategy 'ring'" --strategy ring
bad "cannot be split evenly over 2 processes" --devices cpu:2 --strategy ddp --batch-size 33
bad "need the same --run-id" --devices cpu --strategy ddp --nnodes 2 --rdzv redis:127.0.0.1:1
bad "--node-rank 2 is outside 0..1" --devices cpu --strategy ddp --nnodes 2 --node-rank 2 --rdzv redis:127.0.0.1:1 --run-id x
bad "need --strategy ddp" --devices cpu --nnodes 2
bad "need --strategy ddp" --devices cpu --node-rank 1
bad "there is no network interface 'nope0' on this machine" --devices cpu:2 --strategy ddp --iface nope0
bad "--iface applies to --strategy ddp" --devices cpu --iface lo
bad "cannot read --rdzv-password-file $work/none" --devices cpu:2 --strategy ddp --rdzv-password-file "$work/none"
: > "$work/empty"
bad "--rdzv-password-file $work/empty is empty" --devices cpu:2 --strategy ddp --rdzv-password-file "$work/empty"
# One process of two replicas shards among them alone (an internal check had refused it); a file
# rendezvous serves a second run of the same --run-id (the first removed its keys).
train shard-one-process lenet --devices cpu:2 --strategy ddp --nproc-per-node 1 --shard-grads
for i in 1 2; do train "rdzv-again-$i" mlp --devices cpu:2 --strategy ddp --rdzv "file:$work/rd" --run-id same; done
echo "ddp e2e: ok"
