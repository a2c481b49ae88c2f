#!/usr/bin/env bash
# e2e: dp-train learns real Fashion-MNIST on one CPU device; a second run with
# the same seed writes the same metrics (timings aside), its training steps
# run as CUDA graphs would capture and replay them (--cuda-graphs check).
set -euo pipefail
: "${DP_TRAIN:?path to dp-train}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

if [ ! -e /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  echo "dataset-fashion-mnist is not installed (apt-get install dataset-fashion-mnist)" >&2
  exit 1
fi

for run in 1 2; do
  graphs=off
  [ $run = 2 ] && graphs=check
  "$DP_TRAIN" --model lenet --data fashion-mnist --epochs 3 --devices cpu --seed 1 --cuda-graphs $graphs \
    --progress lines --metrics "$work/run$run.jsonl" | tee "$work/out$run.txt"
done

python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
runs = [[json.loads(l) for l in open(f"{work}/run{i}.jsonl")] for i in (1, 2)]
keys = {"epoch", "train_loss", "train_acc", "test_loss", "test_acc", "epoch_seconds", "images_per_second"}
for r in runs:
    assert len(r) == 3, f"expected 3 epochs, got {len(r)}"
    for m in r:
        missing = keys - m.keys()
        assert not missing, f"metrics lack {missing}"
        assert 0 <= m["train_acc"] <= 1 and 0 <= m["test_acc"] <= 1
final = runs[0][-1]["test_acc"]
print(f"lenet 3 epochs on cpu: test accuracy {final:.4f}, {runs[0][-1]['images_per_second']:.0f} img/s")
assert final >= 0.885, f"test accuracy {final} below 0.885"
for a, b in zip(*runs):
    for k in ("train_loss", "train_acc", "test_loss", "test_acc"):
        assert a[k] == b[k], f"epoch {a['epoch']} {k}: {a[k]} != {b[k]} between two runs with the same seed"
print("same seed, same metrics: ok")
PY
grep -q "final test accuracy" "$work/out1.txt"
# Each epoch's 1875 batches of 32: a plain warm-up step, a capture, 1873
# replays; the evaluation after it drops the graph.
grep -q "^CUDA graphs: 3 captured, 5619 steps replayed, 3 plain$" "$work/out2.txt"
