#!/usr/bin/env bash
# e2e: DDP between machines, each a network namespace of this host (machines_lib.sh),
# meeting through a redis-server inside machine 0 bound to its address only and
# started with a password (requirepass). Each run must end bit for bit as one
# device (--split-invariant):
#   - one process per machine (--iface eth0, the password from a file), two per
#     machine (no --iface: the interface that reaches Redis), and the hybrid
#     (DataParallel cpu:2 inside each machine, DDP across them);
#   - Gloo listens on the machine's address only, never on every address;
#   - a missing or wrong password is one line before any training; the password
#     appears on no command line;
#   - two jobs share the Redis server with their own --run-id, side by side;
#   - a stranger on a third machine connects to every port the ranks use mid-run,
#     sends garbage or stays silent: the run neither fails nor changes.
set -euo pipefail
: "${DP_TRAIN:?path to dp-train}"
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
source "$here/machines_lib.sh"
machines_up 3  # 0 and 1 train; 2 is the stranger
secret="pw-$RANDOM$RANDOM$RANDOM"
printf '%s\n' "$secret" > "$work/password"
start_redis "$secret"
[ "$(on 1 redis-cli -h "${m_addr[0]}" ping 2>&1)" != PONG ] || fail "Redis answers without the password"
rdzv="redis:${m_addr[0]}:6379"

common=(--model mlp --data synthetic:4800 --epochs 3 --batch-size 48 --lr-schedule constant --seed 5 --progress off
        --workers 0 --split-invariant --timeout 60 --strategy ddp --nnodes 2 --rdzv "$rdzv")
"$DP_TRAIN" --model mlp --data synthetic:4800 --epochs 3 --batch-size 48 --lr-schedule constant --seed 5 --progress off \
  --workers 0 --split-invariant --devices cpu --save-dir "$work/one" > "$work/one.log" 2>&1 ||
  { cat "$work/one.log"; fail "the one-device run failed"; }
ref="$work/one/epoch-0003.safetensors"

# finish NAME PID0 PID1: both nodes exit 0 and rank 0's checkpoint equals one device's.
finish() {
  local name=$1
  await "$2" 200
  local rc0=$rc
  await "$3" 200
  [ "$rc0" = 0 ] && [ "$rc" = 0 ] || { tail -n 5 "$work/$name".*.log; fail "$name: nodes exited $rc0 and $rc"; }
  python3 "$here/same_tensors.py" "$ref" "$work/$name.0/epoch-0003.safetensors" ||
    fail "$name: the run across machines differs from one device"
  echo "$name: equals one device bit for bit"
}

# One process per machine, on the named interface, the password from a file.
# Machine 0 drops new connections but Redis's while both meet: node 0's listening sockets (made
# once every rank has joined) are there to inspect until the rule goes and node 1 connects.
unset FANOUT_RDZV_PASSWORD
on 0 nft -f - <<'NFT'
table inet hold {
  chain in { type filter hook input priority 0; policy accept; tcp dport != 6379 tcp flags & (syn | ack) == syn drop; }
}
NFT
start nodes1 0 --devices cpu --iface eth0 --rdzv-password-file "$work/password"
p0=$started
start nodes1 1 --devices cpu --iface eth0 --rdzv-password-file "$work/password"
p1=$started
wait_for 30 bash -c "ip netns exec ${m_ns[0]} ss -ltnpH | grep -q dp-train" || fail "node 0 never listened"
listening=$(on 0 ss -ltnpH | grep dp-train | awk '{print $4}')
echo "node 0 listens on: $listening"
on 0 nft delete table inet hold
! grep -vq "^${m_addr[0]}:" <<< "$listening" || fail "Gloo listens beyond ${m_addr[0]}: $listening"
finish nodes1 "$p0" "$p1"
grep -q '^ddp: 2 processes (1 per machine)' "$work/nodes1.0.log" || fail "nodes1: not 2 processes of 1 per machine"

# Two processes per machine; the interface is the one that reaches Redis; the password in the environment.
export FANOUT_RDZV_PASSWORD="$secret"
start nodes2 0 --devices cpu:2
p0=$started
start nodes2 1 --devices cpu:2
p1=$started
# The password is on no command line (what ps shows) of any process of the run.
wait_for 30 bash -c "[ \$(ip netns pids ${m_ns[1]} | wc -l) -ge 4 ]" || fail "the workers of machine 1 did not start"
for ns in "${m_ns[0]}" "${m_ns[1]}"; do
  for pid in $(ip netns pids "$ns"); do
    ! tr '\0' ' ' < "/proc/$pid/cmdline" 2> /dev/null | grep -qF "$secret" || fail "the password is on process $pid's command line"
  done
done
finish nodes2 "$p0" "$p1"
grep -q '^ddp: 4 processes (2 per machine)' "$work/nodes2.0.log" || fail "nodes2: not 4 processes of 2 per machine"
# Machine 1 prints what it runs and that it finished (rank 0's machine prints the run).
grep -q '^dp-train: machine 1 of 2: ranks 2..3 of 4 (rank 0.s machine prints the run.s progress)$' "$work/nodes2.1.log" &&
  grep -q '^dp-train: machine 1 of 2: ranks 2..3 of 4: finished$' "$work/nodes2.1.log" ||
  { cat "$work/nodes2.1.log"; fail "nodes2: machine 1 does not say what it ran"; }

# The hybrid: DataParallel over cpu:2 inside each machine, DDP across them.
start hybrid 0 --devices cpu:2 --nproc-per-node 1
p0=$started
start hybrid 1 --devices cpu:2 --nproc-per-node 1
finish hybrid "$p0" "$started"
grep -q '^ddp: 2 processes (1 per machine) of 2 devices each' "$work/hybrid.0.log" || fail "hybrid: not 2 processes of 2 devices"

# A missing and a wrong password: one line each, before any worker trains.
for pw in "" wrong; do
  if [ -z "$pw" ]; then unset FANOUT_RDZV_PASSWORD; else export FANOUT_RDZV_PASSWORD=$pw; fi
  rc=0
  on 1 timeout 60 "$DP_TRAIN" "${common[@]}" --node-rank 1 --run-id bad --devices cpu > "$work/bad.out" 2> "$work/bad.err" || rc=$?
  [ "$rc" != 0 ] || fail "password '$pw': the run did not fail"
  [ "$(wc -l < "$work/bad.err")" = 1 ] || { cat "$work/bad.err"; fail "password '$pw': not one line"; }
  want="needs a password"
  [ -z "$pw" ] || want="refused the password"
  grep -q "^dp-train: error: cannot use the Redis rendezvous at ${m_addr[0]}:6379: .*$want" "$work/bad.err" ||
    { cat "$work/bad.err"; fail "password '$pw': no line saying Redis $want"; }
  ! grep -q epoch "$work/bad.out" || fail "password '$pw': training started"
  echo "password '$pw': $(cat "$work/bad.err")"
done
export FANOUT_RDZV_PASSWORD="$secret"

# Two jobs on the one Redis server at once, each with its own --run-id; meanwhile a
# stranger on machine 2 connects to every TCP port the ranks hold on machines 0 and 1.
start jobA 0 --devices cpu
a0=$started
start jobB 0 --devices cpu
b0=$started
start jobA 1 --devices cpu
a1=$started
start jobB 1 --devices cpu
b1=$started
wait_for 60 grep -q "^epoch 1/" "$work/jobA.0.log" || { tail -n 3 "$work"/job*.log; fail "jobA never finished an epoch"; }
ports=""
for m in 0 1; do
  for p in $(on "$m" ss -tanH | awk '{print $4}' | sort -u); do ports+=" $p"; done
done
echo "stranger connects to:$ports"
on 2 python3 - $ports <<'PY'
import os, socket, sys
garbage = os.urandom(1 << 16)
held = []
for target in sys.argv[1:]:
    host, port = target.rsplit(":", 1)
    for payload in (garbage, None):  # garbage and close, or connect and stay silent
        try:
            s = socket.create_connection((host, int(port)), timeout=2)
        except OSError:
            continue
        if payload:
            try:
                s.sendall(payload)
            except OSError:
                pass
            s.close()
        else:
            held.append(s)
print(f"stranger: {len(held)} silent connections held")
import time; time.sleep(3)
PY
finish jobA "$a0" "$a1"
finish jobB "$b0" "$b1"
echo "machines e2e: ok"
