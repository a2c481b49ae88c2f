#!/usr/bin/env bash
# e2e: checkpoints through dp-train on real Fashion-MNIST.
#  - 4 epochs straight equal 2 epochs (--stop-after 2), then --resume for the
#    other 2: the same metrics per epoch (timings aside), with 2 loader workers
#    on one side and none on the other (batches must not depend on workers);
#    a metrics line the interrupted run wrote after its checkpoint is replaced.
#  - the save directory keeps the newest --keep-last files and best.safetensors;
#    the Python safetensors package reads them with torchvision names.
#  - --init-from strict and --non-strict; bad checkpoints end with one line.
set -euo pipefail
: "${DP_TRAIN:?path to dp-train}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

common=(--model lenet --data fashion-mnist --epochs 4 --batch-size 64 --devices cpu --seed 3 --progress off)
"$DP_TRAIN" "${common[@]}" --workers 0 --metrics "$work/whole.jsonl"
"$DP_TRAIN" "${common[@]}" --workers 2 --stop-after 2 --save-dir "$work/ck" --metrics "$work/split.jsonl" \
  | tee "$work/first.txt"
grep -q "stopped after epoch 2 of 4" "$work/first.txt"
# As if the run had crashed after logging epoch 3 but before saving it.
echo '{"epoch": 3, "train_loss": 9.0, "test_acc": 0.1}' >> "$work/split.jsonl"
"$DP_TRAIN" "${common[@]}" --workers 2 --resume "$work/ck" --metrics "$work/split.jsonl" | tee "$work/second.txt"
grep -q "resumed from $work/ck/epoch-0002.safetensors: 2 of 4 epochs done, 1876 steps" "$work/second.txt"
grep -q "removed 1 line from $work/split.jsonl (after epoch 2" "$work/second.txt"

python3 - "$work" <<'PY'
import json, os, sys
work = sys.argv[1]
whole = [json.loads(l) for l in open(f"{work}/whole.jsonl")]
split = [json.loads(l) for l in open(f"{work}/split.jsonl")]
assert [m["epoch"] for m in whole] == [1, 2, 3, 4], whole
assert [m["epoch"] for m in split] == [1, 2, 3, 4], split
for a, b in zip(whole, split):
    for k in ("train_loss", "train_acc", "test_loss", "test_acc", "lr"):
        assert a[k] == b[k], f"epoch {a['epoch']} {k}: whole run {a[k]} != resumed run {b[k]}"
    assert 0 <= b["data_wait_fraction"] <= 1
print(f"4 epochs == 2 + resume 2: same metrics; final test accuracy {whole[-1]['test_acc']:.4f}")
files = sorted(os.listdir(f"{work}/ck"))
assert files == [".fanout.lock", "best.safetensors", "epoch-0003.safetensors", "epoch-0004.safetensors"], files

from safetensors.numpy import load_file
from safetensors import safe_open
t = load_file(f"{work}/ck/epoch-0004.safetensors")
assert t["conv1.weight"].shape == (6, 1, 5, 5) and t["fc3.bias"].shape == (10,), {k: v.shape for k, v in t.items()}
assert t["optimizer.momentum_buffer.conv1.weight"].shape == (6, 1, 5, 5)
with safe_open(f"{work}/ck/epoch-0004.safetensors", "np") as f:
    md = f.metadata()
assert md["format"] == "fanout-checkpoint-1" and md["epoch"] == "4" and md["step"] == "3752", md
assert json.loads(md["config"])["model"] == "lenet"
print("checkpoint files: ok")
PY

# Nothing left to do when the run is complete.
"$DP_TRAIN" "${common[@]}" --resume "$work/ck" | grep -q "nothing left to train"

# --init-from: strict across architectures fails; --non-strict lists the rest.
"$DP_TRAIN" --model lenet --epochs 1 --devices cpu --progress off --init-from "$work/ck/best.safetensors" \
  --data synthetic:64 >"$work/init.txt" 2>&1 && { echo "strict init-from of a 1-channel model into a 3-channel one should fail"; exit 1; }
cat "$work/init.txt"
[ "$(wc -l <"$work/init.txt")" -le 2 ]
grep -q "error: .*best.safetensors.*mismatched.*conv1.weight" "$work/init.txt"
"$DP_TRAIN" --model lenet --epochs 1 --devices cpu --progress off --init-from "$work/ck/best.safetensors" \
  --non-strict --data synthetic:64 | tee "$work/init2.txt"
grep -q "initialized from .*best.safetensors: 1 mismatched (conv1.weight" "$work/init2.txt"

expect_error() {  # expect_error PATTERN ARGS...: exit 1 with one line on stderr matching PATTERN
  local pattern=$1; shift
  local rc=0
  "$DP_TRAIN" "$@" >"$work/out.txt" 2>"$work/err.txt" || rc=$?
  if [ "$rc" != 1 ] || [ "$(wc -l <"$work/err.txt")" != 1 ] || ! grep -q -- "$pattern" "$work/err.txt"; then
    echo "dp-train $* : exit $rc, stderr:"; cat "$work/err.txt"; exit 1
  fi
  echo "ok: $(cat "$work/err.txt")"
}
head -c 1000 "$work/ck/epoch-0004.safetensors" >"$work/truncated.safetensors"
expect_error "truncated.safetensors" "${common[@]}" --resume "$work/truncated.safetensors"
expect_error "does not exist" "${common[@]}" --resume "$work/nope"
expect_error "no epoch-NNNN.safetensors" "${common[@]}" --resume "$work"
expect_error "was trained with --model lenet, not cnn" --model cnn --epochs 4 --devices cpu --resume "$work/ck"
expect_error "exclude each other" "${common[@]}" --resume "$work/ck" --init-from "$work/ck/best.safetensors"
expect_error "cannot create checkpoint directory" "${common[@]}" --save-dir "$work/truncated.safetensors"
expect_error "without --save-dir" "${common[@]}" --stop-after 2
expect_error "bad augmentation" "${common[@]}" --augment rotate
expect_error "--workers must be non-negative" "${common[@]}" --workers -1
echo "checkpoint e2e: ok"
