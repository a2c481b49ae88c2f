#!/usr/bin/env bash
# e2e: faults between machines (network namespaces of this host, machines_lib.sh),
# DDP through a password-protected redis-server on machine 0:
#   - the link of machine 1 cut mid-run: every rank on both machines ends within
#     --timeout (plus a margin for a loaded host) with a line naming the machine it
#     lost, exit non-zero, nothing left running; the link restored, --resume from
#     the newest checkpoint ends bit for bit as one device;
#   - a slow, lossy link (netem's delay and loss where the kernel has netem; else a
#     token bucket and nftables dropping 1% of packets): the same bits;
#   - machine 1's worker stopped (SIGSTOP): its launcher ends it within --timeout,
#     naming it (exit 124), though no rank of its own waits on it;
#   - every process of machine 1 killed: machine 0's ranks end naming it.
# Prints the measured times (bench/RESULTS.md has them).
set -euo pipefail
: "${DP_TRAIN:?path to dp-train}"
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
source "$here/machines_lib.sh"
machines_up 2
export FANOUT_RDZV_PASSWORD="pw-$RANDOM$RANDOM"
start_redis "$FANOUT_RDZV_PASSWORD"
timeout_s=8
run=(--model mlp --data synthetic:4800 --epochs 3 --batch-size 48 --lr-schedule constant --seed 7 --progress off
     --workers 0 --split-invariant)
common=("${run[@]}" --timeout "$timeout_s" --strategy ddp --nnodes 2 --rdzv "redis:${m_addr[0]}:6379")
"$DP_TRAIN" "${run[@]}" --devices cpu --save-dir "$work/one" > "$work/one.log" 2>&1 ||
  { cat "$work/one.log"; fail "the one-device run failed"; }
ref="$work/one/epoch-0003.safetensors"

node_timeout=300  # start(): the faults wait out --timeout more than once
both_ok() {  # both_ok NAME PID0 PID1: exit 0 on both machines and one device's bits
  local name=$1
  await "$2" 300
  local rc0=$rc
  await "$3" 300
  [ "$rc0" = 0 ] && [ "$rc" = 0 ] || { tail -n 5 "$work/$name".*.log; fail "$name: nodes exited $rc0 and $rc"; }
  python3 "$here/same_tensors.py" "$ref" "$work/$name.0/epoch-0003.safetensors" || fail "$name: differs from one device"
}
now() { date +%s.%N; }
# Only Redis may be left on machine 0 and nothing on machine 1 after a failed run.
nothing_left() {
  local left
  left=$(for m in 0 1; do for p in $(ip netns pids "${m_ns[m]}"); do cat "/proc/$p/comm" 2> /dev/null; done; done |
         grep -v redis-server || true)
  [ -z "$left" ] || fail "$1: still running after the failure: $left"
}
epoch_time() { awk '/^epoch 2\/3/ {for (i = 1; i < NF; i++) if ($(i + 1) == "s") print $i}' "$1"; }

# --- the link cut mid-run, then restored and resumed
start cut 0 --devices cpu --save-every-steps 20
c0=$started
start cut 1 --devices cpu --save-every-steps 20
c1=$started
wait_for 120 grep -q "^epoch 1/" "$work/cut.0.log" || { tail -n 3 "$work"/cut.*.log; fail "cut: no epoch finished"; }
# Into epoch 2, past a checkpoint inside it.
wait_for 120 compgen -G "$work/cut.0/epoch-0001-batch-*.safetensors" || fail "cut: no checkpoint inside epoch 2"
t_cut=$(now)
link_down 1
await "$c0" $((timeout_s + 30))
rc0=$rc t0=$(now)
await "$c1" $((timeout_s + 30))
rc1=$rc t1=$(now)
[ "$rc0" != 0 ] && [ "$rc1" != 0 ] || fail "cut: exits $rc0 and $rc1 after the link went down"
ended=$(python3 -c "print(f'{max($t0, $t1) - $t_cut:.2f}')")
echo "link cut: every rank ended ${ended} s after the cut (--timeout $timeout_s)"
python3 -c "import sys; sys.exit(not $ended <= $timeout_s + 3)" || fail "cut: the ranks ended ${ended} s after the cut"
grep -q "lost the machine at ${m_addr[1]} (rank 1)" "$work/cut.0.log" ||
  { tail -n 3 "$work/cut.0.log"; fail "cut: machine 0 does not name the machine it lost"; }
grep -q "lost the machine at ${m_addr[0]} (rank 0): Network is unreachable" "$work/cut.1.log" ||
  { tail -n 3 "$work/cut.1.log"; fail "cut: machine 1 does not name the machine it lost"; }
grep "lost the machine" "$work"/cut.*.log
nothing_left cut
link_up 1
wait_for 10 on 1 ping -c 1 -W 1 "${m_addr[0]}" || fail "the link did not come back"
start cut 0 --devices cpu --save-every-steps 20 --resume "$work/cut.0"
c0=$started
start cut 1 --devices cpu --save-every-steps 20 --resume "$work/cut.0"
both_ok cut "$c0" "$started"
grep "^resumed from.*batches of the next" "$work/cut.0.log" || fail "cut: the second run did not resume inside an epoch"
echo "cut: resumed and equals one device bit for bit"

# --- a slow, lossy link (lenet: a smaller model, so the slow run stays short)
small=(--model lenet --data synthetic:1920 --epochs 3 --batch-size 48 --lr-schedule constant --seed 7 --progress off
       --workers 0 --split-invariant)
"$DP_TRAIN" "${small[@]}" --devices cpu --save-dir "$work/one-small" > "$work/one-small.log" 2>&1 ||
  { cat "$work/one-small.log"; fail "the small one-device run failed"; }
ref="$work/one-small/epoch-0003.safetensors"
common=("${small[@]}" --timeout 60 --strategy ddp --nnodes 2 --rdzv "redis:${m_addr[0]}:6379")
start clean 0 --devices cpu
c0=$started
start clean 1 --devices cpu
both_ok clean "$c0" "$started"
for m in 0 1; do
  if on "$m" tc qdisc add dev eth0 root netem delay 20ms loss 1% 2> /dev/null; then
    shaping="netem delay 20ms loss 1%"
  else
    # No netem in this kernel: a 200 Mbit/s token bucket and 1% of packets dropped.
    on "$m" tc qdisc add dev eth0 root tbf rate 100mbit burst 64kb latency 50ms
    on "$m" nft -f - <<'NFT'
table inet lossy {
  chain out { type filter hook output priority 0; numgen random mod 100 == 0 counter drop; }
}
NFT
    shaping="tbf 100 Mbit/s, 1% of packets dropped (nftables; no netem in this kernel)"
  fi
done
start slow 0 --devices cpu
c0=$started
start slow 1 --devices cpu
both_ok slow "$c0" "$started"
dropped=$(on 1 nft list table inet lossy 2> /dev/null | grep -o 'packets [0-9]*' | awk '{print $2}' || true)
echo "slow link ($shaping${dropped:+; machine 1 dropped $dropped packets}): epoch $(epoch_time "$work/slow.0.log") s against $(epoch_time "$work/clean.0.log") s on the clean link; equals one device bit for bit"
[ -z "$dropped" ] || [ "$dropped" -gt 0 ] || fail "slow: no packet was dropped"
for m in 0 1; do
  on "$m" tc qdisc del dev eth0 root 2> /dev/null || true
  on "$m" nft delete table inet lossy 2> /dev/null || true
done

# --- machine 1's worker stopped (SIGSTOP): its launcher sees no rank of its own waiting, yet ends within --timeout
common=("${run[@]}" --timeout "$timeout_s" --strategy ddp --nnodes 2 --rdzv "redis:${m_addr[0]}:6379")
start stop 0 --devices cpu
s0=$started
start stop 1 --devices cpu
s1=$started
wait_for 120 grep -q "^epoch 1/" "$work/stop.0.log" || { tail -n 3 "$work"/stop.*.log; fail "stop: no epoch finished"; }
worker=$(for p in $(ip netns pids "${m_ns[1]}"); do
           [ "$(cat "/proc/$(awk '{print $4}' "/proc/$p/stat")/comm" 2> /dev/null)" = dp-train ] && echo "$p"; done)
[ -n "$worker" ] || fail "stop: no worker on machine 1"
kill -STOP $worker
await "$s1" $((2 * timeout_s + 30))
[ "$rc" = 124 ] || { tail -n 3 "$work/stop.1.log"; fail "stop: machine 1 exited $rc, not 124"; }
grep -q "rank 1 (pid $worker) is stopped (SIGSTOP or a debugger) for" "$work/stop.1.log" ||
  { tail -n 3 "$work/stop.1.log"; fail "stop: machine 1 does not name its stopped rank"; }
await "$s0" $((timeout_s + 30))
[ "$rc" != 0 ] || fail "stop: machine 0 exited 0"
echo "machine 1's worker stopped: $(grep -o 'rank 1 (pid [0-9]*) is stopped[^:]*' "$work/stop.1.log")"
nothing_left stop

# --- every process of machine 1 killed (two ranks per machine)
common=("${run[@]}" --timeout "$timeout_s" --strategy ddp --nnodes 2 --rdzv "redis:${m_addr[0]}:6379")
start kill 0 --devices cpu:2
k0=$started
start kill 1 --devices cpu:2
k1=$started
wait_for 120 grep -q "^epoch 1/" "$work/kill.0.log" || { tail -n 3 "$work"/kill.*.log; fail "kill: no epoch finished"; }
t_kill=$(now)
for p in $(ip netns pids "${m_ns[1]}"); do kill -9 "$p" 2> /dev/null || true; done
await "$k0" $((timeout_s + 30))
[ "$rc" != 0 ] || fail "kill: machine 0 exited 0 after machine 1 was killed"
ended=$(python3 -c "print(f'{$(now) - $t_kill:.2f}')")
grep -q "lost the machine at ${m_addr[1]} (ranks 2, 3)" "$work/kill.0.log" ||
  { tail -n 3 "$work/kill.0.log"; fail "kill: machine 0 does not name machine 1"; }
echo "machine 1 killed: machine 0 ended ${ended} s later: $(grep -o 'lost the machine.*' "$work/kill.0.log" | head -1)"
nothing_left kill
echo "machines faults e2e: ok"
