#!/usr/bin/env bash
# e2e: DataParallel on two CPU devices learns Fashion-MNIST like one device:
# accuracy bar, and per-epoch metrics within 0.002 accuracy and 1e-3 relative loss.
set -euo pipefail
: "${DP_TRAIN:?path to dp-train}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for devs in cpu:1 cpu:2; do
  "$DP_TRAIN" --model lenet --data fashion-mnist --epochs 3 --devices "$devs" --seed 1 \
    --progress off --metrics "$work/$devs.jsonl"
done
python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
one = [json.loads(l) for l in open(f"{work}/cpu:1.jsonl")]
two = [json.loads(l) for l in open(f"{work}/cpu:2.jsonl")]
assert len(one) == len(two) == 3
for a, b in zip(one, two):
    for k in ("train_acc", "test_acc"):
        assert abs(a[k] - b[k]) <= 0.002, f"epoch {a['epoch']} {k}: cpu:1 {a[k]} vs cpu:2 {b[k]}"
    for k in ("train_loss", "test_loss"):
        assert abs(a[k] - b[k]) <= 1e-3 * abs(a[k]), f"epoch {a['epoch']} {k}: cpu:1 {a[k]} vs cpu:2 {b[k]}"
final = two[-1]["test_acc"]
print(f"cpu:2 test accuracy {final:.4f} (cpu:1 {one[-1]['test_acc']:.4f}); "
      f"{two[-1]['images_per_second']:.0f} vs {one[-1]['images_per_second']:.0f} img/s")
assert final >= 0.885, f"cpu:2 test accuracy {final} below 0.885"
PY
