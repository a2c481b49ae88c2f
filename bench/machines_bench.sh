#!/usr/bin/env bash
# Bytes per step between two machines (network namespaces of this host, as the
# e2e tests build them; root): DDP with two processes per machine against the
# hybrid (one process of DataParallel cpu:2 per machine), both on the same
# global batch. Counts machine 1's eth0 (received + sent) over a run of one
# epoch and of two; their difference over one epoch's steps is the traffic of
# a step, with the start (rendezvous, parameter broadcast) and the end
# (evaluation, shutdown) taken out.
#   bash bench/machines_bench.sh [DP_TRAIN] [MODEL]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
DP_TRAIN=${1:-$here/../build/apps/dp-train}
model=${2:-mlp}
source "$here/../test/e2e/lib.sh"
source "$here/../test/e2e/machines_lib.sh"
machines_up 2
export FANOUT_RDZV_PASSWORD="pw-$RANDOM$RANDOM"
start_redis "$FANOUT_RDZV_PASSWORD"
samples=4800 batch=48
steps=$((samples / batch))
counter() {  # machine 1's eth0: bytes received + sent
  local v
  mapfile -t v < <(on 1 cat /sys/class/net/eth0/statistics/rx_bytes /sys/class/net/eth0/statistics/tx_bytes)
  echo $((v[0] + v[1]))
}
run=0
bytes() {  # bytes EPOCHS ARGS...: machine 1's traffic over one run, in $traffic
  local epochs=$1 before m
  shift
  run=$((run + 1))
  before=$(counter)
  for m in 0 1; do
    on "$m" "$DP_TRAIN" --model "$model" --data "synthetic:$samples" --epochs "$epochs" --batch-size "$batch" \
      --progress off --workers 0 --strategy ddp --nnodes 2 --node-rank "$m" --rdzv "redis:${m_addr[0]}:6379" \
      --run-id "bench$run" "$@" > "$work/run$run.$m.log" 2>&1 &
    pids+=($!)
  done
  wait "${pids[-1]}" && wait "${pids[-2]}" || { tail -n 3 "$work"/run$run.*.log; fail "run $run failed"; }
  traffic=$(($(counter) - before))
  echo "  run $run ($epochs epoch(s), $*): $traffic bytes through machine 1's link" >&2
}
params=$("$DP_TRAIN" --model "$model" --data synthetic:96 --epochs 1 --progress off --workers 0 --devices cpu |
         sed -n 's/.*model [^ ]* (\([0-9]*\) parameters).*/\1/p')
echo "model $model: $params parameters, $((params * 4)) bytes of float32 gradients; $steps steps an epoch"
for config in "ddp, 2 processes per machine|--devices cpu:2" "hybrid, DataParallel cpu:2 per machine|--devices cpu:2 --nproc-per-node 1"; do
  name=${config%%|*}
  read -r -a args <<< "${config#*|}"
  bytes 1 "${args[@]}"
  one=$traffic
  bytes 2 "${args[@]}"
  two=$traffic
  per_step=$(((two - one) / steps))
  printf '%-40s %12d bytes a step between the machines (%.2fx the gradients)\n' "$name" "$per_step" \
    "$(awk "BEGIN {print $per_step / ($params * 4)}")"
done
