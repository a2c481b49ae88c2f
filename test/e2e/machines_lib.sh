# Sourced after lib.sh by the tests of several machines: builds N "machines"
# on this host as network namespaces, each with loopback and one interface
# eth0 (10.77.0.(I+1)/24) on a bridge that lives in a namespace of its own,
# so nothing is added to the host's network stack. On any exit every process
# inside them is killed, they are deleted, and the exit fails if a namespace,
# link or process of this test is left. A kernel or user that cannot make
# namespaces skips the test (77), except under CI=true, where it fails.
#
#   machines_up N           m_ns[I] (namespace), m_addr[I] (address)
#   on I CMD...             runs CMD on machine I
#   link_down I / link_up I cuts or restores machine I's link
# The rendezvous is a redis-server (start_redis): without one the test skips.
command -v ip > /dev/null || { echo "ip (Debian package iproute2) is not installed: skipped"; exit 77; }
command -v redis-server > /dev/null || { echo "redis-server is not installed (Debian package redis-server): skipped"; exit 77; }
m_prefix="fo$$x${RANDOM}"
m_ns=()
m_addr=()

machines_skip() {
  if [ "${CI:-}" = true ]; then fail "cannot build network namespaces under CI=true: $*"; fi
  echo "cannot build network namespaces ($*): skipped"
  exit 77
}

machines_up() {
  local n=$1 i sw="${m_prefix}sw"
  [ "$(id -u)" = 0 ] || machines_skip "not root"
  ip netns add "$sw" 2> "$work/netns.err" || machines_skip "$(head -1 "$work/netns.err")"
  ip netns exec "$sw" ip link add br0 type bridge
  ip netns exec "$sw" ip link set br0 up
  for ((i = 0; i < n; i++)); do
    m_ns[i]="${m_prefix}m$i"
    m_addr[i]="10.77.0.$((i + 1))"
    ip netns add "${m_ns[i]}"
    # Made inside the machine, the peer moved into the switch: the host's stack never holds either end.
    ip netns exec "${m_ns[i]}" ip link add eth0 type veth peer name "p$i" netns "$sw"
    ip netns exec "$sw" ip link set "p$i" master br0
    ip netns exec "$sw" ip link set "p$i" up
    ip netns exec "${m_ns[i]}" ip addr add "${m_addr[i]}/24" dev eth0
    ip netns exec "${m_ns[i]}" ip link set eth0 up
    ip netns exec "${m_ns[i]}" ip link set lo up
  done
  for ((i = 1; i < n; i++)); do
    wait_for 10 on "$i" ping -c 1 -W 1 "${m_addr[0]}" || fail "machine $i cannot reach machine 0"
  done
}

# start_redis PASSWORD: redis-server on machine 0's address, port 6379, requiring
# PASSWORD, its configuration on standard input (no password on a command
# line, as the README does); waits until machine 1 reaches it.
start_redis() {
  printf 'bind %s\nport 6379\nrequirepass %s\nsave ""\nappendonly no\ndir %s\n' "${m_addr[0]}" "$1" "$work" |
    on 0 redis-server - > "$work/redis.log" 2>&1 &
  wait_for 10 on 1 redis-cli -h "${m_addr[0]}" -a "$1" --no-auth-warning ping || fail "redis-server did not start"
}

# start NAME MACHINE ARGS...: dp-train ("${common[@]}" ARGS) as node MACHINE of run NAME in the
# background, killed after ${node_timeout:-200} s; its pid in $started and appended to pids.
start() {
  local name=$1 m=$2
  shift 2
  on "$m" timeout "${node_timeout:-200}" "$DP_TRAIN" "${common[@]}" --node-rank "$m" --run-id "$name" \
    --save-dir "$work/$name.$m" "$@" > "$work/$name.$m.log" 2>&1 &
  started=$!
  pids+=("$started")
}

on() {
  local i=$1
  shift
  ip netns exec "${m_ns[i]}" "$@"
}
link_down() { ip netns exec "${m_ns[$1]}" ip link set eth0 down; }
link_up() { ip netns exec "${m_ns[$1]}" ip link set eth0 up; }

# The namespaces of this test (the machines and the switch).
machines_list() { ip netns list 2> /dev/null | awk '{print $1}' | grep "^${m_prefix}" || true; }

# Kills every process inside the machines, then deletes them; m_left names
# the processes still there after 5 s.
m_left=""
machines_down() {
  local ns pid
  for ns in $(machines_list); do
    for pid in $(ip netns pids "$ns" 2> /dev/null); do kill -9 "$pid" 2> /dev/null || true; done
  done
  for ns in $(machines_list); do
    for _ in $(seq 1 50); do
      [ -z "$(ip netns pids "$ns" 2> /dev/null)" ] && break
      sleep 0.1
    done
    for pid in $(ip netns pids "$ns" 2> /dev/null); do m_left+=" $pid ($(cat "/proc/$pid/comm" 2> /dev/null))"; done
    ip netns del "$ns" 2> /dev/null || true
  done
}

machines_cleanup() {
  local rc=$?
  machines_down
  cleanup
  local left
  left=$(machines_list)
  if [ -n "$left" ]; then
    echo "FAIL: network namespaces left behind: $left"
    rc=1
  fi
  if [ -n "$m_left" ]; then
    echo "FAIL: processes left in the machines:$m_left"
    rc=1
  fi
  if ip -o link show 2> /dev/null | grep -q "${m_prefix}"; then
    echo "FAIL: links left behind in the host's namespace"
    rc=1
  fi
  exit "$rc"
}
trap machines_cleanup EXIT
