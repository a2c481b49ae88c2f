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

# Machines started for different worlds (--nnodes 2 and 3): each says so at once, not after --timeout.
start=$(date +%s)
for node in 0 1; do
  timeout 60 "$DP_TRAIN" "${common[@]}" --devices cpu --strategy ddp --nnodes $((node + 2)) --node-rank $node \
    --rdzv "redis:127.0.0.1:$port" --run-id "worlds-$$" --timeout 40 > "$work/w$node.out" 2> "$work/w$node.err" &
  eval "wpid$node=$!"
done
set +e
wait "$wpid0"; rc0=$?
wait "$wpid1"; rc1=$?
set -e
[ $rc0 != 0 ] && [ $rc1 != 0 ] && [ $(( $(date +%s) - start )) -lt 30 ] || {
  cat "$work"/w*.err; echo "different worlds: exits $rc0 $rc1 after $(( $(date +%s) - start )) s"; exit 1; }
grep -q "rank 1 was started for a world of 3 processes, rank 0 for 2" "$work/w0.err" &&
  grep -q "rank 0 was started for a world of 2 processes, rank 1 for 3" "$work/w1.err" ||
  { cat "$work"/w*.err; echo "different worlds: not named"; exit 1; }
# The other way round (rank 0 started for the larger world waits for a rank 2 that never comes): the
# mismatch rank 1 found reaches it within seconds.
start=$(date +%s)
for node in 0 1; do
  timeout 60 "$DP_TRAIN" "${common[@]}" --devices cpu --strategy ddp --nnodes $((3 - node)) --node-rank $node \
    --rdzv "redis:127.0.0.1:$port" --run-id "worlds2-$$" --timeout 40 > "$work/v$node.out" 2> "$work/v$node.err" &
  eval "vpid$node=$!"
done
set +e
wait "$vpid0"; rc0=$?
wait "$vpid1"; rc1=$?
set -e
[ $rc0 != 0 ] && [ $rc1 != 0 ] && [ $(( $(date +%s) - start )) -lt 30 ] || {
  cat "$work"/v*.err; echo "different worlds, rank 0 larger: exits $rc0 $rc1 after $(( $(date +%s) - start )) s"; exit 1; }
grep -q "rank 0 was started for a world of 3 processes, rank 1 for 2" "$work/v0.err" &&
  grep -q "rank 0 was started for a world of 3 processes, rank 1 for 2" "$work/v1.err" ||
  { cat "$work"/v*.err; echo "different worlds, rank 0 larger: not named on both"; exit 1; }

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
