#!/usr/bin/env bash
# e2e: two "machines" (two launchers, one worker each) meet through a real
# redis-server on 127.0.0.1 (Gloo's RedisStore) and train to the same bits
# as one device (--split-invariant). Skips (exit 77) without redis-server.
set -euo pipefail
: "${DP_TRAIN:?path to dp-train}"
command -v redis-server > /dev/null || { echo "redis-server is not installed (Debian package redis-server): skipped"; exit 77; }
work=$(mktemp -d)
redis_pid=""
cleanup() {
  [ -n "$redis_pid" ] && kill "$redis_pid" 2> /dev/null && wait "$redis_pid" 2> /dev/null
  rm -rf "$work"
}
trap cleanup EXIT

port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$work" > "$work/redis.log" 2>&1 &
redis_pid=$!
for _ in $(seq 1 100); do
  [ "$(redis-cli -p "$port" ping 2> /dev/null)" = PONG ] && break
  sleep 0.1
done
[ "$(redis-cli -p "$port" ping)" = PONG ] || { echo "redis-server did not start"; cat "$work/redis.log"; exit 1; }

common=(--model mlp --data synthetic:480 --epochs 1 --batch-size 48 --lr-schedule constant --seed 5 --progress off
        --workers 0 --split-invariant)
run_id="redis-e2e-$$-$RANDOM"
export GLOO_SOCKET_IFNAME=lo
for node in 0 1; do
  timeout 120 "$DP_TRAIN" "${common[@]}" --devices cpu --strategy ddp --nnodes 2 --node-rank $node \
    --rdzv "redis:127.0.0.1:$port" --run-id "$run_id" --save-dir "$work/node$node" \
    > "$work/node$node.out" 2> "$work/node$node.err" &
  eval "pid$node=$!"
done
set +e
wait "$pid0"; rc0=$?
wait "$pid1"; rc1=$?
set -e
[ $rc0 = 0 ] && [ $rc1 = 0 ] || { echo "node exits $rc0 $rc1"; cat "$work"/node*.out "$work"/node*.err; exit 1; }
grep -q '^ddp: 2 processes (1 per machine)' "$work/node0.out"
grep -q 'final test accuracy' "$work/node0.out"
[ ! -e "$work/node1/epoch-0001.safetensors" ] || { echo "rank 1 saved a checkpoint"; exit 1; }
# The run's keys were cleared after its rendezvous, so the same --run-id can meet again.
left=$(redis-cli -p "$port" --scan --pattern "fanout/$run_id/*")
[ -z "$left" ] || { echo "keys left in Redis: $left"; exit 1; }

# A password given to a server that has none: one line, nothing trains.
rc=0
FANOUT_RDZV_PASSWORD=secret "$DP_TRAIN" "${common[@]}" --devices cpu --strategy ddp --nnodes 2 --node-rank 1 \
  --rdzv "redis:127.0.0.1:$port" --run-id pw > "$work/pw.out" 2> "$work/pw.err" || rc=$?
[ $rc != 0 ] && [ "$(wc -l < "$work/pw.err")" = 1 ] &&
  grep -q "a password is given (FANOUT_RDZV_PASSWORD) but the server has none" "$work/pw.err" ||
  { cat "$work/pw.err"; echo "a password for a server without one: not one line naming it"; exit 1; }
# From a file: the file is named, not the variable it passes the password on in.
echo secret > "$work/pw.txt"
rc=0
"$DP_TRAIN" "${common[@]}" --devices cpu --strategy ddp --nnodes 2 --node-rank 1 --rdzv "redis:127.0.0.1:$port" \
  --run-id pw --rdzv-password-file "$work/pw.txt" > "$work/pwf.out" 2> "$work/pwf.err" || rc=$?
[ $rc != 0 ] && [ "$(wc -l < "$work/pwf.err")" = 1 ] &&
  grep -q "a password is given (--rdzv-password-file $work/pw.txt) but the server has none" "$work/pwf.err" ||
  { cat "$work/pwf.err"; echo "a password file for a server without one: not one line naming the file"; exit 1; }

# Machines started for different worlds: both end within seconds (not --timeout 40), naming the worlds.
# worlds NAME NNODES0 NNODES1 LINE0 LINE1: node i started with --nnodes NNODESi prints LINEi.
worlds() {
  local name=$1 start pids=() rcs=() node
  start=$(date +%s)
  for node in 0 1; do
    timeout 60 "$DP_TRAIN" "${common[@]}" --devices cpu --strategy ddp --nnodes "${@:2+node:1}" --node-rank $node \
      --rdzv "redis:127.0.0.1:$port" --run-id "$name-$$" --timeout 40 > /dev/null 2> "$work/$name$node.err" &
    pids+=($!)
  done
  for node in 0 1; do
    set +e; wait "${pids[node]}"; rcs+=($?); set -e
  done
  [ "${rcs[0]}" != 0 ] && [ "${rcs[1]}" != 0 ] && [ $(( $(date +%s) - start )) -lt 30 ] &&
    grep -q "$4" "$work/${name}0.err" && grep -q "$5" "$work/${name}1.err" ||
    { cat "$work/$name"*.err; echo "$name: exits ${rcs[*]} after $(( $(date +%s) - start )) s"; exit 1; }
}
worlds smaller0 2 3 "rank 1 was started for a world of 3 processes, rank 0 for 2" \
  "rank 0 was started for a world of 2 processes, rank 1 for 3"
# Rank 0 started for the larger world waits for a rank 2 that never comes: rank 1's finding reaches it.
worlds larger0 3 2 "rank 0 was started for a world of 3 processes, rank 1 for 2" \
  "rank 0 was started for a world of 3 processes, rank 1 for 2"

"$DP_TRAIN" "${common[@]}" --devices cpu --save-dir "$work/one" > /dev/null
python3 - "$work" <<'PY'
import sys
from safetensors.numpy import load_file
work = sys.argv[1]
a = load_file(f"{work}/node0/epoch-0001.safetensors")
b = load_file(f"{work}/one/epoch-0001.safetensors")
keys = [k for k in b if not k.startswith("optimizer.")]
assert keys and all(a[k].tobytes() == b[k].tobytes() for k in keys), "DDP over Redis differs from one device"
print(f"DDP over Redis (2 nodes) == one device, bit for bit ({len(keys)} tensors)")
PY
echo "ddp redis e2e: ok"
