#!/usr/bin/env bash
# e2e: --max-restarts. A DDP worker SIGKILLed mid-epoch twice under
# --max-restarts 2: the launcher says why, stops the other worker and starts
# both again from the save directory's newest checkpoint; the run finishes
# with the uninterrupted run's parameters bit for bit (split-invariant math)
# and each epoch once in the metrics file. A third kill ends the run with the
# reason, and nothing is left running. Without a save directory, or without
# DDP, --max-restarts is refused in one line.
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
  FANOUT_TEST_STEP_SLEEP_S=0.01 "$DP_TRAIN" "${a[@]}" --save-dir cut --metrics cut.jsonl --save-every-steps 50 \
    --max-restarts "$max" > cut.out 2> cut.err &
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
  timeout 300 tail --pid="$launcher" -f /dev/null
  wait "$launcher"
  rc=$?
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
timeout 300 tail --pid="$launcher" -f /dev/null
wait "$launcher" || { cat early.out early.err; fail "early: the restarted run failed"; }
grep -q "restarting the workers (restart 1 of 1)" early.err || { cat early.err; fail "early: no restart line"; }
ls early/epoch-0002.safetensors > /dev/null || fail "early: no final checkpoint"
python3 -c "
import json
e = [json.loads(l)['epoch'] for l in open('early.jsonl')]
assert e == [1, 2], e
print('restart before any checkpoint: epochs', e)" || { cat early.jsonl; fail "early: epochs in the metrics file"; }

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
echo "restarts: OK"
