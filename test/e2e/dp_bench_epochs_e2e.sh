#!/usr/bin/env bash
# e2e: dp-bench --epochs on a tiny synthetic set with every fanout
# configuration (one device, DP over cpu:4, DDP 4 processes, hybrid 2 x 2).
# - The JSON lines carry every field the table shows, for every row.
# - With --split-invariant, DP, DDP and hybrid reach one device's test loss
#   and accuracy exactly; without it, within 1e-4 relative loss and one test
#   sample of accuracy.
# - A GPT on a text file: the same rows, throughput in tokens per second;
#   with --split-invariant every engine at one device's test loss exactly.
# - PyTorch's rows: run where PyTorch imports, "not installed" where not
#   (a Python without it).
# - --plot writes a PNG; bad input is one line and a non-zero exit.
set -euo pipefail
: "${DP_BENCH:?path to dp-bench}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"

bench() {  # name args...  ($devices, default cpu:4; $repeats, default 2; $data, default synthetic:512; $batch, 64)
  local name=$1
  shift
  "$DP_BENCH" --epochs 1 --data "${data:-synthetic:512}" --batch-size "${batch:-64}" --repeats "${repeats:-2}" --warmup 2 --devices "${devices:-cpu:4}" \
    --json "$work/$name.jsonl" "$@" > "$work/$name.out" 2>&1 ||
    { echo "dp-bench $name failed:"; cat "$work/$name.out"; exit 1; }
  cat "$work/$name.out"
}

bench si --model mlp --split-invariant --python /nonexistent/python3
bench plain --model lenet --lr 0.05 --python /nonexistent/python3
grep -q "fanout DP / fanout DDP epoch time" si.out
grep -q "each run is a fresh process; the first 2 steps of each epoch are warm-up" si.out

python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
fields = ["epoch_seconds", "epoch_seconds_min", "epoch_seconds_max", "images_per_second", "speedup_vs_one_device",
          "efficiency_per_device", "data_wait_fraction", "test_acc", "test_loss", "peak_host_bytes", "peak_device_bytes"]
test_rows = 512 // 5
for name, exact in (("si", True), ("plain", False)):
    rows = [json.loads(l) for l in open(f"{work}/{name}.jsonl")]
    fanout = {r["mode"]: r for r in rows if r["framework"] == "fanout"}
    assert set(fanout) == {"one device", "DP", "DDP", "hybrid"}, sorted(fanout)
    for r in fanout.values():
        assert r["status"] == "ok", r
        for f in fields:
            assert f in r, (f, r)
        assert len(r["runs_epoch_seconds"]) == 2, r
        assert r["epoch_seconds_min"] <= r["epoch_seconds"] <= r["epoch_seconds_max"], r
        assert r["epoch_seconds"] > 0 and r["images_per_second"] > 0 and r["peak_host_bytes"] > 0, r
        assert 0 <= r["data_wait_fraction"] <= 1, r
        assert abs(r["efficiency_per_device"] * r["processes"] * r["replicas_per_process"]
                   - r["speedup_vs_one_device"]) < 1e-9, r
    assert fanout["DDP"]["processes"] == 4 and fanout["hybrid"]["processes"] == 2
    assert fanout["hybrid"]["replicas_per_process"] == 2 and fanout["DP"]["replicas_per_process"] == 4
    assert fanout["one device"]["speedup_vs_one_device"] == 1.0
    one = fanout["one device"]
    assert one["test_acc"] > 0.2, one  # 10 classes: it learned something in one epoch
    for mode in ("DP", "DDP", "hybrid"):
        r = fanout[mode]
        if exact:
            assert r["test_loss"] == one["test_loss"] and r["test_acc"] == one["test_acc"], (mode, r, one)
        else:
            assert abs(r["test_loss"] - one["test_loss"]) <= 1e-4 * abs(one["test_loss"]), (mode, r, one)
            assert abs(r["test_acc"] - one["test_acc"]) <= 1.0 / test_rows + 1e-12, (mode, r, one)
    torch = [r for r in rows if r["framework"] == "pytorch"]
    assert {r["mode"] for r in torch} == {"one device", "DDP"}, torch
    assert all(r["status"] == "not installed" and "epoch_seconds" not in r for r in torch), torch
    print(f"{name}: fanout rows agree ({'exactly' if exact else 'within tolerance'}); PyTorch rows: not installed")
PY
grep -q "PyTorch DDP 4 processes (gloo) *not installed" si.out

# A GPT on a text file: the same rows in tokens per second; with --split-invariant every engine
# reaches one device's test loss and token accuracy exactly; PyTorch's one-device row has no
# channels_last twin.
export FANOUT_CACHE_DIR="$work/cache"
python3 - "$work/corpus.txt" <<'PY'
import random, sys
rng = random.Random(3)
words = ["the cat", "a dog", "my friend", "sees", "likes", "finds", "the moon", "a red apple", "the road"]
text = "".join(" ".join(rng.choice(words) for _ in range(5)) + ".\n" for _ in range(500))
# 18,220 characters: 90% make 1,024 training windows of 17, whole batches of 32 for every split.
open(sys.argv[1], "w").write(text[:18220])
PY
data="text:$work/corpus.txt" batch=32 bench gpt --model gpt:gpt-char,n_layer=1,n_head=2,n_embd=32,block_size=16,dropout=0 \
  --optimizer adamw --lr 0.003 --split-invariant --python /nonexistent/python3
grep -q "^configuration .* tok/s " gpt.out
python3 - "$work" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(f"{sys.argv[1]}/gpt.jsonl")]
fanout = {r["mode"]: r for r in rows if r["framework"] == "fanout"}
assert set(fanout) == {"one device", "DP", "DDP", "hybrid"}, sorted(fanout)
one = fanout["one device"]
assert one["test_acc"] > 0.2, one  # tokens of a nine-phrase language: it learned something in one epoch
for mode, r in fanout.items():
    assert r["status"] == "ok", r
    assert abs(r["tokens_per_second"] - 16 * r["images_per_second"]) <= 1e-9 * r["tokens_per_second"], r
    assert r["test_loss"] == one["test_loss"] and r["test_acc"] == one["test_acc"], (mode, r, one)
torch = [r for r in rows if r["framework"] == "pytorch"]
assert [r["config"] for r in torch] == ["PyTorch one device cpu", "PyTorch DDP 4 processes (gloo)"], torch
print("gpt: fanout rows agree; tokens per second")
PY

# PyTorch's rows, where this machine has it.
if python3 -c "import torch" 2> /dev/null; then
  devices=cpu:2 repeats=1 bench torch --model mlp
  python3 - "$work" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(f"{sys.argv[1]}/torch.jsonl")]
torch = {r["mode"]: r for r in rows if r["framework"] == "pytorch"}
assert set(torch) == {"one device", "DDP"}, torch
for r in torch.values():
    assert r["status"] == "ok" and r["epoch_seconds"] > 0 and r["test_acc"] > 0.2 and r["torch"], r
assert torch["DDP"]["processes"] == 2
print("PyTorch rows ran:", {m: round(r["epoch_seconds"], 3) for m, r in torch.items()})
PY
  devices=cpu:2 repeats=1 data="text:$work/corpus.txt" batch=32 bench gpt-torch \
    --model gpt:gpt-char,n_layer=1,n_head=2,n_embd=32,block_size=16,dropout=0 --optimizer adamw --lr 0.003
  python3 - "$work" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(f"{sys.argv[1]}/gpt-torch.jsonl")]
torch = {r["mode"]: r for r in rows if r["framework"] == "pytorch"}
one = [r for r in rows if r["framework"] == "fanout" and r["mode"] == "one device"][0]
assert set(torch) == {"one device", "DDP"}, torch
for r in torch.values():  # nanoGPT's model on the same windows learns as fanout's does
    assert r["status"] == "ok" and r["tokens_per_second"] > 0 and r["test_acc"] > 0.2, r
    assert abs(r["test_loss"] - one["test_loss"]) < 0.25 * one["test_loss"], (r, one)
print("PyTorch GPT rows ran:", {m: round(r["epoch_seconds"], 3) for m, r in torch.items()})
PY
else
  echo "PyTorch not installed here: its rows were checked as 'not installed' only"
fi

# The plot, where matplotlib imports (setup.sh installs it).
if python3 -c "import matplotlib" 2> /dev/null; then
  devices=cpu:2 repeats=1 bench plot --model mlp --no-pytorch --plot "$work/epochs.png"
  head -c 8 epochs.png | od -An -tx1 | grep -q "89 50 4e 47 0d 0a 1a 0a" || { echo "epochs.png is not a PNG"; exit 1; }
  echo "plot written"
fi

# Bad input: one line on stderr, non-zero exit, before any run.
expect_error() {  # pattern args...
  local pattern=$1
  shift
  if "$DP_BENCH" "$@" > out.txt 2> err.txt; then
    echo "dp-bench $* succeeded; expected an error"
    exit 1
  fi
  [ "$(wc -l < err.txt)" -eq 1 ] || { echo "dp-bench $*: not one line:"; cat err.txt; exit 1; }
  grep -q -e "$pattern" err.txt || { echo "dp-bench $*: expected '$pattern', got:"; cat err.txt; exit 1; }
  ! grep -q "^\[1/" out.txt || { echo "dp-bench $*: runs started before the error"; exit 1; }
}
expect_error "--epochs must be positive" --epochs 0 --data synthetic:64
expect_error "--steps is for step mode" --epochs 1 --steps 3 --data synthetic:64
expect_error "--plot is for epoch mode" --plot x.png
expect_error "cannot be split evenly over 3 devices" --epochs 1 --data synthetic:64 --devices cpu:3 --batch-size 64
expect_error "--plot needs Python with matplotlib" --epochs 1 --data synthetic:64 --python /nonexistent/python3 --plot x.png
expect_error "unknown dataset .nonsense." --epochs 1 --data nonsense
expect_error "epoch mode reads data held in memory" --epochs 1 --data imagefolder:/nonexistent
expect_error "--lr must be positive, got 0" --epochs 1 --data synthetic:64 --lr 0
expect_error "--json /nowhere/x.jsonl: the folder /nowhere does not exist" --epochs 1 --data synthetic:64 --json /nowhere/x.jsonl
expect_error "--json . is a directory" --epochs 1 --data synthetic:64 --json .
expect_error "--json /nowhere/x.jsonl: the folder /nowhere does not exist" --model mlp --json /nowhere/x.jsonl
expect_error "cannot write --json /dev/full" --model mlp --steps 1 --warmup 0 --json /dev/full

# SIGINT: the run in flight stops, the finished runs reach the table and --json, the exit
# status is 130 and the temporary directory (the exported data) is gone.
mkdir -p tmp
rm -f int.jsonl
TMPDIR=$PWD/tmp "$DP_BENCH" --epochs 1 --data synthetic:4096 --devices cpu:2 --no-pytorch --json int.jsonl \
  > int.log 2>&1 &
pid=$!
for _ in $(seq 1 1200); do grep -q "s/epoch" int.log && break; sleep 0.05; done
kill -INT "$pid"
rc=0
wait "$pid" || rc=$?
[ "$rc" -eq 130 ] || { cat int.log; echo "SIGINT: exit status $rc, expected 130"; exit 1; }
grep -q "stopped by SIGINT after 1 of" int.log || { cat int.log; echo "SIGINT: no stop line"; exit 1; }
[ "$(grep -c '"status":"ok"' int.jsonl)" -eq 1 ] || { cat int.jsonl; echo "SIGINT: --json lacks the finished run"; exit 1; }
[ -z "$(ls tmp)" ] || { ls tmp; echo "SIGINT: the temporary directory was left"; exit 1; }
echo "SIGINT: exit 130, the finished run kept, nothing left in TMPDIR"

# Step mode, DDP row: the bytes a rank sums per step halve with --grad-reduce-dtype bf16.
for d in fp32 bf16; do
  rm -f "wire_$d.jsonl"
  "$DP_BENCH" --model lenet --batch-size 32 --devices cpu:2 --steps 2 --repeats 1 --warmup 1 \
    --grad-reduce-dtype "$d" --json "wire_$d.jsonl" > "wire_$d.log" 2>&1 || { cat "wire_$d.log"; exit 1; }
done
python3 - wire_fp32.jsonl wire_bf16.jsonl <<'PY'
import json, sys
def ddp(path):
    rows = [json.loads(l) for l in open(path)]
    return next(r["summed_bytes_per_step"] for r in rows if r["config"].startswith("ddp"))
f32, bf16 = ddp(sys.argv[1]), ddp(sys.argv[2])
print(f"DDP bytes summed per step: fp32 {f32}, bf16 {bf16}")
assert f32 > 0 and 2 * bf16 == f32, (f32, bf16)
PY
echo "dp-bench --epochs e2e: ok"
