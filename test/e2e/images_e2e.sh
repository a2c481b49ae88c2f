#!/usr/bin/env bash
# e2e: image files from disk (imagefolder:DIR), a generated 10-class folder of
# JPEGs and PNGs of random sizes (make_images.py):
#   - cnn and resnet18 on cpu:2 with random-resized-crop and flip, well above
#     chance (0.1); cnn with jpeg-draft on larger images too;
#   - the crops and flips depend on (seed, epoch, sample) alone: cpu with no
#     loader workers and cpu:3 with 4 end bit for bit alike (--split-invariant);
#   - resumed from inside an epoch with 2 workers: bit for bit the uninterrupted run;
#   - bad input is one line and a non-zero exit (an empty folder, a class folder
#     without images, no val, a corrupt JPEG and an unreadable file, each named);
#     with --skip-bad-samples the run ends and the metrics count them;
#   - the same from WebDataset tar shards (cnn, DDP over 2 processes, resume, bad shards);
#   - peak host memory does not grow with the number of files (2,000 and 20,000).
set -euo pipefail
: "${DP_TRAIN:?path to dp-train}"
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
python3 "$here/make_images.py" "$work/imgs" --train 40 --val 10 --png 0.2 --seed 4
base=(--augment random-resized-crop:32,flip --batch-size 48 --progress off --seed 3)
common=(--data "imagefolder:$work/imgs" "${base[@]}")
accuracy() { sed -n 's/^final test accuracy \([0-9.]*\)$/\1/p' "$1"; }
above() { python3 -c "import sys; sys.exit(not float('$1') >= float('$2'))"; }
# trains NAME WHAT MIN ARGS...: dp-train ARGS into $work/NAME.log succeeds
# with a final test accuracy (left in $acc) of at least MIN.
trains() {
  local name=$1 what=$2 min=$3
  shift 3
  "$DP_TRAIN" "$@" > "$work/$name.log" 2>&1 || { cat "$work/$name.log"; fail "$what did not train"; }
  acc=$(accuracy "$work/$name.log")
  above "$acc" "$min" || { cat "$work/$name.log"; fail "$what: test accuracy $acc below $min"; }
  echo "$what: test accuracy $acc"
}

trains cnn "cnn on cpu:2" 0.6 "${common[@]}" --model cnn --devices cpu:2 --epochs 6 --workers 2
grep -q "data imagefolder:$work/imgs (400 train / 100 test, (3, 32, 32))" "$work/cnn.log" || fail "cnn: not 400/100 at 3x32x32"

# jpeg-draft on larger photos: JPEGs decode at 1/2 or 1/4 where the crop keeps 3 pixels per output pixel.
python3 "$here/make_images.py" "$work/big" --train 40 --val 10 --min-side 160 --max-side 320 --png 0.2 --seed 5
trains draft "cnn with jpeg-draft" 0.5 --data "imagefolder:$work/big" --augment random-resized-crop:32,flip,jpeg-draft \
  --batch-size 48 --progress off --seed 3 --model cnn --devices cpu:2 --epochs 6 --workers 2

trains resnet "resnet18 on cpu:2" 0.5 "${common[@]}" --model resnet18 --devices cpu:2 --epochs 4 --workers 2

# The same crops whatever builds them: one device inline against three replicas and four workers.
inv=("${common[@]}" --model mlp --split-invariant)  # no BatchNorm: split-invariant math
"$DP_TRAIN" "${inv[@]}" --epochs 2 --devices cpu --workers 0 --save-dir "$work/one" > "$work/one.log" 2>&1 ||
  { cat "$work/one.log"; fail "the one-device run failed"; }
"$DP_TRAIN" "${inv[@]}" --epochs 2 --devices cpu:3 --workers 4 --save-dir "$work/three" > "$work/three.log" 2>&1 ||
  { cat "$work/three.log"; fail "the cpu:3 run failed"; }
python3 "$here/same_tensors.py" "$work/one/epoch-0002.safetensors" "$work/three/epoch-0002.safetensors" ||
  fail "cpu with no workers and cpu:3 with 4 differ: the crops depend on who draws them"

# Resumed from inside epoch 2 with 2 workers (the first run had none): the same tensors.
"$DP_TRAIN" "${inv[@]}" --devices cpu:2 --workers 0 --epochs 3 --save-every-steps 4 --keep-last 20 \
  --save-dir "$work/full" > "$work/full.log" 2>&1 || { cat "$work/full.log"; fail "the full run failed"; }
mid=$(ls "$work/full"/epoch-0001-batch-*.safetensors | head -1)
[ -n "$mid" ] || fail "no checkpoint inside epoch 2"
mkdir -p "$work/mid" && cp "$mid" "$work/mid/"
"$DP_TRAIN" "${inv[@]}" --devices cpu:2 --workers 2 --epochs 3 --save-dir "$work/mid" --resume "$work/mid/$(basename "$mid")" \
  > "$work/mid.log" 2>&1 || { cat "$work/mid.log"; fail "the resumed run failed"; }
grep -q "^resumed from .*batches of the next" "$work/mid.log" || fail "the second run did not resume inside epoch 2"
python3 "$here/same_tensors.py" "$work/full/epoch-0003.safetensors" "$work/mid/epoch-0003.safetensors" ||
  fail "resumed with 2 workers differs from the uninterrupted run"

# Bad input: one line naming the problem, exit non-zero.
bad() {  # bad WANT DIR [ARGS...]
  local want=$1 dir=$2 rc=0
  shift 2
  "$DP_TRAIN" "${base[@]}" --data "imagefolder:$dir" --model cnn --devices cpu --epochs 1 --workers 2 "$@" \
    > "$work/bad.out" 2> "$work/bad.err" || rc=$?
  [ $rc != 0 ] || fail "imagefolder:$dir: no failure"
  [ "$(wc -l < "$work/bad.err")" = 1 ] || { cat "$work/bad.err"; fail "imagefolder:$dir: not one line"; }
  grep -qF -- "$want" "$work/bad.err" || { cat "$work/bad.err"; fail "imagefolder:$dir: no '$want'"; }
  echo "refused: $(cat "$work/bad.err")"
}
mkdir -p "$work/empty"
bad "has no train folder" "$work/empty"
mkdir -p "$work/noclass/train" "$work/noclass/val"
bad "/train has no class folders" "$work/noclass"
cp -r "$work/imgs" "$work/noval" && rm -rf "$work/noval/val"
bad "has no val folder" "$work/noval"
cp -r "$work/imgs" "$work/hollow" && mkdir -p "$work/hollow/train/zz/.hidden" "$work/hollow/val/zz" &&
  cp "$work/imgs/train/class0/00000.jpg" "$work/hollow/train/zz/.hidden/" && touch "$work/hollow/train/zz/notes.txt"
bad "class folder $work/hollow/train/zz has no .jpg, .jpeg or .png files" "$work/hollow"
# Files torchvision reads and fanout does not decode: left out, counted in one warning.
cp -r "$work/imgs" "$work/bmp" && cp "$work/imgs/train/class0/00000.jpg" "$work/bmp/train/class0/extra.BMP" &&
  touch "$work/bmp/val/class1/x.webp"
"$DP_TRAIN" "${base[@]}" --data "imagefolder:$work/bmp" --model cnn --devices cpu --epochs 1 --max-steps 1 \
  > "$work/bmp.out" 2> "$work/bmp.err" || { cat "$work/bmp.err"; fail "a folder with .bmp files did not train"; }
grep -q "warning: imagefolder:$work/bmp: 2 files that torchvision's ImageFolder would read left out" "$work/bmp.err" ||
  { cat "$work/bmp.err"; fail "no warning for the .bmp and .webp files"; }
"$DP_TRAIN" --data "imagefolder:$work/imgs" --augment flip --model cnn --epochs 1 --progress off > "$work/bad.out" \
  2> "$work/bad.err" && fail "--augment flip on image files ran"
grep -q "image files need --augment to give the size the model sees" "$work/bad.err" || { cat "$work/bad.err"; fail "no size line"; }
cp -r "$work/imgs" "$work/corrupt" && head -c 2000 /dev/urandom > "$work/corrupt/train/class3/00007.jpg"
bad "cannot decode image $work/corrupt/train/class3/00007.jpg: not a JPEG or PNG file" "$work/corrupt"
cp -r "$work/imgs" "$work/unreadable" && ln -s "$work/nowhere.jpg" "$work/unreadable/val/class2/gone.jpg"
bad "cannot read image $work/unreadable/val/class2/gone.jpg: No such file or directory" "$work/unreadable"
# An evaluation that fails saves the epoch's training first (resumable at the epoch's end).
"$DP_TRAIN" "${base[@]}" --data "imagefolder:$work/unreadable" --model cnn --devices cpu --epochs 1 --workers 2 \
  --save-dir "$work/evalfail" > "$work/evalfail.out" 2>&1 && fail "a failing evaluation ended well"
ls "$work/evalfail"/epoch-0000-batch-*.safetensors > /dev/null 2>&1 ||
  { cat "$work/evalfail.out"; fail "an evaluation error lost the epoch's training"; }
# Symbolic link loops, one back to the class folder itself (the kernel's 40-link limit would end
# it as a file) or to the split above: one line each, never the files counted again.
cp -r "$work/imgs" "$work/loop1" && ln -s . "$work/loop1/train/class1/self"
bad "$work/loop1/train/class1/self is the folder" "$work/loop1"
cp -r "$work/imgs" "$work/loop2" && ln -s ../.. "$work/loop2/val/class4/up"
bad "$work/loop2/val/class4/up is the folder" "$work/loop2"

# --skip-bad-samples: reported once each, counted in the metrics, the run ends.
cp -r "$work/corrupt" "$work/both" && ln -s "$work/nowhere.jpg" "$work/both/val/class2/gone.jpg"
"$DP_TRAIN" "${base[@]}" --data "imagefolder:$work/both" --model cnn --devices cpu:2 --epochs 2 --workers 2 \
  --skip-bad-samples --metrics "$work/skip.jsonl" > "$work/skip.out" 2> "$work/skip.err" ||
  { cat "$work/skip.err"; fail "--skip-bad-samples did not finish"; }
[ "$(grep -c 'skipping a bad sample' "$work/skip.err")" = 2 ] || { cat "$work/skip.err"; fail "not 2 reports"; }
grep -q "skipping a bad sample.*$work/both/train/class3/00007.jpg" "$work/skip.err" || fail "the corrupt file is not named"
python3 - "$work/skip.jsonl" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
# Each epoch reads the bad training file once and the bad validation file once.
assert [l["skipped_samples"] for l in lines] == [2, 4], [l.get("skipped_samples") for l in lines]
print("skipped_samples per epoch:", [l["skipped_samples"] for l in lines])
PY
grep -q "bad samples skipped" "$work/skip.out" || fail "the summary does not count the skipped samples"
# The same set as WebDataset tar shards (4 training shards of mixed classes, 1 for validation).
python3 - "$work/imgs" "$work/wds" <<'PY'
import os, random, sys, tarfile
src, dst = sys.argv[1:]
os.makedirs(dst)
for split, n in (("train", 4), ("val", 1)):
    items = [(os.path.join(root, f), int(os.path.basename(root)[5:])) for root, _, fs in os.walk(os.path.join(src, split))
             for f in sorted(fs)]
    random.Random(7).shuffle(items)
    for k in range(n):
        with tarfile.open(os.path.join(dst, f"{split}-{k:06d}.tar"), "w") as t:
            for i, (path, label) in enumerate(items[k::n]):
                key = f"sample{k:02d}{i:05d}"
                t.add(path, f"{key}{os.path.splitext(path)[1]}")
                cls = os.path.join(dst, "cls.tmp")
                open(cls, "w").write(f"{label}\n")
                t.add(cls, f"{key}.cls")
    os.remove(os.path.join(dst, "cls.tmp"))
PY
wds=(--data "wds:$work/wds" "${base[@]}")
trains wds-cnn "cnn on cpu:2 from tar shards" 0.6 "${wds[@]}" --model cnn --devices cpu:2 --epochs 6 --workers 2
grep -q "data wds:$work/wds (400 train / 100 test, (3, 32, 32))" "$work/wds-cnn.log" || fail "wds: not 400/100 at 3x32x32"
# DDP over 2 processes: the shards split over the ranks.
"$DP_TRAIN" "${wds[@]}" --model cnn --devices cpu:2 --strategy ddp --epochs 3 --workers 1 > "$work/wds-ddp.log" 2>&1 ||
  { cat "$work/wds-ddp.log"; fail "DDP from tar shards failed"; }
echo "ddp from tar shards: $(tail -1 "$work/wds-ddp.log")"
# Resumed inside epoch 2 with 2 workers (the first run had none): the same tensors.
"$DP_TRAIN" "${wds[@]}" --model mlp --split-invariant --devices cpu:2 --workers 0 --epochs 3 --save-every-steps 4 \
  --keep-last 20 --save-dir "$work/wfull" > "$work/wfull.log" 2>&1 || { cat "$work/wfull.log"; fail "the shard run failed"; }
mid=$(ls "$work/wfull"/epoch-0001-batch-*.safetensors | head -1)
mkdir -p "$work/wmid" && cp "$mid" "$work/wmid/"
"$DP_TRAIN" "${wds[@]}" --model mlp --split-invariant --devices cpu:2 --workers 2 --epochs 3 --save-dir "$work/wmid" \
  --resume "$work/wmid/$(basename "$mid")" > "$work/wmid.log" 2>&1 || { cat "$work/wmid.log"; fail "the resume failed"; }
python3 "$here/same_tensors.py" "$work/wfull/epoch-0003.safetensors" "$work/wmid/epoch-0003.safetensors" ||
  fail "tar shards: resumed with 2 workers differs from the uninterrupted run"
# Bad shards: one line naming the shard.
wbad() {  # wbad WANT DIR
  local rc=0
  "$DP_TRAIN" "${base[@]}" --data "wds:$2" --model cnn --devices cpu --epochs 1 > "$work/bad.out" 2> "$work/bad.err" || rc=$?
  [ $rc != 0 ] && [ "$(wc -l < "$work/bad.err")" = 1 ] && grep -qF -- "$1" "$work/bad.err" ||
    { cat "$work/bad.err"; fail "wds:$2: not one line with '$1'"; }
  echo "refused: $(cat "$work/bad.err")"
}
mkdir -p "$work/nowds"
wbad "has no train-*.tar shards" "$work/nowds"
cp -r "$work/wds" "$work/wtrunc" &&
  truncate -s $(($(stat -c %s "$work/wtrunc/train-000001.tar") / 2 + 100)) "$work/wtrunc/train-000001.tar"
wbad "shard $work/wtrunc/train-000001.tar ends inside member" "$work/wtrunc"
cp -r "$work/wds" "$work/whead" && python3 - "$work/whead/train-000001.tar" <<'PY'
import os, sys, tarfile
with tarfile.open(sys.argv[1]) as t:
    second = t.getmembers()[1].offset  # the second member's header
os.truncate(sys.argv[1], second + 100)
PY
wbad "shard $work/whead/train-000001.tar ends inside a member's header" "$work/whead"
cp -r "$work/wds" "$work/wnocls" && python3 - "$work/wnocls/val-000000.tar" <<'PY'
import sys, tarfile, io
path = sys.argv[1]
t = tarfile.open(path); members = [(m, t.extractfile(m).read()) for m in t.getmembers()]; t.close()
with tarfile.open(path, "w") as out:
    for m, data in members:
        if m.name != "sample0000003.cls":
            out.addfile(m, io.BytesIO(data))
PY
wbad "shard $work/wnocls/val-000000.tar: sample 'sample0000003' has no .cls" "$work/wnocls"
# Extra dots in a name: WebDataset's key ends at the first one, so sample.0000003.jpg is field '0000003.jpg'
# of sample 'sample', which has no image: refused (the other samples of the shard are fine).
cp -r "$work/wds" "$work/wdots" && python3 - "$work/wdots/val-000000.tar" <<'PY'
import sys, tarfile, io
path = sys.argv[1]
t = tarfile.open(path); members = [(m, t.extractfile(m).read()) for m in t.getmembers()]; t.close()
with tarfile.open(path, "w") as out:
    for m, data in members:
        m.name = m.name.replace("sample0000003.", "sample.0000003.")
        out.addfile(m, io.BytesIO(data))
PY
wbad "is field '0000003." "$work/wdots"
grep -qF "of sample 'sample', which has no image or .cls" "$work/bad.err" || fail "wds: the dotted sample not named"
# The classes come from the largest label: one far above the others is said.
cp -r "$work/wds" "$work/wlabel" && python3 - "$work/wlabel/train-000000.tar" <<'PY'
import sys, tarfile, io
path = sys.argv[1]
t = tarfile.open(path); members = [(m, t.extractfile(m).read()) for m in t.getmembers()]; t.close()
with tarfile.open(path, "w") as out:
    for m, data in members:
        if m.name == "sample0000000.cls":
            data, m.size = b"60\n", 3
        out.addfile(m, io.BytesIO(data))
    junk = tarfile.TarInfo("._sample0000000.jpg")  # macOS's AppleDouble entry: no key, skipped as WebDataset does
    junk.size = 4
    out.addfile(junk, io.BytesIO(b"junk"))
PY
"$DP_TRAIN" "${base[@]}" --data "wds:$work/wlabel" --model mlp --devices cpu --epochs 1 --max-steps 1 \
  > "$work/wlabel.out" 2> "$work/wlabel.err" || { cat "$work/wlabel.err"; fail "wds: a large label ended the run"; }
grep -q "warning: wds:$work/wlabel: 61 classes (0..60, from the largest .cls of the training shards), [0-9]* of them with training samples" \
  "$work/wlabel.err" || { cat "$work/wlabel.err"; fail "wds: no warning for the unused classes"; }

# Only the file list is in memory: peak host memory with 20,000 files within 10% of that with 2,000.
for n in 200 2000; do
  python3 "$here/make_images.py" "$work/many$n" --size 24x24 --train "$n" --val 1 --seed 1
  "$DP_TRAIN" --model mlp --data "imagefolder:$work/many$n" --augment random-resized-crop:16,flip --devices cpu \
    --workers 2 --batch-size 32 --epochs 1 --max-steps 50 --progress off --metrics "$work/many$n.jsonl" \
    > "$work/many$n.log" 2>&1 || { cat "$work/many$n.log"; fail "the run over $((10 * n)) files failed"; }
done
python3 - "$work/many200.jsonl" "$work/many2000.jsonl" <<'PY'
import json, sys
few, many = (json.loads(open(p).readlines()[-1])["peak_host_bytes"] for p in sys.argv[1:])
print(f"peak host memory: {few / 2**20:.1f} MiB with 2,000 files, {many / 2**20:.1f} MiB with 20,000")
assert many <= 1.1 * few, "peak host memory grows with the number of files"
PY
echo "images e2e: ok"
