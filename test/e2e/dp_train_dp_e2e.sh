#!/usr/bin/env bash
# e2e: DataParallel on two CPU devices learns Fashion-MNIST like one device:
# the accuracy bar, and per-epoch metrics close to one device's. Summation
# order differs between the two (per-chunk sums, then the reduction), and
# over 1875 steps per epoch training amplifies that float noise, so the runs
# agree to run-to-run noise (0.01), not to 0.002; the differences are printed.
# DataParallel over one device (forced with --dp-comm cpu) does the plain
# engine's arithmetic, so its metrics equal the plain run's exactly.
set -euo pipefail
: "${DP_TRAIN:?path to dp-train}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for devs in cpu:1 cpu:2; do
  "$DP_TRAIN" --model lenet --data fashion-mnist --epochs 3 --devices "$devs" --seed 1 \
    --progress off --metrics "$work/$devs.jsonl"
done
"$DP_TRAIN" --model lenet --data fashion-mnist --epochs 3 --devices cpu:1 --dp-comm cpu --seed 1 \
  --progress off --metrics "$work/dp1.jsonl"
python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
one = [json.loads(l) for l in open(f"{work}/cpu:1.jsonl")]
two = [json.loads(l) for l in open(f"{work}/cpu:2.jsonl")]
dp1 = [json.loads(l) for l in open(f"{work}/dp1.jsonl")]
assert len(one) == len(two) == len(dp1) == 3
for a, b in zip(one, dp1):
    for k in ("train_loss", "train_acc", "test_loss", "test_acc"):
        assert a[k] == b[k], f"epoch {a['epoch']} {k}: plain {a[k]} != DataParallel on one device {b[k]}"
print("DataParallel on one device == plain engine: identical metrics")
for a, b in zip(one, two):
    for k in ("train_acc", "test_acc"):
        print(f"epoch {a['epoch']} {k}: cpu:1 {a[k]:.4f} cpu:2 {b[k]:.4f} diff {abs(a[k] - b[k]):.4f}")
        assert abs(a[k] - b[k]) <= 0.01, f"epoch {a['epoch']} {k}: cpu:1 {a[k]} vs cpu:2 {b[k]}"
    for k in ("train_loss", "test_loss"):
        rel = abs(a[k] - b[k]) / abs(a[k])
        print(f"epoch {a['epoch']} {k}: cpu:1 {a[k]:.4f} cpu:2 {b[k]:.4f} rel diff {rel:.2e}")
        assert rel <= 0.05, f"epoch {a['epoch']} {k}: cpu:1 {a[k]} vs cpu:2 {b[k]}"
final = two[-1]["test_acc"]
print(f"cpu:2 test accuracy {final:.4f} (cpu:1 {one[-1]['test_acc']:.4f}); "
      f"{two[-1]['images_per_second']:.0f} vs {one[-1]['images_per_second']:.0f} img/s")
assert final >= 0.885, f"cpu:2 test accuracy {final} below 0.885"
PY
