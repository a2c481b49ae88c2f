#!/usr/bin/env bash
# e2e: DataParallel and DDP on CPU devices learn Fashion-MNIST like one device.
# - DataParallel over one device (forced with --dp-comm cpu) does the plain
#   engine's arithmetic: identical metrics.
# - With --split-invariant, cpu:2's metrics equal cpu:1's every epoch, exactly
#   (the parameters are bit-identical, as the README says), and it reaches
#   0.885.
# - Without it, float sums run in another order (per-chunk sums, then the
#   reduction) and 1875 steps per epoch amplify that, so the default cpu:2
#   agrees with cpu:1 to run-to-run noise: accuracy 0.01, losses 8% (seeds 1,
#   2 and 3 of this run on one device spread the first epoch's test loss over
#   0.363-0.383, 5.3%, and DDP's 0.401 against seed 1's 0.381 was seen,
#   2026-11-26); the differences are printed.
# - DDP over 2 processes (--strategy ddp) reaches 0.885; with
#   --split-invariant its metrics equal one device's every epoch, exactly.
set -euo pipefail
: "${DP_TRAIN:?path to dp-train}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
run() {
  local name=$1
  shift
  "$DP_TRAIN" --model lenet --data fashion-mnist --epochs 3 --seed 1 --progress off --metrics "$work/$name.jsonl" "$@"
}
run one --devices cpu:1
run two --devices cpu:2
run dp1 --devices cpu:1 --dp-comm cpu
run si1 --devices cpu:1 --split-invariant
run si2 --devices cpu:2 --split-invariant
run ddp2 --devices cpu:2 --strategy ddp
run ddpsi2 --devices cpu:2 --strategy ddp --split-invariant
python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
def load(name):
    rows = [json.loads(l) for l in open(f"{work}/{name}.jsonl")]
    assert len(rows) == 3, f"{name}: {len(rows)} epochs"
    return rows
one, two, dp1, si1, si2, ddp2, ddpsi2 = (load(n) for n in ("one", "two", "dp1", "si1", "si2", "ddp2", "ddpsi2"))

def compare(label, a_rows, b_rows, acc_tol, loss_tol):
    for a, b in zip(a_rows, b_rows):
        for k in ("train_acc", "test_acc"):
            d = abs(a[k] - b[k])
            print(f"{label} epoch {a['epoch']} {k}: {a[k]:.4f} vs {b[k]:.4f} diff {d:.4f}")
            assert d <= acc_tol, f"{label} epoch {a['epoch']} {k}: {a[k]} vs {b[k]}"
        for k in ("train_loss", "test_loss"):
            rel = abs(a[k] - b[k]) / abs(a[k])
            print(f"{label} epoch {a['epoch']} {k}: {a[k]:.4f} vs {b[k]:.4f} rel diff {rel:.2e}")
            assert rel <= loss_tol, f"{label} epoch {a['epoch']} {k}: {a[k]} vs {b[k]}"

compare("plain vs DataParallel cpu:1", one, dp1, 0.0, 0.0)
compare("split-invariant cpu:1 vs cpu:2", si1, si2, 0.0, 0.0)
same = all(a[k] == b[k] for a, b in zip(si1, si2) for k in ("train_loss", "train_acc", "test_loss", "test_acc"))
assert same, "split-invariant cpu:1 and cpu:2 metrics differ"
print("split-invariant cpu:1 and cpu:2 metrics identical")
compare("default cpu:1 vs cpu:2", one, two, 0.01, 0.08)
compare("split-invariant one device vs DDP over 2 processes", si1, ddpsi2, 0.0, 0.0)
compare("default one device vs DDP over 2 processes", one, ddp2, 0.01, 0.08)
for name, rows in (("cpu:2", two), ("split-invariant cpu:2", si2), ("DDP cpu:2", ddp2)):
    final = rows[-1]["test_acc"]
    print(f"{name} test accuracy {final:.4f}, {rows[-1]['images_per_second']:.0f} img/s")
    assert final >= 0.885, f"{name} test accuracy {final} below 0.885"
PY
