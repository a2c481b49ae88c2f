#!/usr/bin/env bash
# e2e: DDP failures end the run, name the rank, and leave no process.
# - SIGKILL of one worker mid-epoch: the launcher exits non-zero within
#   --timeout + 10 s, names the rank, and no worker is left.
# - A rank that never joins: the one that did ends with an error after --timeout.
# - A stale rendezvous directory (files of a dead run) does not disturb a new run.
# - A rank that stops making progress without dying (SIGSTOP; a hang outside
#   any collective, by a test hook) is named by the launcher, with where each
#   rank was, within --timeout + 10 s, exit status 124, and no worker is left.
# - A rank that skips one gradient all-reduce (a test hook): the ranks wait for
#   each other instead of summing different steps' gradients, and the run ends
#   within --timeout + 10 s with one line naming each rank's collective.
set -euo pipefail
: "${DP_TRAIN:?path to dp-train}"
work=$(mktemp -d)
pids_to_kill=()
cleanup() {
  for p in "${pids_to_kill[@]}"; do kill -9 "$p" 2> /dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

workers_of() { pgrep -P "$1" || true; }
rank_of() { tr '\0' '\n' < "/proc/$1/environ" | sed -n 's/^RANK=//p'; }

# --- SIGKILL of rank 1 mid-epoch -------------------------------------------
timeout_s=20
"$DP_TRAIN" --model lenet --data synthetic:20000 --epochs 5 --devices cpu:2 --strategy ddp --progress lines \
  --workers 0 --timeout $timeout_s > "$work/kill.out" 2> "$work/kill.err" &
launcher=$!
pids_to_kill+=("$launcher")
# Wait until training runs (a progress line) and both workers exist.
for _ in $(seq 1 300); do
  if grep -q 'epoch 1/5' "$work/kill.err" 2> /dev/null && [ "$(workers_of $launcher | wc -l)" = 2 ]; then break; fi
  sleep 0.1
done
workers=$(workers_of $launcher)
[ "$(echo "$workers" | wc -w)" = 2 ] || { echo "expected 2 workers, got: $workers"; cat "$work/kill.err"; exit 1; }
victim=""
for w in $workers; do [ "$(rank_of "$w")" = 1 ] && victim=$w; done
[ -n "$victim" ] || { echo "no rank 1 among $workers"; exit 1; }
start=$(date +%s.%N)
kill -9 "$victim"
set +e
wait "$launcher"
rc=$?
set -e
elapsed=$(python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$start" "$(date +%s.%N)")
echo "launcher exit status $rc after ${elapsed} s; its last line: $(tail -1 "$work/kill.err")"
[ $rc -ne 0 ] || { echo "launcher exited 0 after a worker was killed"; exit 1; }
python3 -c "import sys; assert float(sys.argv[1]) <= float(sys.argv[2]) + 10, sys.argv" "$elapsed" "$timeout_s"
grep -q 'rank 1 (pid [0-9]*) was killed by signal 9' "$work/kill.err" || { cat "$work/kill.err"; exit 1; }
for w in $workers; do
  if kill -0 "$w" 2> /dev/null; then echo "worker $w is still running"; exit 1; fi
done

# --- a rank that never joins -----------------------------------------------
# Rank 0 alone waits for rank 1; rank 1 alone waits for rank 0's address (that
# wait once used Gloo's own 30 s): each ends with an error within --timeout.
mkdir -p "$work/rdzv"
lonely() {  # lonely RANK
  local start rc elapsed
  start=$(date +%s)
  set +e
  RANK=$1 WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 "$DP_TRAIN" --model mlp --data synthetic:96 --epochs 1 \
    --devices cpu --strategy ddp --rdzv "file:$work/rdzv" --run-id "lonely$1" --timeout 2 --progress off \
    > "$work/lonely$1.out" 2> "$work/lonely$1.err"
  rc=$?
  set -e
  elapsed=$(($(date +%s) - start))
  echo "lonely rank $1: exit status $rc after ${elapsed} s: $(cat "$work/lonely$1.err")"
  [ $rc -ne 0 ] || { echo "lonely rank $1 succeeded"; exit 1; }
  [ $elapsed -le 20 ] || { echo "lonely rank $1 waited ${elapsed} s, --timeout 2 (outer bound: 10x)"; exit 1; }
  grep -q "rendezvous over file:.*(rank $1 of 2): rank $((1 - $1)) did not join within 2 s" "$work/lonely$1.err"
}
lonely 0
lonely 1

# --- a stale rendezvous directory --------------------------------------------
# The lonely ranks above removed what they wrote; a rank killed inside its meeting leaves its files
# in $work/rdzv, and a new run there succeeds.
[ -z "$(ls -A "$work/rdzv")" ] || { echo "the lonely ranks left files: $(ls -A "$work/rdzv")"; exit 1; }
RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 "$DP_TRAIN" --model mlp --data synthetic:96 --epochs 1 \
  --devices cpu --strategy ddp --rdzv "file:$work/rdzv" --run-id killed --timeout 60 --progress off > /dev/null 2>&1 &
killed=$!
pids_to_kill+=("$killed")
for _ in $(seq 200); do [ -n "$(ls -A "$work/rdzv")" ] && break; sleep 0.1; done
kill -9 "$killed"
wait "$killed" 2> /dev/null || true
[ -n "$(ls -A "$work/rdzv")" ] || { echo "the killed rank left no files"; exit 1; }
"$DP_TRAIN" --model mlp --data synthetic:96 --epochs 1 --batch-size 48 --devices cpu:2 --strategy ddp \
  --rdzv "file:$work/rdzv" --progress off > "$work/stale.out"
grep -q 'final test accuracy' "$work/stale.out"
# --- a stalled rank: SIGSTOP, and a hang outside any collective -------------
stalled() {  # stalled NAME: waits for the launcher in $launcher, checks time, line and leftovers
  local name=$1 start=$2 rc elapsed w
  set +e
  wait "$launcher"
  rc=$?
  set -e
  elapsed=$(python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$start" "$(date +%s.%N)")
  echo "$name: exit status $rc after ${elapsed} s; $(tail -1 "$work/$name.err")"
  [ "$rc" = 124 ] || { cat "$work/$name.err"; echo "$name: exit status $rc, expected 124"; exit 1; }
  python3 -c "import sys; assert float(sys.argv[1]) <= float(sys.argv[2]) + 10, sys.argv" "$elapsed" "$timeout_s"
  for w in $workers; do
    if kill -0 "$w" 2> /dev/null; then echo "$name: worker $w is still running"; exit 1; fi
  done
}
timeout_s=6
start_ddp() {  # start_ddp NAME: lenet over 2 processes in the background; sets launcher and workers
  "$DP_TRAIN" --model lenet --data synthetic:20000 --epochs 5 --devices cpu:2 --strategy ddp --progress lines \
    --workers 0 --timeout $timeout_s > "$work/$1.out" 2> "$work/$1.err" &
  launcher=$!
  pids_to_kill+=("$launcher")
  for _ in $(seq 1 300); do
    if { [ -n "${FANOUT_TEST_HANG_RANK:-}${FANOUT_TEST_SKIP_COLLECTIVE:-}" ] || grep -q 'epoch 1/5' "$work/$1.err" 2> /dev/null; } &&
      [ "$(workers_of $launcher | wc -l)" = 2 ]; then break; fi
    sleep 0.1
  done
  workers=$(workers_of $launcher)
  [ "$(echo "$workers" | wc -w)" = 2 ] || { echo "$1: expected 2 workers, got: $workers"; cat "$work/$1.err"; exit 1; }
}
start_ddp sigstop
for w in $workers; do [ "$(rank_of "$w")" = 1 ] && victim=$w; done
start=$(date +%s.%N)
kill -STOP "$victim"
# The stop may catch rank 1 inside any collective (a gradient bucket or the
# periodic all-reduce of the stop check) or between them; rank 0 then waits in
# the next one, a bucket or the stop check.
stalled sigstop "$start"
tail -1 "$work/sigstop.err" | grep -qE "rank 1 \(pid $victim\) is stopped \(SIGSTOP or a debugger\) [a-z ]*for [0-9]+ s: rank 1 is .*all-reduce of .*; rank 0 .*all-reduce of (gradient bucket|the stop check)" ||
  { cat "$work/sigstop.err"; echo "sigstop: the last line does not name rank 1 and the collectives"; exit 1; }

export FANOUT_TEST_HANG_RANK=1 FANOUT_TEST_HANG_AT_STEP=40
start=$(date +%s.%N)
start_ddp hang
stalled hang "$start"
unset FANOUT_TEST_HANG_RANK FANOUT_TEST_HANG_AT_STEP
tail -1 "$work/hang.err" | grep -q "rank 1 (pid [0-9]*) has made no progress for [0-9]* s: rank 1 is outside any collective for .* after all-reduce of gradient bucket [0-9]* of [0-9]* (collective #[0-9]*, [0-9]* elements); rank 0 " ||
  { cat "$work/hang.err"; echo "hang: the last line does not name rank 1 and the collectives"; exit 1; }

export FANOUT_TEST_SKIP_COLLECTIVE=1:2:30  # rank 1 skips its 30th collective of tag 2 (gradient buckets)
start=$(date +%s.%N)
start_ddp skip
set +e
wait "$launcher"
rc=$?
set -e
unset FANOUT_TEST_SKIP_COLLECTIVE
elapsed=$(python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$start" "$(date +%s.%N)")
echo "skip: exit status $rc after ${elapsed} s; $(tail -1 "$work/skip.err")"
[ "$rc" != 0 ] || { cat "$work/skip.err"; echo "skip: the run went on"; exit 1; }
python3 -c "import sys; assert float(sys.argv[1]) <= float(sys.argv[2]) + 10 + 5, sys.argv" "$elapsed" "$timeout_s"
tail -1 "$work/skip.err" | grep -q "the ranks' collectives are out of step .*: rank 0 .*all-reduce of gradient bucket 0 of [0-9]* (collective #30, [0-9]* elements); rank 1 .*all-reduce of gradient bucket 0 of [0-9]* (collective #31, [0-9]* elements)" ||
  { cat "$work/skip.err"; echo "skip: the last line does not name both ranks' collectives"; exit 1; }
for w in $workers; do
  if kill -0 "$w" 2> /dev/null; then echo "skip: worker $w is still running"; exit 1; fi
done

# The hooks themselves take only well-formed values: one line, before anything starts.
for bad in FANOUT_TEST_HANG_RANK=one FANOUT_TEST_SKIP_COLLECTIVE=1:2 FANOUT_TEST_STEP_SLEEP_S=-1 FANOUT_TEST_IGNORE_STOP=yes; do
  set +e
  env "$bad" timeout 60 "$DP_TRAIN" --model mlp --data synthetic:64 --epochs 1 --devices cpu:2 --strategy ddp \
    --progress off > "$work/hook.out" 2> "$work/hook.err"
  rc=$?
  set -e
  [ "$rc" = 1 ] && [ "$(wc -l < "$work/hook.err")" = 1 ] && grep -q "^dp-train: error: FANOUT_TEST_" "$work/hook.err" ||
    { cat "$work/hook.err"; echo "$bad: exit $rc, not one line naming the hook"; exit 1; }
  echo "$bad: $(cat "$work/hook.err")"
done

echo "ddp faults e2e: ok"
