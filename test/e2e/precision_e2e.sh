#!/usr/bin/env bash
# e2e: mixed precision through dp-train on CPU devices.
#  - lenet on Fashion-MNIST over cpu:2 reaches 0.88 in 3 epochs in
#    bf16-mixed and in 16-mixed (the loss scale and skipped steps are in
#    the metrics of 16-mixed only).
#  - A run resumed from the uninterrupted run's epoch-2 checkpoint ends with
#    the same tensors as it, bit for bit, and the same loss scaler state
#    (16-mixed's scale has grown at step 2000 by then); checkpoints hold
#    float32 weights whatever the precision. (Stopping with --stop-after is
#    e2e.checkpoint's.)
#  - 16-mixed resumed from a mid-epoch checkpoint: the same, bit for bit.
# Seeded math gives those bits to a run that ignored --resume as well, so each
# resumed run must also say where it resumed (the checkpoint, its epoch, batch
# and step) and train only the rest: the epochs after the checkpoint in its
# metrics file, or its first progress line at the batch after it.
set -euo pipefail
: "${DP_TRAIN:?path to dp-train}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

for p in bf16-mixed 16-mixed; do
  args=(--model lenet --epochs 3 --devices cpu:2 --precision "$p" --progress off)
  "$DP_TRAIN" "${args[@]}" --save-dir "$work/$p-whole" --metrics "$work/$p.jsonl" | tee "$work/$p.txt"
  from="$work/$p-whole/epoch-0002.safetensors"
  "$DP_TRAIN" "${args[@]}" --resume "$from" --save-dir "$work/$p-part" --metrics "$work/$p-resumed.jsonl" |
    tee "$work/$p-resumed.txt"
  # 60000 samples in batches of 32: 1875 steps an epoch.
  grep -qxF "resumed from $from: 2 of 3 epochs done, 3750 steps" "$work/$p-resumed.txt" ||
    fail "$p: no line saying the run resumed from epoch-0002.safetensors after epoch 2, step 3750"
  python3 - "$work" "$p" <<'PY'
import json, sys
from safetensors import safe_open
from safetensors.numpy import load_file
work, p = sys.argv[1:]
rows = [json.loads(l) for l in open(f"{work}/{p}.jsonl")]
resumed = [json.loads(l) for l in open(f"{work}/{p}-resumed.jsonl")]
assert [m["epoch"] for m in resumed] == [3], f"{p}: the resumed run trained epochs {[m['epoch'] for m in resumed]}, not [3]"
assert resumed[0]["test_acc"] == rows[-1]["test_acc"], (resumed[0], rows[-1])
acc = rows[-1]["test_acc"]
print(f"lenet {p} cpu:2, 3 epochs: test accuracy {acc:.4f}")
assert acc >= 0.88, f"{p}: test accuracy {acc} below 0.88"
a = load_file(f"{work}/{p}-whole/epoch-0003.safetensors")
b = load_file(f"{work}/{p}-part/epoch-0003.safetensors")
assert sorted(a) == sorted(b)
for k in a:
    assert a[k].dtype == b[k].dtype and a[k].tobytes() == b[k].tobytes(), f"{p}: {k} differs after the resume"
    if a[k].dtype.kind == "f":
        assert str(a[k].dtype) == "float32", f"{k} is saved as {a[k].dtype}"
meta = [safe_open(f"{work}/{p}-{run}/epoch-0003.safetensors", "np").metadata() for run in ("whole", "part")]
assert json.loads(meta[0]["config"])["precision"] == p
if p == "16-mixed":
    s = [json.loads(m["grad_scaler"]) for m in meta]
    assert s[0] == s[1], f"the loss scaler differs after the resume: {s}"
    assert s[0]["scale"] > 65536, f"the scale should have grown past 2^16 by step 5625: {s[0]}"
    assert "loss_scale" in rows[-1] and rows[-1]["skipped_steps"] == s[0]["skipped"], rows[-1]
else:
    assert "grad_scaler" not in meta[0] and "loss_scale" not in rows[-1]
print(f"{p}: resumed from epoch 2 == uninterrupted, bit for bit ({len(a)} tensors)")
PY
done
grep -q "loss scale" "$work/16-mixed.txt"

# 16-mixed from a mid-epoch checkpoint (the scaler's state is mid-interval there).
# 480 samples in batches of 16: 30 batches an epoch; resumed after batch 20 (step 20), its first
# progress line (--progress lines) is at batch 21.
mid=(--model lenet --data synthetic:480 --batch-size 16 --epochs 2 --devices cpu --precision 16-mixed
     --optimizer adamw --lr 1e-3 --clip-grad-norm 1.0)
"$DP_TRAIN" "${mid[@]}" --progress off --save-dir "$work/mid-whole" --save-every-steps 10 --keep-last 20 > /dev/null
ckpt="$work/mid-whole/epoch-0000-batch-0000020.safetensors"
"$DP_TRAIN" "${mid[@]}" --progress lines --resume "$ckpt" --save-dir "$work/mid-resumed" > "$work/mid-resumed.txt" 2>&1 ||
  { cat "$work/mid-resumed.txt"; fail "the mid-epoch resume failed"; }
grep -qxF "resumed from $ckpt: 0 of 2 epochs done and 20 batches of the next, 20 steps" "$work/mid-resumed.txt" ||
  { cat "$work/mid-resumed.txt"; fail "no line saying the run resumed from $ckpt at batch 20, step 20"; }
first=$(grep -o -m1 "epoch 1/2 *[0-9]*% [0-9]*/30 batches" "$work/mid-resumed.txt") || true
[ "$(echo "$first" | sed 's|.*% *\([0-9]*\)/.*|\1|')" = 21 ] ||
  { cat "$work/mid-resumed.txt"; fail "the resumed run's first progress line is '${first:-none}', not at batch 21 of 30"; }
python3 - "$work" <<'PY'
import json, sys
from safetensors import safe_open
from safetensors.numpy import load_file
work = sys.argv[1]
a = load_file(f"{work}/mid-whole/epoch-0002.safetensors")
b = load_file(f"{work}/mid-resumed/epoch-0002.safetensors")
assert sorted(a) == sorted(b)
for k in a:
    assert a[k].tobytes() == b[k].tobytes(), f"{k} differs after the mid-epoch resume"
s = [json.loads(safe_open(f"{work}/{r}/epoch-0002.safetensors", "np").metadata()["grad_scaler"])
     for r in ("mid-whole", "mid-resumed")]
assert s[0] == s[1], s
with safe_open(f"{work}/mid-whole/epoch-0000-batch-0000020.safetensors", "np") as f:
    assert json.loads(f.metadata()["grad_scaler"])["growth_tracker"] > 0
print(f"16-mixed AdamW + clipping, resumed mid-epoch == uninterrupted, bit for bit; scaler {s[0]}")
PY
echo "precision e2e: ok"
