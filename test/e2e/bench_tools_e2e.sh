#!/usr/bin/env bash
# e2e: the benchmark tools' own checks, each short.
# - loader-bench: the checksum agrees between worker counts and changes with
#   the batches' contents (a flip); --seed -1 is one line; --normalize on
#   data without image files warns in one line.
# - dp-bench step mode: a batch DDP cannot split is refused before any timing;
#   SIGINT during the DDP row keeps the finished rows (table and --json), says
#   so in one line and exits 130.
# - dp-bench --epochs: --warmup not below an epoch's steps warns up front;
#   heatmaps show the share within 2 voxels as their test accuracy, and
#   PyTorch's rows (a Python that claims torch) are skipped, not run.
set -euo pipefail
: "${DP_BENCH:?path to dp-bench}" "${LOADER_BENCH:?path to loader-bench}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
fail() { echo "FAIL: $*"; exit 1; }

# loader-bench's checksum.
sum() { "$LOADER_BENCH" --data synthetic:64 --batch-size 16 "$@" | awk 'NR > 2 {print $4}' | sort -u; }
two=$(sum --workers-list 0,2 --augment crop:4,flip)
[ "$(echo "$two" | wc -l)" -eq 1 ] || fail "checksums differ between worker counts: $two"
none=$(sum --workers-list 0 --augment none)
flip=$(sum --workers-list 0 --augment flip)
[ "$none" != "$flip" ] || fail "the checksum does not see a flip ($none)"
echo "loader-bench checksum: equal over workers 0,2 ($two); none $none, flip $flip"
if "$LOADER_BENCH" --workers-list 0 --data synthetic:64 --seed -1 > out.txt 2> err.txt; then fail "--seed -1 accepted"; fi
[ "$(wc -l < err.txt)" -eq 1 ] && grep -q -- "--seed must be an integer" err.txt || { cat err.txt; fail "--seed -1"; }
"$LOADER_BENCH" --workers-list 0 --data synthetic:64 --normalize none > out.txt 2> err.txt
[ "$(wc -l < err.txt)" -eq 1 ] && grep -q -- "--normalize has no effect without image files" err.txt ||
  { cat err.txt; fail "--normalize on synthetic data: no warning"; }

# Step mode: the DDP batch split is checked before any timing.
if "$DP_BENCH" --model lenet --batch-size 255 --devices cpu:2 --steps 20 --json b.jsonl > out.txt 2> err.txt; then
  fail "batch 255 over 2 DDP processes accepted"
fi
[ "$(wc -l < err.txt)" -eq 1 ] && grep -q "cannot be split evenly over 2 DDP processes" err.txt || { cat err.txt; fail "split"; }
! grep -q "^configuration" out.txt && [ ! -s b.jsonl ] || fail "timed before refusing the batch"

# Step mode, SIGINT during the DDP row (the DP rows are done): rows kept, one line, 130.
env --default-signal=INT "$DP_BENCH" --model lenet --batch-size 64 --steps 400 --repeats 1 --warmup 1 \
  --json int.jsonl > int.log 2>&1 &
pid=$!
for _ in $(seq 1 2400); do pgrep -P "$pid" > /dev/null && break; sleep 0.05; done
sleep 1
kill -INT "$pid"
rc=0
wait "$pid" || rc=$?
[ "$rc" -eq 130 ] || { cat int.log; fail "step mode SIGINT: exit status $rc, expected 130"; }
[ "$(grep -c -i "interrupt\|stopped by" int.log)" -eq 1 ] || { cat int.log; fail "step mode SIGINT: not one line"; }
! grep -q "error" int.log || { cat int.log; fail "step mode SIGINT: called an error"; }
grep -q "^plain cpu" int.log && [ "$(wc -l < int.jsonl)" -ge 2 ] || { cat int.log; fail "step mode SIGINT: rows lost"; }
! grep -q '"config":"ddp' int.jsonl || fail "step mode SIGINT: a DDP row from an interrupted run"
echo "step mode SIGINT: exit 130, $(wc -l < int.jsonl) finished rows kept"

# Epoch mode: --warmup 5 over 4 steps an epoch warns before the first run.
"$DP_BENCH" --epochs 1 --model mlp --data synthetic:64 --batch-size 16 --warmup 5 --repeats 1 --no-pytorch --no-ddp \
  --devices cpu > warm.out 2> warm.err || { cat warm.out warm.err; fail "--warmup 5"; }
grep -q -- "--warmup 5 is not below an epoch's 4 batches" warm.err || { cat warm.err; fail "no --warmup warning"; }

# Heatmaps: "test acc" is test_within_2; PyTorch's rows are skipped (a fake Python that claims torch).
printf '#!/bin/sh\n[ "$2" = --version ] && { echo 9.9-fake; exit 0; }\necho ran >> %s/ran; exit 1\n' "$work" > python
chmod +x python
"$DP_BENCH" --epochs 1 --model heatmap3d --data synthetic3d:16 --batch-size 4 --repeats 1 --no-ddp --devices cpu \
  --python "$work/python" --json h.jsonl > h.out 2> h.err || { cat h.out h.err; fail "heatmap3d"; }
[ ! -e ran ] || fail "PyTorch's script ran on keypoint data"
grep -q "PyTorch one device cpu *skipped: PyTorch's script trains class labels" h.out || { cat h.out; fail "no skip"; }
grep -q "heatmaps: test acc is the share of landmarks within 2 voxels" h.out || { cat h.out; fail "no heatmap note"; }
python3 - h.jsonl <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
fanout = [r for r in rows if r["framework"] == "fanout"]
assert fanout and all(r["status"] == "ok" and r["test_acc"] == r["test_within_2"] and r["test_loc_error"] >= 0
                      for r in fanout), fanout
assert all(r["status"].startswith("skipped:") for r in rows if r["framework"] == "pytorch"), rows
print("heatmaps: test_acc = test_within_2", [r["test_within_2"] for r in fanout])
PY
echo "bench tools e2e: ok"
