#!/usr/bin/env bash
# e2e: dp-train as the worker of outside launchers, in the forms the README
# documents (between its "launchers" markers):
# - Open MPI's mpirun -np 2 with FANOUT_RDZV exported by -x (a real outside
#   launcher), and two workers given the environments torchrun and srun set
#   (torch and Slurm are not installed here): each run's metrics and final
#   checkpoint equal dp-train's own launcher's (--strategy ddp), bit for bit.
# - The README's torchrun line parses with Python's argparse under
#   torchrun's option names (training script and its arguments intact), and
#   the same line with --rdzv in the worker's arguments fails there, as
#   torchrun fails on it.
# - A rank started with another --batch-size: both ranks end at start-up,
#   well within --timeout + 10 s, each with one line naming the difference.
set -euo pipefail
: "${DP_TRAIN:?path to dp-train}"
README=${README:-$(dirname "${BASH_SOURCE[0]}")/../../README.md}
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$work"
command -v mpirun > /dev/null || fail "mpirun not found: apps/setup.sh installs openmpi-bin"

args=(--model lenet --data synthetic:480 --epochs 2 --batch-size 48 --seed 3 --progress off --workers 0
      --strategy ddp --devices cpu:2 --timeout 60)
run() {  # name command...
  local name=$1
  shift
  timeout 300 "$@" "${args[@]}" --metrics "$work/$name.jsonl" --save-dir "$work/$name" > "$work/$name.out" 2>&1 ||
    { echo "run $name failed:"; cat "$work/$name.out"; exit 1; }
}

run own "$DP_TRAIN"
run mpirun mpirun --allow-run-as-root --oversubscribe -np 2 -x FANOUT_RDZV="file:$work/rdzv-mpi" "$DP_TRAIN"

# What torchrun and srun give each worker: its rank and world in the environment.
# The rendezvous as the README gives it: FANOUT_RDZV for torchrun, --rdzv for srun.
by_env() {  # name how(env|flag) rdzv-dir env-of-rank-0... -- env-of-rank-1...
  local name=$1 how=$2 dir=$3
  shift 3
  local env0=() env1=() rdzv=()
  while [ "$1" != "--" ]; do env0+=("$1"); shift; done
  shift
  env1=("$@")
  if [ "$how" = env ]; then env0+=("FANOUT_RDZV=file:$dir"); env1+=("FANOUT_RDZV=file:$dir"); else rdzv=(--rdzv "file:$dir"); fi
  env "${env0[@]}" timeout 300 "$DP_TRAIN" "${args[@]}" "${rdzv[@]}" --metrics "$work/$name.jsonl" \
    --save-dir "$work/$name" > "$work/$name.out" 2>&1 &
  local p0=$!
  pids+=("$p0")
  env "${env1[@]}" timeout 300 "$DP_TRAIN" "${args[@]}" "${rdzv[@]}" --metrics "$work/$name.jsonl" \
    --save-dir "$work/$name" > "$work/$name-1.out" 2>&1 &
  local p1=$!
  pids+=("$p1")
  wait "$p0" || { cat "$work/$name.out"; fail "$name: rank 0 failed"; }
  wait "$p1" || { cat "$work/$name-1.out"; fail "$name: rank 1 failed"; }
  pids=()  # both gone: nothing left for the cleanup to kill
}
by_env torchrun env "$work/rdzv-torchrun" RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=2 TORCHELASTIC_RUN_ID=t1 -- \
  RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 LOCAL_WORLD_SIZE=2 TORCHELASTIC_RUN_ID=t1
by_env srun flag "$work/rdzv-srun" SLURM_PROCID=0 SLURM_NTASKS=2 SLURM_LOCALID=0 SLURM_NTASKS_PER_NODE=2 SLURM_JOB_ID=7 -- \
  SLURM_PROCID=1 SLURM_NTASKS=2 SLURM_LOCALID=1 SLURM_NTASKS_PER_NODE=2 SLURM_JOB_ID=7

# Rank 1 with another --batch-size, or another --lr (the environment torchrun gives): both ranks end naming it.
mismatch=(--model lenet --data synthetic:480 --epochs 1 --seed 3 --progress off --workers 0 --strategy ddp
          --devices cpu:2 --timeout 20)
mismatched() {  # mismatched NAME WANT RANK0-OPTIONS RANK1-OPTIONS (WANT: rank 1's error after "rank 1 ")
  local name=$1 want=$2 t0 m0 m1 rc0=0 rc1=0 rc elapsed i
  t0=$(date +%s)
  env RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=2 FANOUT_RDZV="file:$work/rdzv-$name" \
    timeout 120 "$DP_TRAIN" "${mismatch[@]}" $3 > "$work/$name-0.out" 2>&1 &
  m0=$!
  env RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 LOCAL_WORLD_SIZE=2 FANOUT_RDZV="file:$work/rdzv-$name" \
    timeout 120 "$DP_TRAIN" "${mismatch[@]}" $4 > "$work/$name-1.out" 2>&1 &
  m1=$!
  pids+=("$m0" "$m1")
  wait "$m0" || rc0=$?
  wait "$m1" || rc1=$?
  pids=()
  elapsed=$(( $(date +%s) - t0 ))
  for i in 0 1; do
    rc=$([ $i = 0 ] && echo $rc0 || echo $rc1)
    [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || { cat "$work/$name-$i.out"; fail "$name: mismatched rank $i: exit $rc"; }
    grep -qF "dp-train: error: rank 1 $want" \
      "$work/$name-$i.out" || { cat "$work/$name-$i.out"; fail "$name: rank $i does not name it"; }
    [ "$(grep -c 'error' "$work/$name-$i.out")" -eq 1 ] || { cat "$work/$name-$i.out"; fail "$name: rank $i: more than one error line"; }
  done
  [ "$elapsed" -le 30 ] || fail "$name: the mismatched ranks took ${elapsed} s (--timeout 20)"
  echo "a rank with another $name: both ranks end in ${elapsed} s naming it"
}
same="(every rank must run the same model and options)"
mismatched batch "has batch size 96 where rank 0 has 48 $same" "--batch-size 48" "--batch-size 96"
mismatched lr "has --lr 0.5 where rank 0 has 0.02 $same" "--batch-size 48 --lr 0.02" "--batch-size 48 --lr 0.5"
mismatched savedir "has no save directory (--save-dir, or --resume DIR) where rank 0 has one $same" \
  "--batch-size 48 --save-dir $work/savedir-0" "--batch-size 48"
mismatched evalevery "has --eval-every 2 where rank 0 has 0 $same" "--batch-size 48" "--batch-size 48 --eval-every 2"
mismatched droplast "has --drop-last 1 where rank 0 has 0 $same" "--batch-size 48" "--batch-size 48 --drop-last"
# Ranks resuming different checkpoints (a machine given a stale copy of the save directory).
timeout 120 "$DP_TRAIN" --model lenet --data synthetic:480 --epochs 1 --seed 3 --progress off --workers 0 --devices cpu \
  --batch-size 48 --save-dir "$work/two-epochs" --save-every-steps 5 --keep-last 9 > "$work/two-epochs.out" 2>&1 ||
  { cat "$work/two-epochs.out"; fail "the run to resume failed"; }
mismatched resume "resumed after 0 epochs and 5 batches (step 5) where rank 0 resumed after 1 epoch and 0 batches \
(step 10): every rank must resume the same checkpoint" "--batch-size 48 --resume $work/two-epochs/epoch-0001.safetensors" \
  "--batch-size 48 --resume $work/two-epochs/epoch-0000-batch-0000005.safetensors"

python3 - "$work" <<'PY'
import json, sys
from safetensors.numpy import load_file
work = sys.argv[1]
keys = ("epoch", "train_loss", "train_acc", "test_loss", "test_acc", "lr")
def metrics(name):
    return [{k: r[k] for k in keys} for r in map(json.loads, open(f"{work}/{name}.jsonl"))]
own = metrics("own")
assert len(own) == 2, own
ref = load_file(f"{work}/own/epoch-0002.safetensors")
for name in ("mpirun", "torchrun", "srun"):
    assert metrics(name) == own, (name, metrics(name), own)
    got = load_file(f"{work}/{name}/epoch-0002.safetensors")
    assert sorted(got) == sorted(ref)
    for k in ref:
        assert got[k].tobytes() == ref[k].tobytes(), f"{name}: {k} differs from dp-train's own launcher"
print(f"mpirun, torchrun's and srun's environments == dp-train's launcher: metrics {own[-1]}, checkpoint bit for bit")
PY

# The README's torchrun line through argparse with torchrun's options (the
# names of torch.distributed.run's parser; a trailing script and REMAINDER).
python3 - "$README" <<'PY'
import argparse, re, shlex, sys
text = open(sys.argv[1]).read()
block = text.split("<!-- launchers begin -->", 1)[1].split("<!-- launchers end -->", 1)[0]
line = next(l for l in block.splitlines() if " torchrun " in f" {l} ")
words = shlex.split(line)
words = words[next(i for i, w in enumerate(words) if w == "torchrun") + 1:]
names = ["nnodes", "nproc-per-node", "rdzv-backend", "rdzv-endpoint", "rdzv-id", "rdzv-conf", "max-restarts",
         "monitor-interval", "start-method", "event-log-handler", "role", "log-dir", "redirects", "tee",
         "log-line-prefix-template", "local-ranks-filter", "duplicate-stdout-filters", "duplicate-stderr-filters",
         "node-rank", "master-addr", "master-port", "local-addr", "logs-specs", "numa-binding", "signals-to-handle",
         "shutdown-timeout", "print-completion"]
switches = ["standalone", "module", "no-python", "run-path", "virtual-local-rank"]
class Refused(Exception):
    pass
class Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's way out, as torchrun's exit with status 2
        raise Refused(message)
def parser():
    p = Parser(prog="torchrun")
    for n in names:
        p.add_argument(f"--{n}", f"--{n.replace('-', '_')}" if "-" in n else f"--{n}x")
    for n in switches:
        p.add_argument(f"--{n}", f"--{n.replace('-', '_')}" if "-" in n else f"--{n}x", action="store_true")
    p.add_argument("training_script")
    p.add_argument("training_script_args", nargs=argparse.REMAINDER)
    return p
def parse(argv):
    try:
        return parser().parse_args(argv), None
    except Refused as e:
        return None, e
a, err = parse(words)
assert err is None, f"the README's torchrun line does not parse: {err}"
assert a.no_python and a.training_script == "dp-train" and "--strategy" in a.training_script_args, a
a, err = parse(words + ["--rdzv", "file:/tmp/rdzv"])
assert err is not None and "ambiguous" in str(err), f"--rdzv after the script should fail as in torchrun: {a}"
print("README torchrun line parses under torchrun's options; --rdzv in it would not:", str(err).strip())
PY
