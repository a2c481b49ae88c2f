#!/usr/bin/env bash
# e2e: --max-restarts. A DDP worker SIGKILLed mid-epoch twice under
# --max-restarts 2: the launcher says why, stops the other worker and starts
# both again from the save directory's newest checkpoint; the run finishes
# with the uninterrupted run's parameters bit for bit (split-invariant math)
# and each epoch once in the metrics file. A third kill ends the run with the
# reason, and nothing is left running. SIGTERM to the launcher is a stop,
# never a restart: the workers save a mid-epoch checkpoint, the launcher exits
# 143 without a restart line, nothing is left running, and the checkpoint
# resumes to the uninterrupted run's bits. Without a save directory, without
# DDP, or with --nnodes above 1, --max-restarts is refused in one line.
set -uo pipefail
: "${DP_TRAIN:?path to dp-train}"
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$work"

base=(--model lenet --data synthetic:6144 --batch-size 32 --devices cpu:2 --strategy ddp --split-invariant
      --workers 0 --progress off --seed 7 --timeout 20)
a=("${base[@]}" --epochs 3)

timeout 300 "$DP_TRAIN" "${a[@]}" --save-dir whole --metrics whole.jsonl > whole.log 2>&1 ||
  { cat whole.log; fail "the uninterrupted run failed"; }

rank1_of() {  # the launcher's worker with RANK=1
  local w
  for w in $(pgrep -P "$1"); do
    tr '\0' '\n' < "/proc/$w/environ" 2> /dev/null | grep -qx 'RANK=1' && { echo "$w"; return; }
  done
}

# cut KILLS MAX: starts the run with --max-restarts MAX and SIGKILLs rank 1
# KILLS times, each time once the current start has saved a mid-epoch
# checkpoint; leaves the launcher's exit status in $rc.
cut() {
  local kills=$1 max=$2 saves=0 k victim
  rm -rf cut cut.jsonl
  rm -rf cutlogs
  FANOUT_TEST_STEP_SLEEP_S=0.01 "$DP_TRAIN" "${a[@]}" --save-dir cut --metrics cut.jsonl --save-every-steps 50 \
    --max-restarts "$max" --log-dir cutlogs > cut.out 2> cut.err &
  local launcher=$!
  pids+=("$launcher")
  for k in $(seq 1 "$kills"); do
    victim=""
    for _ in $(seq 1 1200); do
      local now
      now=$(grep -c 'saved .*-batch-' cut.out 2> /dev/null)
      [ "${now:-0}" -gt "$saves" ] && victim=$(rank1_of "$launcher") && [ -n "$victim" ] && break
      sleep 0.05
    done
    [ -n "$victim" ] || { cat cut.out cut.err; fail "kill $k: no mid-epoch save of this start, or no rank 1"; }
    saves=$(grep -c 'saved .*-batch-' cut.out)
    # The launcher holds the save directory for its workers, so no other run takes it between two starts.
    grep -q "^pid $launcher, " cut/.fanout.lock || { cat cut/.fanout.lock; fail "kill $k: the launcher does not hold cut"; }
    kill -9 "$victim"
    # The next kill waits for the next start's own save.
    if [ "$k" -lt "$kills" ]; then
      for _ in $(seq 1 1200); do
        grep -q "restarting the workers (restart $k of $max)" cut.err && break
        sleep 0.05
      done
      saves=$(grep -c 'saved .*-batch-' cut.out)
    fi
  done
  await "$launcher" 300
  for w in $(pgrep -f "save-dir cut" || true); do
    [ "$w" = "$$" ] || fail "process $w of the run is still running"
  done
}

# --- two kills, two restarts: the run finishes as if never interrupted ------
cut 2 2
[ "$rc" -eq 0 ] || { cat cut.out cut.err; fail "exit status $rc with two kills and --max-restarts 2"; }
for k in 1 2; do
  grep -q "restarting the workers (restart $k of 2)" cut.err || { cat cut.err; fail "no restart $k line"; }
done
[ "$(grep -c 'rank 1 (pid [0-9]*) was killed by signal 9' cut.err)" -eq 2 ] ||
  { cat cut.err; fail "the two kills are not both named"; }
[ "$(grep -c 'resumed from cut/epoch-' cut.out)" -eq 2 ] || { cat cut.out; fail "not two resumes from the save directory"; }
# --log-dir keeps every start: rank 0's log holds each start's first line and each restart's mark, in order.
[ "$(grep -c '^fanout dp-train: model' cutlogs/rank-0.log)" -eq 3 ] || { cat cutlogs/rank-0.log; fail "rank 0's log lost a start"; }
[ "$(grep -c -e '--- dp-train: restart [12] of 2 ---' cutlogs/rank-0.log)" -eq 2 ] &&
  [ "$(grep -c -e '--- dp-train: restart [12] of 2 ---' cutlogs/rank-1.log)" -eq 2 ] ||
  { cat cutlogs/rank-0.log; fail "a rank's log has not both restart marks"; }
python3 - <<'PY' || fail "the restarted run differs from the uninterrupted one"
import json
from safetensors.numpy import load_file
a, b = load_file("whole/epoch-0003.safetensors"), load_file("cut/epoch-0003.safetensors")
assert a.keys() == b.keys(), "different tensors"
for k in a:
    assert a[k].tobytes() == b[k].tobytes(), f"{k} differs"
w = [json.loads(l) for l in open("whole.jsonl")]
c = [json.loads(l) for l in open("cut.jsonl")]
assert [m["epoch"] for m in c] == [1, 2, 3], [m["epoch"] for m in c]
for x, y in zip(w, c):
    for k in ("train_loss", "train_acc", "test_loss", "test_acc"):
        assert x[k] == y[k], f"epoch {x['epoch']} {k}: {x[k]} != {y[k]}"
print(f"two restarts: {len(a)} tensors bit-identical, each epoch once, metrics equal")
PY
grep "restarting\|killed\|resumed" cut.err cut.out

# --- a third kill with --max-restarts 2 ends the run, with the reason -------
cut 3 2
[ "$rc" -eq 137 ] || { cat cut.out cut.err; fail "exit status $rc after a third kill, expected 137"; }
tail -1 cut.err | grep -q "no restarts left (--max-restarts 2)" || { cat cut.err; fail "no reason on the last line"; }
tail -2 cut.err

# --- an error that a restart repeats word for word ends the restarts ------
rm -rf same
"$DP_TRAIN" --model lenet --data synthetic:0 --devices cpu:2 --strategy ddp --workers 0 --progress off --timeout 20 \
  --epochs 2 --save-dir same --max-restarts 3 > same.out 2> same.err &
launcher=$!
pids+=("$launcher")
await "$launcher" 120
[ "$rc" -ne 0 ] || { cat same.out same.err; fail "same error: the run succeeded"; }
[ "$(grep -c 'restarting the workers' same.err)" -eq 1 ] || { cat same.err; fail "same error: not one restart"; }
tail -1 same.err | grep -q "the restart ended with the same error and saved nothing new: not restarting again" ||
  { cat same.err; fail "same error: no reason on the last line"; }
[ "$(grep -c "bad dataset 'synthetic:0'" same.err)" -ge 2 ] || { cat same.err; fail "same error: not named"; }
echo "an error repeated by the restart: $(tail -1 same.err)"

# --- a restart before any checkpoint starts over, each epoch still once ------
rm -rf early early.jsonl
FANOUT_TEST_STEP_SLEEP_S=0.01 "$DP_TRAIN" "${base[@]}" --epochs 2 --save-every 2 --save-dir early --metrics early.jsonl \
  --max-restarts 1 > early.out 2> early.err &
launcher=$!
pids+=("$launcher")
for _ in $(seq 1 1200); do grep -q '"epoch": *1' early.jsonl 2> /dev/null && break; sleep 0.05; done
victim=$(rank1_of "$launcher")
[ -n "$victim" ] || { cat early.out early.err; fail "early: no epoch 1 line, or no rank 1"; }
kill -9 "$victim"
await "$launcher" 300
[ "$rc" -eq 0 ] || { cat early.out early.err; fail "early: the restarted run failed (status $rc)"; }
grep -q "restarting the workers (restart 1 of 1)" early.err || { cat early.err; fail "early: no restart line"; }
ls early/epoch-0002.safetensors > /dev/null || fail "early: no final checkpoint"
python3 -c "
import json
e = [json.loads(l)['epoch'] for l in open('early.jsonl')]
assert e == [1, 2], e
print('restart before any checkpoint: epochs', e)" || { cat early.jsonl; fail "early: epochs in the metrics file"; }

# --- SIGTERM to the launcher stops the run, with restarts left -------------
rm -rf term term.jsonl
FANOUT_TEST_STEP_SLEEP_S=0.01 "$DP_TRAIN" "${a[@]}" --save-dir term --metrics term.jsonl --save-every-steps 50 \
  --max-restarts 2 > term.out 2> term.err &
launcher=$!
pids+=("$launcher")
wait_for 120 grep -q 'saved .*-batch-' term.out || { cat term.out term.err; fail "term: no mid-epoch save in 120 s"; }
workers=$(pgrep -P "$launcher" | tr '\n' ' ')
[ "$(echo "$workers" | wc -w)" -eq 2 ] || { cat term.out term.err; fail "term: expected 2 workers, got: $workers"; }
kill -TERM "$launcher"
await "$launcher" 120
[ "$rc" -eq 143 ] || { cat term.out term.err; fail "term: exit status $rc after SIGTERM to the launcher, expected 143"; }
! grep -q "restarting the workers" term.err || { cat term.err; fail "term: SIGTERM to the launcher restarted the workers"; }
stop=$(grep -o "stopped by SIGTERM in epoch [0-9]* after batch [0-9]*: saved [^;]*" term.out) ||
  { cat term.out term.err; fail "term: no line saying SIGTERM stopped the run and what it saved"; }
saved=${stop##*saved }
[ -f "$saved" ] || fail "term: the stop's checkpoint $saved is missing"
for w in $workers; do kill -0 "$w" 2> /dev/null && fail "term: worker $w still runs"; done
for w in $(pgrep -f "save-dir term" || true); do
  [ "$w" = "$$" ] || fail "process $w of the stopped run is still running"
done
timeout 300 "$DP_TRAIN" "${a[@]}" --resume term --metrics term.jsonl > term.resume.log 2>&1 ||
  { cat term.resume.log; fail "term: the resumed run failed"; }
grep -q "^resumed from $saved: " term.resume.log || { cat term.resume.log; fail "term: not resumed from $saved"; }
python3 - <<'PY' || fail "term: the stopped and resumed run differs from the uninterrupted one"
import json
from safetensors.numpy import load_file
a, b = load_file("whole/epoch-0003.safetensors"), load_file("term/epoch-0003.safetensors")
assert a.keys() == b.keys(), "different tensors"
for k in a:
    assert a[k].tobytes() == b[k].tobytes(), f"{k} differs"
assert [json.loads(l)["epoch"] for l in open("term.jsonl")] == [1, 2, 3]
PY
echo "term: $stop (status 143, no restart); resumed == uninterrupted, bit for bit"

# --- refused --------------------------------------------------------------
out=$("$DP_TRAIN" --model lenet --data synthetic:64 --devices cpu:2 --strategy ddp --max-restarts 1 2>&1) &&
  fail "--max-restarts without --save-dir ran"
[ "$(echo "$out" | wc -l)" -eq 1 ] && echo "$out" | grep -q "max-restarts needs --save-dir" || fail "got: $out"
out=$("$DP_TRAIN" --model lenet --data synthetic:64 --devices cpu --save-dir d --max-restarts 1 2>&1) &&
  fail "--max-restarts without ddp ran"
echo "$out" | grep -q "max-restarts applies to --strategy ddp" || fail "got: $out"
out=$("$DP_TRAIN" --model lenet --data synthetic:64 --devices cpu:2 --strategy ddp --save-dir d --max-restarts -1 2>&1) &&
  fail "--max-restarts -1 ran"
echo "$out" | grep -q "max-restarts must be at least 0" || fail "got: $out"
# Several machines: refused before any rendezvous or worker (the Redis address is never tried).
rm -rf d
out=$(timeout 60 "$DP_TRAIN" --model lenet --data synthetic:64 --devices cpu:2 --strategy ddp --nnodes 2 --node-rank 0 \
  --rdzv redis:127.0.0.1:1 --run-id nodes --save-dir d --max-restarts 1 2>&1) && fail "--max-restarts with --nnodes 2 ran"
[ "$(echo "$out" | wc -l)" -eq 1 ] &&
  echo "$out" | grep -qxF "dp-train: error: --max-restarts restarts the workers of one machine; with --nnodes 2 the machines' launchers would restart apart" ||
  fail "--max-restarts with --nnodes 2: got: $out"
[ ! -e d ] || fail "--max-restarts with --nnodes 2 created its save directory"
echo "restarts: OK"
