#!/usr/bin/env bash
# e2e: 3-D landmark heatmaps.
# - dp-train --model heatmap3d --data synthetic3d --devices cpu:2 (its recipe)
#   reaches a test localization error below 2 voxels; the number is printed.
# - The loss on the replicas and the gathered path (--gather-outputs) give
#   the same metrics (1e-5); DDP over two processes trains and writes the
#   heatmap metrics.
# - keypoints3d:DIR: .npy volumes and a landmarks.csv written with NumPy train.
# - A classifier on keypoint data, heatmap3d on labels, a bad radius: one line each.
set -euo pipefail
: "${DP_TRAIN:?path to dp-train}"
source "$(dirname "$0")/lib.sh"

"$DP_TRAIN" --model heatmap3d --data synthetic3d --devices cpu:2 --progress off --metrics "$work/full.jsonl" \
  > "$work/full.log"
cat "$work/full.log"
small=(--model heatmap3d --data synthetic3d:48 --epochs 2 --progress off)
"$DP_TRAIN" "${small[@]}" --devices cpu:2 --metrics "$work/local.jsonl" > /dev/null
"$DP_TRAIN" "${small[@]}" --devices cpu:2 --gather-outputs --metrics "$work/gathered.jsonl" > /dev/null
"$DP_TRAIN" "${small[@]}" --devices cpu:2 --strategy ddp --metrics "$work/ddp.jsonl" > /dev/null

python3 - "$work" <<'PY'
import json, os, sys
import numpy as np
work = sys.argv[1]
def load(name):
    return [json.loads(l) for l in open(f"{work}/{name}.jsonl")]
full = load("full")
last = full[-1]
print(f"heatmap3d synthetic3d cpu:2: test localization error {last['test_loc_error']:.3f} voxels, "
      f"{100 * last['test_within_2']:.1f}% within 2, {sum(r['epoch_seconds'] for r in full):.0f} s")
assert len(full) == 5, len(full)
assert last["test_loc_error"] < 2, last
for name in ("local", "gathered", "ddp"):
    rows = load(name)
    assert len(rows) == 2 and all(k in rows[-1] for k in ("train_loc_error", "test_loc_error", "test_within_2")), name
for a, b in zip(load("local"), load("gathered")):
    for k in ("train_loss", "test_loss", "train_loc_error", "test_loc_error", "test_within_2"):
        assert abs(a[k] - b[k]) <= 1e-5 * max(1e-3, abs(b[k])), (k, a[k], b[k])

# A keypoints3d directory: 20 + 6 volumes (2, 16, 16, 16) of float64, two landmarks each.
rng = np.random.default_rng(3)
for split, n in (("train", 20), ("test", 6)):
    d = f"{work}/kp/{split}"
    os.makedirs(d)
    rows = ["name,landmark,z,y,x"]
    for i in range(n):
        vol = rng.normal(0, 1, (2, 16, 16, 16))
        for k in range(2):
            c = rng.uniform(3, 12, 3)
            z, y, x = np.ogrid[:16, :16, :16]
            vol[k] += 8 * np.exp(-((z - c[0]) ** 2 + (y - c[1]) ** 2 + (x - c[2]) ** 2) / 4)
            rows.append(f"v{i:03d},{k},{c[0]},{c[1]},{c[2]}")
        np.save(f"{d}/v{i:03d}.npy", vol)
    open(f"{d}/landmarks.csv", "w").write("\n".join(rows) + "\n")
PY

"$DP_TRAIN" --model heatmap3d --data "keypoints3d:$work/kp" --devices cpu:2 --epochs 1 --progress off \
  --metrics "$work/kp.jsonl" > "$work/kp.log"
grep -q "data keypoints3d:$work/kp (20 train / 6 test, (2, 16, 16, 16))" "$work/kp.log" || fail "keypoints3d header: $(cat "$work/kp.log")"
grep -q '"test_loc_error"' "$work/kp.jsonl" || fail "keypoints3d metrics"
! grep -q "warning" "$work/kp.log" || fail "a warning for landmarks inside their volumes"
# Two landmarks of one training volume moved outside it: the run goes on, with one warning line.
sed -i 's/^v003,0,.*/v003,0,-2.5,4,4/; s/^v007,1,.*/v007,1,4,4,16.5/' "$work/kp/train/landmarks.csv"
"$DP_TRAIN" --model heatmap3d --data "keypoints3d:$work/kp" --devices cpu --epochs 1 --progress off \
  > "$work/kpo.log" 2> "$work/kpo.err" || fail "landmarks outside the volume: $(cat "$work/kpo.err")"
[ "$(wc -l < "$work/kpo.err")" -eq 1 ] || fail "not one warning line: $(cat "$work/kpo.err")"
grep -q "dp-train: warning: keypoints3d: $work/kp/train/landmarks.csv: 2 landmarks of 2 volumes lie outside the volume (first: $work/kp/train/v003.npy)" \
  "$work/kpo.err" || fail "warning text: $(cat "$work/kpo.err")"
echo "ok: $(cat "$work/kpo.err")"

one_line_error() {
  local want=$1
  shift
  if "$DP_TRAIN" "$@" --progress off > "$work/out" 2> "$work/err"; then fail "$* succeeded"; fi
  [ "$(wc -l < "$work/err")" -eq 1 ] || fail "$*: not one line: $(cat "$work/err")"
  grep -q -- "$want" "$work/err" || fail "$*: '$want' not in: $(cat "$work/err")"
}
one_line_error "is a classifier but data synthetic3d:16 has landmarks" --model lenet --data synthetic3d:16 --devices cpu
one_line_error "draws heatmaps but data synthetic:64 has class labels" --model heatmap3d --data synthetic:64 --devices cpu
one_line_error "heatmap-radius must be in 0..64" --model heatmap3d --data synthetic3d:16 --heatmap-radius 99
one_line_error "keypoints3d needs a directory" --model heatmap3d --data keypoints3d
one_line_error "augmentation is for image classification" --model heatmap3d --data synthetic3d:16 --augment flip --devices cpu
# heatmap3d:group (GroupNorm: statistics per sample, no batch statistics) under
# split-invariant math: one device, cpu:2 and cpu:3 end with the same tensors, bit for bit.
for d in cpu cpu:2 cpu:3; do
  "$DP_TRAIN" --model heatmap3d:group --data synthetic3d:32 --epochs 2 --batch-size 8 --devices "$d" --split-invariant \
    --progress off --save-dir "$work/gn-$d" > "$work/gn-$d.log" || fail "heatmap3d:group on $d: $(cat "$work/gn-$d.log")"
done
python3 - "$work" <<'PY'
import sys
from safetensors.numpy import load_file
work = sys.argv[1]
a = load_file(f"{work}/gn-cpu/epoch-0002.safetensors")
assert any(k.startswith("gn1.") for k in a) and not any(k.startswith("bn") for k in a), sorted(a)[:8]
for d in ("cpu:2", "cpu:3"):
    b = load_file(f"{work}/gn-{d}/epoch-0002.safetensors")
    assert all(a[k].tobytes() == b[k].tobytes() for k in a), f"heatmap3d:group split-invariant on {d} differs"
print(f"heatmap3d:group split-invariant: cpu, cpu:2, cpu:3 bit-identical ({len(a)} tensors)")
PY

# Progress lines show the running localization error, as the epoch's summary does (they showed "acc 0.0000").
"$DP_TRAIN" --model heatmap3d --data synthetic3d:32 --epochs 1 --batch-size 8 --devices cpu --progress lines \
  > "$work/progress.out" 2> "$work/progress.err"
grep -qE "^epoch 1/1 +[0-9]+% .* loss [0-9.]+  loc err [0-9.]+$" "$work/progress.err" || { cat "$work/progress.err"; exit 1; }
! grep -q " acc " "$work/progress.err" || { cat "$work/progress.err"; echo "heatmap progress shows an accuracy"; exit 1; }
echo "ok: heatmap progress: $(grep -m1 'loc err' "$work/progress.err")"
echo "heatmap e2e: ok"
