# Sourced by the e2e scripts that start processes in the background: a work
# directory, the pids to kill on exit (append to pids), and fail.
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2> /dev/null || true; done  # || true: safe under set -e
  chmod -R u+w "$work" 2> /dev/null
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }

# await PID [SECONDS]: waits at most SECONDS (300) for the background process
# PID to end and leaves its exit status in $rc; one still running then is
# SIGKILLed and the test fails. Safe under set -e.
await() {
  local pid=$1 limit=${2:-300}
  if ! timeout "$limit" tail -s 0.1 --pid="$pid" -f /dev/null; then
    kill -9 "$pid" 2> /dev/null || true
    fail "process $pid still runs after $limit s"
  fi
  rc=0
  wait "$pid" || rc=$?
}

# wait_for SECONDS COMMAND...: runs COMMAND every 0.05 s until it succeeds;
# fails (1) when it has not within SECONDS.
wait_for() {
  local limit=$1 i
  shift
  for ((i = 0; i < limit * 20; i++)); do
    "$@" > /dev/null 2>&1 && return 0
    sleep 0.05
  done
  return 1
}

# expect_stop LOG SIG EPOCH DIR: LOG says SIG stopped EPOCH (1-based) after a
# batch and names the mid-epoch checkpoint of that batch in DIR, which
# exists. Sets stop (the line), n (the batch) and saved (the file).
expect_stop() {
  local log=$1 sig=$2 epoch=$3 dir=$4
  stop=$(grep -o "stopped by SIG$sig in epoch $epoch after batch [0-9]*: saved [^;]*" "$log") ||
    { cat "$log"; fail "$log: no line saying SIG$sig stopped epoch $epoch and what it saved"; }
  n=${stop#*after batch }
  n=${n%%:*}
  saved=${stop##*saved }
  [ "$saved" = "$dir/epoch-$(printf %04d $((epoch - 1)))-batch-$(printf %07d "$n").safetensors" ] && [ -f "$saved" ] ||
    { cat "$log"; ls "$dir"; fail "$log: the stop saved '$saved', not the checkpoint of batch $n"; }
}
