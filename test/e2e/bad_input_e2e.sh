#!/usr/bin/env bash
# e2e: bad input ends with one clear line on stderr and a non-zero exit, never
# a crash, a hang or a stack of messages.
set -uo pipefail
: "${DP_TRAIN:?path to dp-train}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fails=0

# Corrupt IDX header: wrong magic in an otherwise plausible directory.
mkdir -p "$work/corrupt"
printf '\x00\x00\x08\x99\x00\x00\x00\x01\x00\x00\x00\x1c\x00\x00\x00\x1c' > "$work/corrupt/train-images-idx3-ubyte"
printf '\x00\x00\x08\x01\x00\x00\x00\x01\x00' > "$work/corrupt/train-labels-idx1-ubyte"
cp "$work/corrupt/train-images-idx3-ubyte" "$work/corrupt/t10k-images-idx3-ubyte"
cp "$work/corrupt/train-labels-idx1-ubyte" "$work/corrupt/t10k-labels-idx1-ubyte"
# Unreadable: a directory where a file should be.
mkdir -p "$work/unreadable/train-images-idx3-ubyte" "$work/unreadable/train-labels-idx1-ubyte" \
         "$work/unreadable/t10k-images-idx3-ubyte" "$work/unreadable/t10k-labels-idx1-ubyte"

expect_error() {  # expect_error NAME PATTERN ARGS... (--epochs 1 unless NO_EPOCHS=1)
  local name=$1 pattern=$2 epochs=(--epochs 1)
  shift 2
  [ -n "${NO_EPOCHS:-}" ] && epochs=()
  timeout 120 "$DP_TRAIN" --progress off "${epochs[@]}" "$@" > "$work/out" 2> "$work/err"
  local rc=$?
  local lines
  lines=$(wc -l < "$work/err")
  if [ "$rc" -eq 0 ] || [ "$rc" -ge 124 ] || [ "$lines" -ne 1 ] || ! grep -qiE -- "$pattern" "$work/err" ||
     grep -qiE "internal error|terminate|Aborted|Segmentation" "$work/err"; then
    echo "FAIL $name: exit $rc, $lines stderr line(s):"; sed 's/^/    /' "$work/err"
    fails=$((fails + 1))
  else
    echo "ok   $name (exit $rc): $(cat "$work/err")"
  fi
}

expect_error missing-dataset "does not exist|cannot open|not found" --data "fashion-mnist:$work/nowhere"
expect_error unreadable-dataset "cannot|read|directory" --data "fashion-mnist:$work/unreadable"
expect_error corrupt-idx "magic" --data "fashion-mnist:$work/corrupt"
expect_error shape-mismatch "cannot take" --model resnet18:imagenet --data fashion-mnist --batch-size 8
expect_error unknown-model "unknown model" --model vgg --data synthetic:64
expect_error unknown-heatmap-variant "unknown model 'heatmap3d:Group'" --model heatmap3d:Group --data synthetic3d:16
expect_error zero-batch "batch-size must be positive" --batch-size 0 --data synthetic:64
expect_error negative-batch "batch-size must be positive|batch" --batch-size -3 --data synthetic:64
expect_error zero-lr "lr must be positive" --lr 0 --data synthetic:64
expect_error negative-lr "lr must be positive" --lr -0.1 --data synthetic:64
expect_error unknown-flag "unrecognised|unknown" --frobnicate 3
expect_error switch-with-value "unexpected argument 'false' \(--nesterov is a switch: give it alone" --nesterov false
expect_error stray-word "unexpected argument 'words' \(every argument is an option" --model mlp words
expect_error ddp-unknown-model "unknown model 'vgg'.*(rank [01]; stopped the other workers)" --strategy ddp \
  --devices cpu:2 --model vgg --data synthetic:64
expect_error ddp-missing-resume "cannot resume: .*nowhere does not exist" --strategy ddp --devices cpu:2 \
  --resume "$work/nowhere" --data synthetic:64
expect_error zero-nnodes "nnodes must be at least 1, got 0" --strategy ddp --nnodes 0 --data synthetic:64
expect_error node-rank "node-rank 2 is outside 0..1" --strategy ddp --nnodes 2 --node-rank 2 --data synthetic:64
expect_error drop-everything "drop-last with --batch-size 32 would drop every batch: the training set holds 10" \
  --drop-last --batch-size 32 --data synthetic:10
expect_error bad-number "invalid|argument" --batch-size three
expect_error unknown-data "unknown dataset" --data imagenet
expect_error bad-devices "device" --devices gpu7 --data synthetic:64
expect_error bad-schedule "lr schedule" --lr-schedule wobble --data synthetic:64
# Optimizer options, refused as torch.optim refuses them.
expect_error unknown-optimizer "unknown optimizer 'lamb' \(expected sgd, adam or adamw\)" --optimizer lamb --data synthetic:64
expect_error negative-eps "eps must be finite and non-negative" --optimizer adamw --eps -1e-8 --data synthetic:64
expect_error beta-one "betas must each be in \[0, 1\)" --optimizer adamw --betas 1,0.999 --data synthetic:64
expect_error beta-negative "betas must each be in \[0, 1\)" --optimizer adam --betas 0.9,-0.1 --data synthetic:64
expect_error betas-garbage "betas takes BETA1,BETA2" --optimizer adamw --betas 0.9 --data synthetic:64
expect_error negative-clip "clip-grad-norm must be finite and non-negative" --clip-grad-norm -1 --data synthetic:64
expect_error negative-clip-value "clip-grad-value must be finite and non-negative" --clip-grad-value -0.5 --data synthetic:64
expect_error amsgrad-sgd "amsgrad applies to --optimizer adam or adamw" --amsgrad --data synthetic:64
expect_error nesterov-adamw "nesterov applies to --optimizer sgd" --optimizer adamw --nesterov --data synthetic:64
expect_error negative-weight-decay "weight-decay must be non-negative" --weight-decay -1e-4 --data synthetic:64
# Options that would have no effect, or values that would wrap.
expect_error negative-seed "--seed must be an integer in 0..18446744073709551615, got '-1'" --seed -1 --data synthetic:64
expect_error log-dir-dp "--log-dir applies to --strategy ddp" --log-dir "$work/logs" --data synthetic:64
expect_error nproc-dp "--nproc-per-node applies to --strategy ddp" --nproc-per-node 2 --devices cpu:2 --data synthetic:64
printf 'epochs = 1\nconfig = %s/other.cfg\n' "$work" > "$work/nested.cfg"
expect_error config-in-config "names another config file \(config = ...\)" --config "$work/nested.cfg"
expect_warning() {  # expect_warning NAME PATTERN ARGS...: exit 0, and one warning line matching PATTERN
  local name=$1 pattern=$2
  shift 2
  timeout 120 "$DP_TRAIN" --progress off --epochs 1 --model mlp --data synthetic:64 "$@" > "$work/out" 2> "$work/err"
  local rc=$?
  if [ "$rc" -ne 0 ] || [ "$(grep -c 'warning' "$work/err")" -ne 1 ] || ! grep -qE -- "dp-train: warning: $pattern" "$work/err"; then
    echo "FAIL $name: exit $rc, stderr:"; sed 's/^/    /' "$work/err"
    fails=$((fails + 1))
  else
    echo "ok   $name (exit 0): $(cat "$work/err")"
  fi
}
expect_warning tf32-on-cpu "--allow-tf32 has no effect on CPU devices" --allow-tf32 --devices cpu
expect_warning deterministic-on-cpu "--deterministic has no effect on CPU devices" --deterministic --devices cpu:2
expect_warning output-device-unused "--output-device has no effect without --gather-outputs" --output-device cpu:1 \
  --devices cpu:2
expect_warning gather-one-device "--gather-outputs has no effect with one device per process" --gather-outputs \
  --devices cpu
expect_warning timing-warmup-epoch "--timing-warmup 2 is not below an epoch's 2 batches" --timing-warmup 2 \
  --batch-size 32 --devices cpu
expect_warning min-lr-cosine "--min-lr has no effect without --lr-schedule warmup-cosine" --min-lr 0.001 --devices cpu
expect_warning momentum-adam "--momentum has no effect on adamw" --optimizer adamw --momentum 0.5 --devices cpu
expect_warning momentum-adam-default "--momentum has no effect on adam " --optimizer adam --momentum 0.9 --devices cpu
expect_warning sync-bn-no-batchnorm "--sync-bn has no effect on mlp \(it has no BatchNorm\)" --sync-bn --devices cpu:2
expect_warning normalize-default "--normalize has no effect without image files" --normalize imagenet --devices cpu
expect_warning betas-sgd "--betas has no effect on sgd" --betas 0.8,0.9 --devices cpu
expect_warning keep-last-unsaved "--keep-last has no effect without --save-dir" --keep-last 3 --devices cpu
expect_warning overwrite-unsaved "--overwrite has no effect without --save-dir" --overwrite --devices cpu
# --resume FILE without --save-dir trains on and saves nothing: said, and --overwrite with it has nothing to remove.
timeout 120 "$DP_TRAIN" --progress off --epochs 2 --stop-after 1 --model mlp --data synthetic:64 --devices cpu \
  --save-dir "$work/resumable" > "$work/out" 2>&1 || { cat "$work/out"; echo "FAIL: the run to resume"; fails=$((fails + 1)); }
timeout 120 "$DP_TRAIN" --progress off --epochs 2 --model mlp --data synthetic:64 --devices cpu --overwrite \
  --resume "$work/resumable/epoch-0001.safetensors" > "$work/out" 2> "$work/err"
rc=$?
if [ "$rc" -ne 0 ] || [ "$(grep -c 'warning' "$work/err")" -ne 2 ] ||
   ! grep -qF "dp-train: warning: --overwrite has no effect without --save-dir" "$work/err" ||
   ! grep -qF "dp-train: warning: --resume $work/resumable/epoch-0001.safetensors continues the run without saving it: give --save-dir DIR" "$work/err"; then
  echo "FAIL resume-file-unsaved: exit $rc, stderr:"; sed 's/^/    /' "$work/err"
  fails=$((fails + 1))
else
  echo "ok   resume-file-unsaved (exit 0): $(cat "$work/err")"
fi
expect_warning eps-sgd "--eps has no effect on sgd" --eps 1e-6 --devices cpu
expect_warning no-decay-zero "--no-decay-norm-bias has no effect with --weight-decay 0" --no-decay-norm-bias \
  --weight-decay 0 --devices cpu
expect_warning shard-one-device "--shard-optimizer has no effect with one device" --shard-optimizer --devices cpu
expect_warning prefetch-no-workers "--prefetch has no effect with --workers 0" --prefetch 4 --workers 0 --devices cpu
expect_warning batch-change-fresh "--allow-batch-change has no effect without --resume" --allow-batch-change \
  --devices cpu
expect_warning timeout-dp "--timeout has no effect without --strategy ddp" --timeout 5 --devices cpu
expect_warning normalize-no-images "--normalize has no effect without image files" --normalize 0.5,0.2 --devices cpu
expect_warning skip-no-images "--skip-bad-samples has no effect without image files" --skip-bad-samples --devices cpu
expect_warning radius-no-volumes "--heatmap-radius has no effect without keypoint volumes" --heatmap-radius 3 \
  --devices cpu
expect_warning pin-on-cpu "--pin-memory on has no effect on CPU devices" --pin-memory on --devices cpu
expect_warning order-on-cpu "--order-by-free-memory has no effect on CPU devices" --order-by-free-memory --devices cpu
expect_error empty-save-dir "--save-dir needs a path, got ''" --save-dir "" --data synthetic:64
expect_error proc-metrics "--metrics /proc/m.jsonl: the folder /proc is not writable" --metrics /proc/m.jsonl \
  --data synthetic:64
ln -s "$work/nowhere/m.jsonl" "$work/dangling.jsonl"  # checked where the writes go, before training
expect_error dangling-metrics "--metrics $work/dangling.jsonl \(a link to $work/nowhere/m.jsonl\): the folder $work/nowhere does not exist" \
  --metrics "$work/dangling.jsonl" --data synthetic:64
ln -s "$work/loop.jsonl" "$work/loop.jsonl"
expect_error loop-metrics "cannot follow the links from $work/loop.jsonl: too many levels" --metrics "$work/loop.jsonl" \
  --data synthetic:64
expect_error unknown-comm "unknown communicator 'wobble' \(expected auto, cpu, p2p or nccl\)" --dp-comm wobble \
  --devices cpu:2 --data synthetic:64
expect_error cpu-list "CPU devices are given as cpu or cpu:N alone" --devices cpu,cpu --data synthetic:64
expect_error negative-min-lr "--min-lr must be in \[0, --lr\], got -7" --lr-schedule warmup-cosine --warmup-steps 1 \
  --lr-decay-steps 3 --min-lr -7 --data synthetic:64
expect_error cosine-no-end "--lr-schedule warmup-cosine needs --lr-decay-steps N" --lr-schedule warmup-cosine \
  --data synthetic:64
# An AdamW checkpoint resumed with SGD.
timeout 120 "$DP_TRAIN" --progress off --epochs 1 --model mlp --data synthetic:64 --optimizer adamw --lr 1e-3 \
  --save-dir "$work/adamw" > /dev/null 2>&1 || { echo "FAIL adamw checkpoint: the run failed"; fails=$((fails + 1)); }
expect_error resume-other-optimizer "trained with AdamW, this run's optimizer is SGD" --model mlp --data synthetic:64 \
  --resume "$work/adamw"
# Train and test images of different shapes: refused when the data loads.
python3 - "$work/mixed" <<'PY'
import gzip, os, struct, sys
d = sys.argv[1]
os.makedirs(d)
def idx(name, n, dims, magic):
    with open(os.path.join(d, name), "wb") as f:
        f.write(struct.pack(">I", magic) + b"".join(struct.pack(">I", x) for x in (n, *dims)))
        size = n
        for x in dims:
            size *= x
        f.write(bytes((i * 37) % 256 for i in range(size)) if magic == 0x803 else bytes(i % 10 for i in range(n)))
idx("train-images-idx3-ubyte", 64, (28, 28), 0x803)
idx("train-labels-idx1-ubyte", 64, (), 0x801)
idx("t10k-images-idx3-ubyte", 16, (32, 32), 0x803)
idx("t10k-labels-idx1-ubyte", 16, (), 0x801)
PY
expect_error train-test-shapes "training images are \(1, 28, 28\) but test images are \(1, 32, 32\)" \
  --model mlp --data "fashion-mnist:$work/mixed"
expect_error train-test-shapes-resnet "training images are" --model resnet18 --data "fashion-mnist:$work/mixed"
# Config files that are not files, or far too large.
mkdir -p "$work/confdir"
expect_error config-directory "config file .* is a directory" --config "$work/confdir" --data synthetic:64
expect_error config-device "config file /dev/zero is not a regular file" --config /dev/zero --data synthetic:64
expect_error config-missing "config file .* does not exist" --config "$work/none.cfg" --data synthetic:64
head -c 2000000 /dev/zero | tr '\0' '#' > "$work/huge.cfg"
expect_error config-huge "at most 1048576" --config "$work/huge.cfg" --data synthetic:64
printf 'epochs = 1\nlr = 0.1\x01\x02\n' > "$work/binary.cfg"
printf 'epochs = 1  # a comment\nmetrics = %s/run#3.jsonl\n' "$work" > "$work/hash.cfg"
expect_error config-hash "hash.cfg line 2: '#' starts a comment, so the value would be cut to '.*/run'" \
  --config "$work/hash.cfg" --data synthetic:64
expect_error config-binary "config file .*binary.cfg is not text: line 2 holds the control byte 0x01$" \
  --config "$work/binary.cfg" --data synthetic:64
# Checked before any data is opened (the data here does not exist).
expect_error schedule-before-data "unknown lr schedule 'wobble'" --lr-schedule wobble --data "fashion-mnist:$work/nowhere"
# --max-steps alone takes the epochs it needs (here 2 of 32 batches): a longer warm-up is named with it.
NO_EPOCHS=1 expect_error warmup-past-max-steps-at-once \
  "--warmup-epochs 4 is longer than the 2 epochs --max-steps 3 takes" \
  --max-steps 3 --warmup-epochs 4 --batch-size 32 --model mlp --data synthetic:64
NO_EPOCHS=1 expect_error warmup-past-max-steps \
  "--warmup-epochs 3 is longer than the 2 epochs --max-steps 3 takes: warm up for fewer epochs, or give --epochs" \
  --max-steps 3 --warmup-epochs 3 --batch-size 32 --model mlp --data synthetic:64
# A model's weights alone (no training state) cannot be resumed.
printf '\x02\x00\x00\x00\x00\x00\x00\x00{}' > "$work/weights.safetensors"
expect_error resume-weights-alone \
  "weights.safetensors is not a fanout training checkpoint .*: --init-from .*weights.safetensors starts a run from its weights$" \
  --resume "$work/weights.safetensors" --model mlp --data synthetic:64
# Loader bounds and the warm-up bound.
expect_error prefetch-bound "prefetch must be in 1..64" --workers 256 --prefetch 100000 --data synthetic:64
expect_error workers-bound "workers must be at most 256" --workers 100000 --data synthetic:64
expect_error cpu-threads-negative "cpu-threads must be in 0..1024" --cpu-threads -1 --data synthetic:64
expect_error cpu-threads-bound "cpu-threads must be in 0..1024" --cpu-threads 5000 --data synthetic:64
expect_error in-flight-bound "batches in flight .* x batch \(--batch-size over the processes\) 60000\).* use fewer workers, a smaller prefetch or a smaller batch" \
  --workers 256 --prefetch 64 --batch-size 60000 --data fashion-mnist
expect_error in-flight-eval "x evaluation batch \(--eval-batch-size\) 1000\).* or a smaller evaluation batch \(--eval-batch-size\)" \
  --workers 256 --prefetch 64 --data fashion-mnist
expect_error warmup-inf "warmup-epochs must be in" --warmup-epochs inf --data synthetic:64
expect_error warmup-past-end "warmup-epochs must be in \[0, --epochs\] = \[0, 1\], got 5" --warmup-epochs 5 --data synthetic:64
expect_error warmup-nan "warmup-epochs must be in" --warmup-epochs nan --data synthetic:64
expect_error split-invariant-batchnorm "cannot hold for a model with BatchNorm" --split-invariant --model resnet18 \
  --devices cpu:2 --data synthetic:64
expect_error unknown-precision "unknown precision 'fp8' \(choose 32, bf16-mixed or 16-mixed\)" --precision fp8 \
  --data synthetic:64
expect_error bf16-split-invariant "--precision bf16-mixed cannot keep --split-invariant" --precision bf16-mixed \
  --split-invariant --data synthetic:64
expect_error f16-split-invariant "--precision 16-mixed cannot keep --split-invariant" --precision 16-mixed \
  --split-invariant --data synthetic:64

# A kernel switch with a value it does not take: one line naming it, not an internal error.
FANOUT_CONV3D_WEIGHT_SLICES=sometimes expect_error conv3d-slices-switch "FANOUT_CONV3D_WEIGHT_SLICES must be auto, always or never" \
  --model heatmap3d --data synthetic3d:16 --batch-size 4

# Files that are directories: one line saying so, not a stream error.
gpt=gpt:gpt-char,n_layer=1,n_head=2,n_embd=16,block_size=8
mkdir -p "$work/tokdir/meta.json" "$work/pwdir"
printf 'abcdefghijklmnopqrstuvwxyz' > "$work/tokdir/train.bin"
expect_error text-is-a-directory "text $work/tokdir is a directory" --model "$gpt" --data "text:$work/tokdir"
expect_error meta-is-a-directory "token meta file $work/tokdir/meta.json is a directory" --model "$gpt" \
  --data "tokens:$work/tokdir"
printf 'abc' > "$work/tiny.txt"
FANOUT_CACHE_DIR="$work/cache" expect_error text-too-short \
  "text:$work/tiny.txt, tokenized into .*: token file .* holds 2 tokens, shorter than one window of 9" \
  --model "$gpt" --data "text:$work/tiny.txt"
expect_error password-file-is-a-directory "rdzv-password-file $work/pwdir is a directory" --strategy ddp --nnodes 2 \
  --rdzv redis:127.0.0.1:1 --rdzv-password-file "$work/pwdir" --data synthetic:64

# --list-devices answers on any machine: GPUs, or that there is none (not a CUDA runtime error).
if out=$(timeout 60 "$DP_TRAIN" --list-devices 2>&1) && echo "$out" | grep -qE "^no CUDA device visible|^cuda:0"; then
  echo "ok   list-devices: $(echo "$out" | head -1)"
else
  echo "FAIL list-devices: $out"
  fails=$((fails + 1))
fi

if [ "$fails" -ne 0 ]; then
  echo "$fails bad-input case(s) failed"
  exit 1
fi
echo "all bad-input cases gave one clear line"
