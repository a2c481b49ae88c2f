#!/usr/bin/env bash
# e2e: preemption. SIGTERM mid-epoch makes dp-train finish the step in
# flight, save a mid-epoch checkpoint and exit 143; --resume then gives the
# uninterrupted run's parameters, momentum and metrics bit for bit, on one
# CPU device, DataParallel over cpu:2 and DDP over 2 processes (the
# launcher passes the signal on; every rank stops at the same step). One
# SIGINT (Ctrl-C) to a one-process run does the same and exits 130. The
# resumed run must say it continues from the checkpoint the stop saved, at
# its batch and step (seeded math would give a run that ignored --resume the
# same bits). A second signal ends the run at once, unless it comes within a
# second of the first (timeout(1) sends two at once). A closed stdout loses
# no checkpoint.
# --save-every-steps keeps the newest --keep-last checkpoints, mid-epoch ones
# included.
set -uo pipefail
: "${DP_TRAIN:?path to dp-train}"
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$work"

compare() {  # compare NAME: whole/ vs cut/ final checkpoints and metrics
  python3 - "$work/$1" <<'PY' || fail "$1: the resumed run differs from the uninterrupted one"
import json, sys
from safetensors.numpy import load_file
d = sys.argv[1]
a, b = load_file(f"{d}/whole/epoch-0003.safetensors"), load_file(f"{d}/cut/epoch-0003.safetensors")
assert a.keys() == b.keys(), "different tensors"
for k in a:
    assert a[k].tobytes() == b[k].tobytes(), f"{k} differs"
w = [json.loads(l) for l in open(f"{d}/whole.jsonl")]
c = [json.loads(l) for l in open(f"{d}/cut.jsonl")]
assert [m["epoch"] for m in c] == [1, 2, 3], c
for x, y in zip(w, c):
    for k in ("train_loss", "train_acc", "test_loss", "test_acc", "lr"):
        assert x[k] == y[k], f"epoch {x['epoch']} {k}: {x[k]} != {y[k]}"
print(f"{d.rsplit('/', 1)[1]}: {len(a)} tensors bit-identical, metrics equal")
PY
}

preempt() {  # preempt NAME SIGNAL ARGS...: uninterrupted, then SIGNAL mid-epoch and --resume
  local name=$1 sig=$2
  shift 2
  local status=$((128 + $(kill -l "$sig")))
  mkdir -p "$name"
  local a=(--model lenet --data synthetic:12288 --epochs 3 --batch-size 32 --progress off --seed 5 "$@")
  # The uninterrupted run, unless the caller copied in one of the same arguments.
  [ -f "$name/whole/epoch-0003.safetensors" ] ||
    timeout 300 "$DP_TRAIN" "${a[@]}" --save-dir "$name/whole" --metrics "$name/whole.jsonl" > "$name/whole.log" 2>&1 ||
    { cat "$name/whole.log"; fail "$name: the uninterrupted run failed"; }
  "$DP_TRAIN" "${a[@]}" --save-dir "$name/cut" --metrics "$name/cut.jsonl" --save-every-steps 64 \
    > "$name/cut.log" 2>&1 &
  local pid=$!
  pids+=("$pid")
  # Signal once the run is inside its second epoch (a mid-epoch file of epoch 2 exists).
  wait_for 240 compgen -G "$name/cut/epoch-0001-batch-*.safetensors" ||
    { cat "$name/cut.log"; fail "$name: no mid-epoch checkpoint of epoch 2 within 240 s"; }
  kill "-$sig" "$pid"
  await "$pid" 300
  [ "$rc" -eq "$status" ] || { cat "$name/cut.log"; fail "$name: exit status $rc after SIG$sig, expected $status"; }
  # The stop names the mid-epoch checkpoint it saved, of the batch it stopped after.
  local stop n saved
  expect_stop "$name/cut.log" "$sig" 2 "$name/cut"
  timeout 300 "$DP_TRAIN" "${a[@]}" --resume "$name/cut" --metrics "$name/cut.jsonl" > "$name/resume.log" 2>&1 ||
    { cat "$name/resume.log"; fail "$name: the resumed run failed"; }
  # 12288 samples in batches of 32: 384 steps an epoch.
  grep -qxF "resumed from $saved: 1 of 3 epochs done and $n batches of the next, $((384 + n)) steps" "$name/resume.log" ||
    { cat "$name/resume.log"; fail "$name: no line saying the run resumed from $saved at batch $n, step $((384 + n))"; }
  compare "$name"
  echo "$name: $stop; resumed from it at step $((384 + n))"
}

preempt one TERM --devices cpu
preempt dp TERM --devices cpu:2
preempt ddp TERM --devices cpu:2 --strategy ddp
# One SIGINT (Ctrl-C) to a one-process run: the same stop, status 130 (against one's uninterrupted run).
mkdir -p one-int
cp -r one/whole one/whole.jsonl one-int/
preempt one-int INT --devices cpu

# Rotation: --save-every-steps with --keep-last 2 leaves the two newest checkpoints (and best).
files=$(cd one/cut && ls epoch-*.safetensors | tr '\n' ' ')
[ "$(echo "$files" | wc -w)" -eq 2 ] || fail "keep-last 2 left: $files"
echo "ok   rotation kept: $files"

# timeout(1) signals the process and then its group: the two are one request,
# so the run still stops after its step and saves, on one device and under the
# launcher (whose workers live in their own process groups). The two signals
# are sent as timeout(1) sends them, once training is under way (a mid-epoch
# checkpoint exists), so no machine's speed decides where they land.
for mode in "--devices cpu" "--devices cpu:2 --strategy ddp"; do
  dir="tm${mode//[^a-z0-9]/}"
  # shellcheck disable=SC2086
  setsid "$DP_TRAIN" --model lenet --data synthetic:12288 --epochs 20 --batch-size 32 \
    --progress off $mode --save-dir "$dir" --save-every-steps 8 > tm.log 2>&1 &
  pid=$!
  pids+=("$pid")
  for _ in $(seq 1 1200); do ls "$dir"/epoch-0000-batch-*.safetensors > /dev/null 2>&1 && break; sleep 0.05; done
  kill -TERM "$pid"
  kill -TERM -- "-$pid"  # setsid: the process group is the run's own
  await "$pid" 300
  [ "$rc" -eq 143 ] || { cat tm.log; fail "timeout with $mode: exit status $rc, expected 143"; }
  grep -q "stopped by SIGTERM" tm.log || { cat tm.log; fail "timeout with $mode: no stop line"; }
  ls "tm${mode//[^a-z0-9]/}"/epoch-*.safetensors > /dev/null 2>&1 || fail "timeout with $mode: nothing saved"
  echo "ok   timeout's two signals stop $mode once, saved: $(grep -o 'saved [^;]*' tm.log)"
done

# A closed stdout (dp-train | head -1) loses output, not the run.
"$DP_TRAIN" --model lenet --data synthetic:2000 --epochs 2 --devices cpu --progress off --save-dir piped 2>piped.err |
  head -1 > /dev/null
rc=${PIPESTATUS[0]}
[ "$rc" -eq 0 ] || { cat piped.err; fail "dp-train into a closed pipe: exit status $rc, expected 0"; }
ls piped/epoch-0002.safetensors > /dev/null || fail "dp-train into a closed pipe saved no final checkpoint"
echo "ok   a closed stdout: status 0, epoch-0002 saved"

# A second signal a second later ends the run at once, without a checkpoint:
# the test hook holds every step 60 s at its end, so both signals land
# inside the first step whatever the machine's speed.
FANOUT_TEST_STEP_SLEEP_S=60 "$DP_TRAIN" --model lenet --devices cpu --data synthetic:512 --epochs 1 \
  --batch-size 128 --progress off --save-dir twice > twice.log 2>&1 &
pid=$!
pids+=("$pid")
for _ in $(seq 1 1200); do grep -q "dp-train: model lenet" twice.log 2> /dev/null && break; sleep 0.05; done
kill -TERM "$pid"
sleep 1.3
kill -INT "$pid"
await "$pid" 120
[ "$rc" -eq 130 ] || { cat twice.log; fail "a second signal: exit status $rc, expected 130"; }
! ls twice/epoch-*.safetensors > /dev/null 2>&1 || fail "a second signal still saved"
echo "ok   a second signal exits at once (status $rc)"

# Workers that do not stop after a forwarded signal are killed when the
# launcher's grace runs out (120 s; 2 s here through the test hook, with
# workers that ignore SIGTERM): the launcher exits, and no worker is left.
FANOUT_TEST_IGNORE_STOP=1 FANOUT_TEST_STOP_GRACE_S=2 "$DP_TRAIN" --model lenet --devices cpu:2 --strategy ddp \
  --data synthetic:12288 --epochs 100000 --batch-size 32 --progress off --save-dir deaf --save-every-steps 8 \
  > deaf.log 2>&1 &
pid=$!
pids+=("$pid")
for _ in $(seq 1 1200); do ls deaf/epoch-0000-batch-*.safetensors > /dev/null 2>&1 && break; sleep 0.05; done
workers=$(pgrep -P "$pid" | tr '\n' ' ')
[ "$(echo "$workers" | wc -w)" -eq 2 ] || { cat deaf.log; fail "expected 2 workers, got: $workers"; }
kill -TERM "$pid"
for _ in $(seq 1 1200); do kill -0 "$pid" 2> /dev/null || break; sleep 0.05; done  # outer bound: 60 s
kill -0 "$pid" 2> /dev/null && fail "the launcher still runs 60 s after SIGTERM with a 2 s grace"
await "$pid" 10
[ "$rc" -ne 0 ] || { cat deaf.log; fail "the launcher exited 0 after killing its workers"; }
grep -q "interrupted (Terminated): stopped 2 workers" deaf.log || { cat deaf.log; fail "no interruption line"; }
! grep -q "stopped by SIGTERM" deaf.log || { cat deaf.log; fail "the workers stopped by themselves: the hook did not hold them"; }
for w in $workers; do kill -0 "$w" 2> /dev/null && fail "worker $w survived the launcher's kill"; done
echo "ok   workers that ignore SIGTERM are killed after the grace (launcher status $rc): $(tail -1 deaf.log)"
echo "preemption e2e: ok"
