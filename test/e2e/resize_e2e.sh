#!/usr/bin/env bash
# e2e: a run stopped mid-epoch resumes on another number of processes or
# devices. With split-invariant math, DDP over 2 processes resumed on 3, and
# DataParallel over cpu:3 resumed on one device, give the uninterrupted
# one-device run's parameters and metrics bit for bit (the position is kept in
# global batches, the same samples whatever the split; the sampler test
# AnEpochResumedOnAnotherWorldSizeSeesEverySampleOnce covers the sample set).
# Another global batch size mid-epoch is refused in one line, or with
# --allow-batch-change re-batches the rest of the epoch.
set -euo pipefail
: "${DP_TRAIN:?path to dp-train}"
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$work"

a=(--model lenet --data fashion-mnist --epochs 1 --batch-size 48 --split-invariant --workers 0 --seed 3)
timeout 300 "$DP_TRAIN" "${a[@]}" --progress off --devices cpu --save-dir whole --metrics whole.jsonl > whole.log 2>&1 ||
  { cat whole.log; fail "the uninterrupted run failed"; }

# resized NAME 'FIRST ARGS' 'RESUME ARGS': SIGTERM once batch 300 is saved, then --resume with other devices.
# The resumed run must say it continues from the checkpoint the stop saved, at
# its batch and step, and train from the next batch on (its first progress
# line, --progress lines, is at that batch): a run that ignored --resume would
# end with the same bits, so the bits alone do not show the resume.
resized() {
  local name=$1 first=$2 then=$3
  # shellcheck disable=SC2086
  "$DP_TRAIN" "${a[@]}" --progress off $first --save-dir "$name" --metrics "$name.jsonl" --save-every-steps 150 \
    --keep-last 5 > "$name.log" 2>&1 &
  local pid=$!
  pids+=("$pid")
  wait_for 120 test -e "$name/epoch-0000-batch-0000300.safetensors" || true
  kill -TERM "$pid"
  await "$pid" 300
  [ "$rc" -eq 143 ] || { cat "$name.log"; fail "$name: exit status $rc after SIGTERM, expected 143"; }
  local stop n saved
  expect_stop "$name.log" TERM 1 "$name"
  # shellcheck disable=SC2086
  timeout 300 "$DP_TRAIN" "${a[@]}" --progress lines $then --resume "$name" --metrics "$name.jsonl" \
    > "$name.resume.log" 2>&1 || { cat "$name.resume.log"; fail "$name: the resumed run failed"; }
  grep -qxF "resumed from $saved: 0 of 1 epochs done and $n batches of the next, $n steps" "$name.resume.log" ||
    { cat "$name.resume.log"; fail "$name: no line saying the run resumed from $saved at batch $n, step $n"; }
  local from
  from=$(grep -o -m1 "epoch 1/1 *[0-9]*% [0-9]*/[0-9]* batches" "$name.resume.log" | sed 's|.*% *\([0-9]*\)/.*|\1|') ||
    true
  [ "$from" = $((n + 1)) ] ||
    { cat "$name.resume.log"; fail "$name: the resumed run's first progress line is at batch ${from:-(none)}, not $((n + 1))"; }
  echo "$name: stopped after batch $n, resumed from $saved, trained from batch $((n + 1))"
  python3 - "$name" <<'PY' || fail "$name: the resumed run differs from the uninterrupted one"
import json, sys
from safetensors.numpy import load_file
d = sys.argv[1]
a, b = load_file("whole/epoch-0001.safetensors"), load_file(f"{d}/epoch-0001.safetensors")
assert a.keys() == b.keys(), "different tensors"
for k in a:
    assert a[k].tobytes() == b[k].tobytes(), f"{k} differs"
w = [json.loads(l) for l in open("whole.jsonl")]
c = [json.loads(l) for l in open(f"{d}.jsonl")]
assert [m["epoch"] for m in c] == [1], c
for k in ("train_loss", "train_acc", "test_loss", "test_acc"):
    assert w[0][k] == c[0][k], f"{k}: {w[0][k]} != {c[0][k]}"
print(f"{d}: {len(a)} tensors bit-identical to the uninterrupted run, metrics equal")
PY
}
resized ddp2to3 "--devices cpu:2 --strategy ddp" "--devices cpu:3 --strategy ddp"
resized dp3to1 "--devices cpu:3" "--devices cpu"

# Another global batch size mid-epoch: one line, nothing trained, unless
# --allow-batch-change; then the rest of the epoch is re-batched (the trainer
# test MidEpochResumeWithAnotherBatchSizeReBatchesTheRest checks the samples).
mid=$(ls dp3to1/epoch-0000-batch-*.safetensors | head -1) || true
[ -n "$mid" ] || fail "no mid-epoch checkpoint left in dp3to1"
out=$("$DP_TRAIN" "${a[@]/48/64}" --progress off --devices cpu:2 --resume "$mid" 2>&1) &&
  fail "a mid-epoch resume with another batch size ran"
echo "$out" | grep -q "error: checkpoint .* stopped inside epoch 1 after [0-9]* batches of 48; resume with --batch-size 48 (any devices or processes), or add --allow-batch-change to re-batch the rest of that epoch in 64" ||
  fail "got: $out"
cp "$mid" rebatch.safetensors
nb=${mid##*-batch-}
nb=$((10#${nb%.safetensors}))
done=$((nb * 48))
timeout 300 "$DP_TRAIN" "${a[@]/48/64}" --progress off --devices cpu:2 --resume rebatch.safetensors --allow-batch-change \
  --save-dir rebatch --metrics rebatch.jsonl > rebatch.log 2>&1 || { cat rebatch.log; fail "the re-batched resume failed"; }
grep -q "the rest of epoch 1 is re-batched: batches of 64 from sample $done, where batches of 48 stopped" rebatch.log ||
  { cat rebatch.log; fail "no re-batch line"; }
python3 - <<'PY' || fail "the re-batched run's metrics"
import json
m = [json.loads(l) for l in open("rebatch.jsonl")]
assert [x["epoch"] for x in m] == [1], m
assert 0.5 < m[0]["train_acc"] < 1 and 0.5 < m[0]["test_acc"] < 1, m[0]
PY
# Samples done that the processes cannot share evenly: one line before training.
w=5
while [ $((done % w)) -eq 0 ]; do w=$((w + 1)); done
out=$(timeout 120 "$DP_TRAIN" "${a[@]/48/$((8 * w))}" --progress off --devices "cpu:$w" --strategy ddp --resume "$mid" \
  --allow-batch-change 2>&1) && fail "a re-batch over $w processes ran"
echo "$out" | grep -q "stopped inside epoch 1 after $done samples, which $w processes cannot share evenly" ||
  fail "got: $out"
echo "resize: OK"
