#!/usr/bin/env bash
# e2e: a save directory belongs to one run, and nothing is lost silently.
# - A second run on a held --save-dir exits before training with one line
#   naming the holder; the first run's checkpoints are its own.
# - A run killed with SIGKILL does not block the next one (the kernel drops
#   the lock), and the temporaries a run that died while saving left
#   behind are removed by the next run on the directory.
# - A fresh run into a directory holding another run's checkpoints is
#   refused unless --resume (continue it) or --overwrite (replace them, at
#   its training's start: a run refused before it removes nothing).
# - A read-only --save-dir is refused before training.
# - A metrics file that cannot be written (/dev/full) is an error, and the
#   epoch's checkpoint is saved before it.
set -uo pipefail
: "${DP_TRAIN:?path to dp-train}"
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
train() { timeout 300 "$DP_TRAIN" --progress off --model lenet --devices cpu --data synthetic:2048 "$@"; }

# 1. Two runs, one directory.
# Started directly (not under timeout) so that $! is dp-train itself; killed below.
"$DP_TRAIN" --progress off --model lenet --devices cpu --data synthetic:2048 --epochs 100000 --seed 1 \
  --save-dir "$work/same" > "$work/a.out" 2>&1 &
a=$!
pids+=("$a")
for _ in $(seq 1 300); do
  grep -q "pid $a" "$work/same/.fanout.lock" 2> /dev/null && break
  sleep 0.1
done
grep -q "pid $a" "$work/same/.fanout.lock" || fail "the first run did not take the lock"
if train --epochs 2 --seed 2 --save-dir "$work/same" > "$work/b.out" 2> "$work/b.err"; then
  fail "a second run on a held save directory succeeded"
fi
[ "$(wc -l < "$work/b.err")" -eq 1 ] || { cat "$work/b.err"; fail "not one line"; }
grep -q "is in use by another run (pid $a, since .*dp-train" "$work/b.err" || { cat "$work/b.err"; fail "holder not named"; }
! grep -q "^epoch" "$work/b.out" || fail "the second run trained before refusing"
echo "ok   second run refused: $(cat "$work/b.err")"

# 2. SIGKILL, then a temporary a dead save left: the next run starts and cleans up.
kill -9 "$a"
wait "$a" 2> /dev/null
touch "$work/same/epoch-0007.safetensors.tmp.999999"
touch "$work/same/epoch-0009.safetensors"  # and a checkpoint of that run, whatever it had written
train --epochs 1 --seed 2 --save-dir "$work/same" > "$work/c0.out" 2> "$work/c0.err" &&
  fail "a fresh run into another run's checkpoints was accepted"
[ "$(wc -l < "$work/c0.err")" -eq 1 ] || { cat "$work/c0.err"; fail "not one line"; }
grep -q "holds another run's checkpoints (epoch-0009.safetensors.*): continue it with --resume $work/same, or start over with --overwrite" \
  "$work/c0.err" || { cat "$work/c0.err"; fail "message"; }
[ -e "$work/same/epoch-0009.safetensors" ] || fail "the refused run removed the other run's checkpoint"
echo "ok   a fresh run into another run's checkpoints refused: $(cat "$work/c0.err")"
# --overwrite removes them when training starts: a run refused before it removes nothing.
train --epochs 1 --seed 2 --save-dir "$work/same" --overwrite --init-from "$work/missing.safetensors" > /dev/null \
  2> "$work/c1.err" && fail "a missing --init-from was accepted"
grep -q "missing.safetensors" "$work/c1.err" || { cat "$work/c1.err"; fail "--init-from message"; }
[ -e "$work/same/epoch-0009.safetensors" ] || fail "a refused --overwrite run removed the other run's checkpoint"
train --epochs 1 --seed 2 --save-dir "$work/same" --overwrite > "$work/c.out" 2> "$work/c.err" ||
  { cat "$work/c.out" "$work/c.err"; fail "a run after a killed one did not start"; }
grep -q "[0-9]* checkpoints* of an earlier run in $work/same \(is\|are\) removed when training starts (--overwrite)" "$work/c.out" ||
  { cat "$work/c.out"; fail "no --overwrite line"; }
[ ! -e "$work/same/epoch-0009.safetensors" ] || fail "--overwrite left the other run's epoch-0009"
grep -q "removed 1 temporary file a run that died while saving left in" "$work/c0.out" || { cat "$work/c0.out"; fail "no removal line"; }
[ ! -e "$work/same/epoch-0007.safetensors.tmp.999999" ] || fail "the temporary is still there"
[ -e "$work/same/epoch-0001.safetensors" ] || fail "no checkpoint from the run after the kill"
echo "ok   the lock dies with its process; temporaries removed"

# 3. A read-only save directory (as another user when root, whom permissions do not stop).
mkdir -p "$work/ro"
chmod 555 "$work/ro"
as_user=()
if [ "$(id -u)" -eq 0 ]; then
  as_user=(setpriv --reuid=65534 --regid=65534 --clear-groups)
  chmod 755 "$work"  # that user must reach the directory to find it read-only
fi
if "${as_user[@]}" timeout 120 "$DP_TRAIN" --progress off --model lenet --devices cpu --data synthetic:256 \
  --epochs 1 --save-dir "$work/ro" > "$work/ro.out" 2> "$work/ro.err"; then
  fail "a read-only save directory was accepted"
fi
[ "$(wc -l < "$work/ro.err")" -eq 1 ] || { cat "$work/ro.err"; fail "not one line"; }
grep -q "cannot write to checkpoint directory $work/ro: Permission denied" "$work/ro.err" || { cat "$work/ro.err"; fail "message"; }
! grep -q "^epoch" "$work/ro.out" || fail "trained before refusing the read-only directory"
echo "ok   read-only save dir refused before training: $(cat "$work/ro.err")"

# 4. Metrics that cannot be written: an error, after the epoch's checkpoint.
if train --epochs 2 --metrics /dev/full --save-dir "$work/full" > "$work/full.out" 2> "$work/full.err"; then
  fail "metrics to /dev/full exited 0"
fi
[ "$(wc -l < "$work/full.err")" -eq 1 ] || { cat "$work/full.err"; fail "not one line"; }
grep -q "cannot write metrics file /dev/full: No space left on device" "$work/full.err" || { cat "$work/full.err"; fail "message"; }
[ -e "$work/full/epoch-0001.safetensors" ] || fail "the epoch's checkpoint was lost with the metrics"
echo "ok   metrics write failure: $(cat "$work/full.err")"
# 5. A resume from a checkpoint that later ones follow in its --save-dir: refused (the next --resume DIR
#    would take them over this run's), or, with --overwrite, those removed first.
small() { timeout 300 "$DP_TRAIN" --progress off --model mlp --devices cpu --data synthetic:64 "$@"; }
small --epochs 3 --keep-last 5 --save-dir "$work/back" > /dev/null
if small --epochs 3 --resume "$work/back/epoch-0001.safetensors" --save-dir "$work/back" > "$work/back.out" \
  2> "$work/back.err"; then
  fail "a resume behind later checkpoints was accepted"
fi
grep -q "holds checkpoints past $work/back/epoch-0001.safetensors ($work/back/epoch-0003.safetensors and 1 more)" \
  "$work/back.err" || { cat "$work/back.err"; fail "message"; }
timeout 300 "$DP_TRAIN" --progress off --model lenet --devices cpu --data synthetic:64 --epochs 3 --overwrite \
  --resume "$work/back/epoch-0001.safetensors" --save-dir "$work/back" > /dev/null 2> "$work/back1.err" &&
  fail "a resume with another --model was accepted"
[ -e "$work/back/epoch-0002.safetensors" ] && [ -e "$work/back/epoch-0003.safetensors" ] ||
  { cat "$work/back1.err"; fail "a refused --overwrite resume removed the later checkpoints"; }
small --epochs 3 --resume "$work/back/epoch-0001.safetensors" --save-dir "$work/back" --overwrite > "$work/back2.out" ||
  fail "--overwrite did not resume"
grep -q "2 checkpoints past $work/back/epoch-0001.safetensors in $work/back are removed when training starts" \
  "$work/back2.out" || { cat "$work/back2.out"; fail "removed"; }
grep -q "resumed from $work/back/epoch-0001.safetensors" "$work/back2.out" || fail "did not resume from epoch 1"
echo "ok   resume behind later checkpoints: $(cat "$work/back.err")"
# 6. The newest checkpoint of a directory damaged (cut short): --resume DIR names the way back, which works.
small --epochs 2 --save-dir "$work/cut" > /dev/null
truncate -s 1000 "$work/cut/epoch-0002.safetensors"
for extra in "" "--max-steps 8"; do  # --max-steps alone reads the checkpoint earlier, for the epochs it takes
  if small --epochs 3 $extra --resume "$work/cut" > "$work/cut.out" 2> "$work/cut.err"; then
    fail "a damaged newest checkpoint was resumed ($extra)"
  fi
  [ "$(wc -l < "$work/cut.err")" -eq 1 ] &&
    grep -qF "$work/cut/epoch-0002.safetensors: header length" "$work/cut.err" &&
    grep -qF "(to continue from an earlier checkpoint: --resume $work/cut/epoch-NNNN.safetensors --save-dir $work/cut --overwrite" \
      "$work/cut.err" || { cat "$work/cut.err"; fail "no way back named ($extra)"; }
done
small --epochs 3 --resume "$work/cut/epoch-0001.safetensors" --save-dir "$work/cut" --overwrite > "$work/cut2.out" ||
  fail "the way back did not resume"
[ -e "$work/cut/epoch-0003.safetensors" ] || fail "the way back saved nothing"
echo "ok   a damaged newest checkpoint: $(cat "$work/cut.err")"
# 7. --metrics /dev/stdout into a pipe: the lines come out, and a resume, which rewrites a metrics file,
#    leaves a stream alone (reading it would wait for this very process).
small --epochs 1 --save-dir "$work/stream" --metrics /dev/stdout 2> "$work/stream.err" | cat > "$work/stream.out" ||
  { cat "$work/stream.err"; fail "--metrics /dev/stdout into a pipe failed"; }
grep -q '^{.*"epoch":1,' "$work/stream.out" || { cat "$work/stream.out"; fail "no metrics line on stdout"; }
timeout 120 "$DP_TRAIN" --progress off --model mlp --devices cpu --data synthetic:64 --epochs 2 --resume "$work/stream" \
  --metrics /dev/stdout 2> "$work/stream.err" | cat > "$work/stream2.out"
[ "${PIPESTATUS[0]}" = 0 ] || { cat "$work/stream.err"; fail "a resume with --metrics /dev/stdout did not finish"; }
grep -q '^{.*"epoch":2,' "$work/stream2.out" || { cat "$work/stream2.out"; fail "no epoch 2 line after the resume"; }
echo "ok   --metrics /dev/stdout, resumed too"
echo "save-dir e2e: ok"
