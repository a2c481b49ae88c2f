#!/usr/bin/env bash
# e2e: a language model from a text file, end to end.
#  - dp-train --model gpt:gpt-char,... --data text:FILE over cpu:2 with
#    nanoGPT's warmup-cosine schedule reaches a validation loss at least 25%
#    below the text's unigram entropy (computed here from the characters).
#  - --eval-every 10 --eval-steps 2: a line and a metrics entry after every
#    10th step (validation loss on 64 windows); best.safetensors is the
#    evaluation (inside an epoch or at its end) with the lowest validation loss.
#  - Stopped after its first epoch and resumed, and resumed from a checkpoint
#    inside epoch 2 (--save-every-steps), the run ends with the uninterrupted
#    run's tensors bit for bit (parameters and AdamW state) and the same
#    evaluation lines, the training loss since the previous evaluation included.
#  - --max-steps 7 ends the run after its 7th optimizer step, inside the
#    first epoch (the checkpoint records 7 steps).
#  - dp-generate with a seed prints the same text twice, the prompt first and
#    only characters of the text's vocabulary after it; --prompt-file (a file,
#    stdin) prints what --prompt does.
#  - --tokenizer (a byte-level BPE learned from the corpus): training lowers
#    the loss; dp-generate decodes with the checkpoint's copy of the tokenizer,
#    twice the same for a seed, and never draws a padded model's extra tokens;
#    the weights in Hugging Face's GPT-2 layout (dp-generate --weights) print
#    the same text, and dp-train --init-from takes them whole.
#  - Bad input is one line and exit status 1: a prompt character outside the
#    vocabulary (named), a checkpoint of another model, block_size longer than
#    the validation split, a missing and an empty text.
set -euo pipefail
: "${DP_TRAIN:?path to dp-train}"
: "${DP_GENERATE:?path to dp-generate}"
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
export FANOUT_CACHE_DIR="$work/cache"

# A seeded toy language: sentences of a small grammar, about 60 KB.
python3 - "$work/corpus.txt" <<'PY'
import random, sys
rng = random.Random(7)
subjects = ["the cat", "a dog", "my friend", "the old king", "a small bird", "the river"]
verbs = ["sees", "likes", "follows", "finds", "carries", "watches"]
objects = ["the moon", "a red apple", "the quiet town", "an open door", "the long road", "a bright star"]
ends = [".", "!", "?"]
lines = []
while sum(len(l) for l in lines) < 60000:
    s = f"{rng.choice(subjects)} {rng.choice(verbs)} {rng.choice(objects)}{rng.choice(ends)}"
    lines.append(s[0].upper() + s[1:] + "\n")
open(sys.argv[1], "w").write("".join(lines))
PY
model="gpt:gpt-char,n_layer=2,n_head=4,n_embd=64,block_size=64,dropout=0"
common=(--model "$model" --data "text:$work/corpus.txt" --devices cpu:2 --batch-size 32 --epochs 4 --optimizer adamw
  --lr 3e-3 --lr-schedule warmup-cosine --warmup-steps 20 --lr-decay-steps 105 --progress off --eval-every 10
  --eval-steps 2)
"$DP_TRAIN" "${common[@]}" --save-dir "$work/full" --metrics "$work/full.jsonl" --save-every-steps 20 --keep-last 100 |
  tee "$work/full.log"
grep -q "^step 10  train loss .* val loss .* ppl .* tokens/s" "$work/full.log" || fail "no evaluation line at step 10"
python3 - "$work/corpus.txt" "$work/full.jsonl" <<'PY'
import collections, json, math, sys
text = open(sys.argv[1]).read()
counts = collections.Counter(text)
h = -sum(c / len(text) * math.log(c / len(text)) for c in counts.values())
lines = [json.loads(l) for l in open(sys.argv[2])]
val = [l["test_loss"] for l in lines if "eval" not in l][-1]
print(f"unigram entropy {h:.4f} nats; validation loss {val:.4f} ({100 * (1 - val / h):.1f}% below)")
assert val <= 0.75 * h, f"validation loss {val} is not 25% below the unigram entropy {h}"
evals = [l for l in lines if l.get("eval")]
steps = [e["step"] for e in evals]
assert steps == list(range(10, 10 * len(steps) + 1, 10)) and len(steps) >= 9, steps
assert all(e["val_rows"] == 64 and e["tokens_per_second"] > 0 for e in evals), evals[0]
assert evals[-1]["val_loss"] < evals[0]["val_loss"], "validation loss did not fall"
PY
python3 - "$work/full.jsonl" "$work/full/best.safetensors" <<'PY'
import json, sys
from safetensors import safe_open
lines = [json.loads(l) for l in open(sys.argv[1])]
losses = [l["val_loss"] if l.get("eval") else l["test_loss"] for l in lines]
with safe_open(sys.argv[2], "np") as f:
    best = float(f.metadata()["best_test_acc"])
assert abs(best - 1 / (1 + min(losses))) < 1e-12, (best, min(losses))
print(f"best.safetensors: validation loss {min(losses):.4f}, the lowest of {len(losses)} evaluations")
PY

# Stopped after epoch 1, resumed: the same tensors as the uninterrupted run.
"$DP_TRAIN" "${common[@]}" --save-dir "$work/part" --stop-after 1 > "$work/part1.log"
"$DP_TRAIN" "${common[@]}" --save-dir "$work/part" --resume "$work/part" > "$work/part2.log"
python3 "$here/same_tensors.py" "$work/full/epoch-0004.safetensors" "$work/part/epoch-0004.safetensors" ||
  fail "the resumed run differs from the uninterrupted one"
echo "resumed after epoch 1: epoch 4 bit for bit"

# Resumed from inside epoch 2 (the uninterrupted run's checkpoint at step 40): the same tensors and evaluations.
mid=$(ls "$work/full"/epoch-0001-batch-*.safetensors | head -1)
[ -n "$mid" ] || fail "no checkpoint inside epoch 2 in $work/full"
mkdir -p "$work/mid" && cp "$mid" "$work/mid/" && cp "$work/full.jsonl" "$work/mid.jsonl"
"$DP_TRAIN" "${common[@]}" --save-dir "$work/mid" --resume "$work/mid/$(basename "$mid")" --metrics "$work/mid.jsonl" \
  > "$work/mid.log"
python3 "$here/same_tensors.py" "$work/full/epoch-0004.safetensors" "$work/mid/epoch-0004.safetensors" ||
  fail "the run resumed inside epoch 2 differs from the uninterrupted one"
python3 - "$work/full.jsonl" "$work/mid.jsonl" <<'PY' || fail "the resumed run's metrics differ"
import json, sys
keys = ("eval", "step", "epoch", "train_loss", "val_loss", "test_loss", "lr", "train_acc", "val_acc", "test_acc")
a, b = ([{k: v for k, v in json.loads(l).items() if k in keys} for l in open(p)] for p in sys.argv[1:])
assert a == b, next((x, y) for x, y in zip(a, b) if x != y) if len(a) == len(b) else (len(a), len(b))
PY
echo "resumed inside epoch 2 ($(basename "$mid")): epoch 4 bit for bit, the same evaluation lines"

# --max-steps: the run ends at that step, mid-epoch.
"$DP_TRAIN" --model "$model" --data "text:$work/corpus.txt" --devices cpu --batch-size 32 --max-steps 7 --progress off \
  --save-dir "$work/steps" > "$work/steps.log"
python3 - "$work/steps/epoch-0001.safetensors" "$work/steps.log" <<'PY'
import json, re, sys
from safetensors import safe_open
with safe_open(sys.argv[1], "np") as f:
    step = f.metadata()["step"]
    epochs = json.loads(f.metadata()["config"])["epochs"]
assert step == "7", f"--max-steps 7 ended at step {step}"
# Alone, --max-steps sets the epochs it takes: the run ends in the last one (the schedule spans them).
done = [(int(a), int(b)) for a, b in re.findall(r"^epoch (\d+)/(\d+)  train loss", open(sys.argv[2]).read(), re.M)]
assert done and done[-1][0] == done[-1][1] == epochs, (done, epochs)
print("--max-steps 7: the checkpoint records step", step, "of", epochs, "epoch(s), the log", done[-1])
PY
# Further: resumed with a larger --max-steps, the run goes on past the epoch that ended on step 7.
"$DP_TRAIN" --model "$model" --data "text:$work/corpus.txt" --devices cpu --batch-size 32 --max-steps 9 --progress off \
  --resume "$work/steps" > "$work/steps9.log" 2>&1 || { cat "$work/steps9.log"; fail "the resume to step 9 failed"; }
python3 - "$work/steps" <<'PY'
import glob, sys
from safetensors import safe_open
newest = sorted(glob.glob(sys.argv[1] + "/epoch-*.safetensors"))[-1]
with safe_open(newest, "np") as f:
    step = f.metadata()["step"]
assert step == "9", f"resumed with --max-steps 9, {newest} records step {step}"
print("--max-steps 9 after 7: the newest checkpoint records step", step)
PY

# --max-steps alone, resumed inside epoch 2 (step 40 of 27-step epochs): step 45 ends in epoch 2 of 2.
mkdir -p "$work/mid45" && cp "$mid" "$work/mid45/"
"$DP_TRAIN" --model "$model" --data "text:$work/corpus.txt" --devices cpu:2 --batch-size 32 --optimizer adamw --lr 3e-3 \
  --lr-schedule warmup-cosine --warmup-steps 20 --lr-decay-steps 105 --progress off --eval-every 10 --eval-steps 2 \
  --max-steps 45 --resume "$work/mid45/$(basename "$mid")" > "$work/mid45.log" 2>&1 ||
  { cat "$work/mid45.log"; fail "the resume to step 45 failed"; }
grep -qE "^epoch 2/2  train loss" "$work/mid45.log" || { cat "$work/mid45.log"; fail "--max-steps 45 from step 40 did not end in epoch 2/2"; }
echo "--max-steps 45 from inside epoch 2: ends in epoch 2 of 2"

# Generation: the same seed, the same text; the prompt, then vocabulary characters.
gen=(--checkpoint "$work/full/best.safetensors" --prompt "The cat" --max-new-tokens 200 --seed 11)
"$DP_GENERATE" "${gen[@]}" > "$work/gen1.txt"
"$DP_GENERATE" "${gen[@]}" > "$work/gen2.txt"
cmp -s "$work/gen1.txt" "$work/gen2.txt" || fail "dp-generate printed different text for one seed"
# Without the key-value cache (the whole context for every token): the same draws.
"$DP_GENERATE" "${gen[@]}" --no-kv-cache > "$work/gen_whole.txt"
cmp -s "$work/gen1.txt" "$work/gen_whole.txt" || fail "dp-generate --no-kv-cache printed other text"
# The prompt from a file and from stdin, as it is (no newline added or cut): the same text.
printf 'The cat' > "$work/prompt.txt"
gen_file=(--checkpoint "$work/full/best.safetensors" --max-new-tokens 200 --seed 11)
"$DP_GENERATE" "${gen_file[@]}" --prompt-file "$work/prompt.txt" > "$work/gen_file.txt"
"$DP_GENERATE" "${gen_file[@]}" --prompt-file - < "$work/prompt.txt" > "$work/gen_stdin.txt"
cmp -s "$work/gen1.txt" "$work/gen_file.txt" || fail "dp-generate --prompt-file printed other text"
cmp -s "$work/gen1.txt" "$work/gen_stdin.txt" || fail "dp-generate --prompt-file - printed other text"
python3 - "$work/corpus.txt" "$work/gen1.txt" <<'PY'
import sys
vocab = set(open(sys.argv[1]).read())
out = open(sys.argv[2]).read()
assert out.startswith("The cat"), out[:40]
new = out[len("The cat"):-1]  # dp-generate ends each sample with a newline
assert len(new) == 200 and set(new) <= vocab, f"characters outside the vocabulary: {set(new) - vocab}"
print("dp-generate:", repr(out[:80]))
PY

# Bad input: one line, exit status 1.
expect_error() {  # expect_error TEXT COMMAND...
  local want=$1 rc=0
  shift
  "$@" > "$work/err.out" 2> "$work/err.txt" || rc=$?
  [ "$rc" = 1 ] || fail "exit status $rc, not 1: $*"
  [ "$(wc -l < "$work/err.txt")" = 1 ] || { cat "$work/err.txt"; fail "not one line: $*"; }
  grep -qF -- "$want" "$work/err.txt" || { cat "$work/err.txt"; fail "no '$want' in the error of: $*"; }
}
expect_error "--prompt: the character 'Q' is not in the model's vocabulary" \
  "$DP_GENERATE" --checkpoint "$work/full/best.safetensors" --prompt "Quiet"
expect_error "--prompt: the prompt is not UTF-8 at byte 1" \
  "$DP_GENERATE" --checkpoint "$work/full/best.safetensors" --prompt $'T\xff'
expect_error "--seed must be an integer in 0..18446744073709551615, got '-1'" \
  "$DP_GENERATE" --checkpoint "$work/full/best.safetensors" --seed -1
# Tokens print as they are drawn; options are checked before the prompt is printed.
expect_error "temperature must be positive and finite, got 0" \
  "$DP_GENERATE" --checkpoint "$work/full/best.safetensors" --prompt "The" --temperature 0
[ ! -s "$work/err.out" ] || fail "dp-generate printed before refusing --temperature 0: $(cat "$work/err.out")"
# A vocabulary of numbers in the checkpoint's metadata: one line, not a JSON library's exception.
python3 - "$work/full/best.safetensors" "$work/badvocab.safetensors" <<'PY'
import json, struct, sys
raw = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
head = json.loads(raw[8:8 + n])
cfg = json.loads(head["__metadata__"]["config"])
cfg["tokens"]["itos"] = list(range(len(cfg["tokens"]["itos"])))
head["__metadata__"]["config"] = json.dumps(cfg)
h = json.dumps(head).encode()
h += b" " * (-len(h) % 8)
open(sys.argv[2], "wb").write(struct.pack("<Q", len(h)) + h + raw[8 + n:])
PY
expect_error "badvocab.safetensors (its metadata's tokens): itos must list strings" \
  "$DP_GENERATE" --checkpoint "$work/badvocab.safetensors"
"$DP_TRAIN" --model mlp --data synthetic:64 --epochs 1 --devices cpu --progress off --save-dir "$work/mlp" > /dev/null
expect_error "holds model mlp, not a GPT" "$DP_GENERATE" --checkpoint "$work/mlp/best.safetensors"
expect_error "shorter than one window of 8001" \
  "$DP_TRAIN" --model "gpt:gpt-char,n_layer=1,n_head=1,n_embd=8,block_size=8000" --data "text:$work/corpus.txt" \
  --devices cpu --progress off
expect_error "cannot open text $work/none.txt" \
  "$DP_TRAIN" --model "$model" --data "text:$work/none.txt" --devices cpu --progress off
: > "$work/empty.txt"
expect_error "text $work/empty.txt is empty" \
  "$DP_TRAIN" --model "$model" --data "text:$work/empty.txt" --devices cpu --progress off

# A byte-level BPE (--tokenizer: files bpe_reference.py learns from the corpus, 150 merges): the text is
# encoded with it, the loss falls, and dp-generate encodes the prompt and decodes with the checkpoint's copy
# (the tokenizer's folder removed first). A model padded past the tokenizer's tokens (vocab_size 512) never
# draws the padding, even at temperature 3 over every token.
mkdir -p "$work/bpe"
python3 "$here/../data/bpe_reference.py" train "$work/corpus.txt" "$work/bpe" 150
for vocab in "" ",vocab_size=512"; do
  "$DP_TRAIN" --model "gpt:gpt-char,n_layer=2,n_head=4,n_embd=64,block_size=32,dropout=0$vocab" \
    --data "text:$work/corpus.txt" --tokenizer "$work/bpe" --devices cpu:2 --batch-size 16 --max-steps 40 \
    --optimizer adamw --lr 3e-3 --progress off --save-dir "$work/bpe-run$vocab" --metrics "$work/bpe$vocab.jsonl" \
    > "$work/bpe-run$vocab.log"
done
python3 - "$work/bpe.jsonl" "$work/bpe/vocab.json" <<'PY'
import json, math, sys
last = [json.loads(l) for l in open(sys.argv[1])][-1]["test_loss"]
uniform = math.log(len(json.load(open(sys.argv[2]))))
print(f"BPE: validation loss {last:.3f} after 40 steps (uniform over the tokens: {uniform:.3f})")
assert last < 0.6 * uniform, last
PY
mv "$work/bpe" "$work/bpe-gone"
"$DP_GENERATE" --checkpoint "$work/bpe-run/best.safetensors" --prompt "The cat" --max-new-tokens 60 --seed 3 \
  > "$work/bpe-gen1.txt"
"$DP_GENERATE" --checkpoint "$work/bpe-run/best.safetensors" --prompt "The cat" --max-new-tokens 60 --seed 3 \
  > "$work/bpe-gen2.txt"
cmp -s "$work/bpe-gen1.txt" "$work/bpe-gen2.txt" || fail "dp-generate (BPE) printed different text for one seed"
"$DP_GENERATE" --checkpoint "$work/bpe-run,vocab_size=512/best.safetensors" --prompt "The cat" --max-new-tokens 300 \
  --temperature 3 --top-k 0 --seed 5 > "$work/bpe-gen-padded.txt" ||
  fail "dp-generate drew a padding token of a model larger than its tokenizer"
# The same weights in Hugging Face's GPT-2 layout (GPT2Model's names, Conv1D's transposed matrices, the mask
# buffers), with the tokenizer's files: dp-generate --weights prints the same text.
python3 - "$work/bpe-run/best.safetensors" "$work/hf.safetensors" <<'PY'
import sys
import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file
out = {}
with safe_open(sys.argv[1], "np") as f:
    for name in f.keys():
        if name.startswith("optimizer."):
            continue
        t = f.get_tensor(name)
        bare = name[len("transformer."):]
        out[bare] = np.ascontiguousarray(t.T) if bare.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight")) else t
layers = 1 + max(int(k.split(".")[1]) for k in out if k.startswith("h."))
for i in range(layers):
    out[f"h.{i}.attn.bias"] = np.tril(np.ones((32, 32), np.float32)).reshape(1, 1, 32, 32)
save_file(out, sys.argv[2])
PY
"$DP_GENERATE" --weights "$work/hf.safetensors" --model "gpt:gpt-char,n_layer=2,n_head=4,n_embd=64,block_size=32,dropout=0" \
  --tokenizer "$work/bpe-gone" --prompt "The cat" --max-new-tokens 60 --seed 3 > "$work/bpe-gen-hf.txt"
cmp -s "$work/bpe-gen1.txt" "$work/bpe-gen-hf.txt" || fail "dp-generate --weights (Hugging Face's layout) printed other text"
# dp-train --init-from takes the same file (fine-tuning from Hugging Face's layout): every tensor matched.
"$DP_TRAIN" --model "gpt:gpt-char,n_layer=2,n_head=4,n_embd=64,block_size=32,dropout=0" --init-from "$work/hf.safetensors" \
  --data "text:$work/corpus.txt" --tokenizer "$work/bpe-gone" --devices cpu --batch-size 16 --max-steps 2 \
  --progress off > "$work/finetune.log"
grep -q "^initialized from $work/hf.safetensors: all tensors matched" "$work/finetune.log" ||
  { cat "$work/finetune.log"; fail "--init-from did not take Hugging Face's layout whole"; }
# --export-hf writes the checkpoint as Hugging Face's GPT-2 files; read back (the weights in that layout, the
# tokenizer from its vocab.json and merges.txt) they print the same text.
"$DP_GENERATE" --checkpoint "$work/bpe-run/best.safetensors" --export-hf "$work/hf-out" > "$work/export.log"
grep -q "^wrote $work/hf-out: model.safetensors, config.json, vocab.json, merges.txt, tokenizer_config.json" \
  "$work/export.log" || { cat "$work/export.log"; fail "--export-hf did not write the files"; }
"$DP_GENERATE" --weights "$work/hf-out/model.safetensors" --tokenizer "$work/hf-out" \
  --model "gpt:gpt-char,n_layer=2,n_head=4,n_embd=64,block_size=32,dropout=0,bias=true" --prompt "The cat" \
  --max-new-tokens 60 --seed 3 > "$work/bpe-gen-export.txt"
cmp -s "$work/bpe-gen1.txt" "$work/bpe-gen-export.txt" || fail "the exported model and tokenizer printed other text"
python3 - "$work/hf-out" "$work/bpe-gone/vocab.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1] + "/config.json"))
want = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_layer": 2, "n_head": 4, "n_embd": 64,
        "n_positions": 32, "vocab_size": len(json.load(open(sys.argv[2]))), "activation_function": "gelu",
        "layer_norm_epsilon": 1e-5, "tie_word_embeddings": True, "n_inner": None}
for k, v in want.items():
    assert c[k] == v, (k, c[k], v)
assert json.load(open(sys.argv[1] + "/vocab.json")) == json.load(open(sys.argv[2]))
PY
expect_error "--export-hf draws nothing: give no --prompt" \
  "$DP_GENERATE" --checkpoint "$work/bpe-run/best.safetensors" --export-hf "$work/hf-out" --prompt "x"
expect_error "--export-hf is empty" "$DP_GENERATE" --checkpoint "$work/bpe-run/best.safetensors" --export-hf ""
expect_error "give --prompt or --prompt-file, not both" \
  "$DP_GENERATE" --checkpoint "$work/full/best.safetensors" --prompt "x" --prompt-file "$work/prompt.txt"
# A character model exported over the BPE export: the BPE's tokenizer files would be loaded with it.
expect_error "--export-hf $work/hf-out holds vocab.json, merges.txt, tokenizer_config.json, which this export does not" \
  "$DP_GENERATE" --checkpoint "$work/full/best.safetensors" --export-hf "$work/hf-out"
expect_error "carries its own vocabulary: give no --tokenizer" \
  "$DP_GENERATE" --checkpoint "$work/bpe-run/best.safetensors" --tokenizer "$work/bpe-gone"
expect_error "--weights needs --model gpt:... and --tokenizer DIR" "$DP_GENERATE" --weights "$work/hf.safetensors"
python3 - "$work/corpus.txt" "$work/bpe-gen1.txt" <<'PY'
import sys
out = open(sys.argv[2], encoding="utf-8").read()
assert out.startswith("The cat"), out[:40]
words = set(open(sys.argv[1]).read().split())
new = out[len("The cat"):].split()
known = sum(w in words for w in new)
print("dp-generate (BPE):", repr(out[:80]), f"({known} of {len(new)} words from the corpus)")
assert known >= len(new) // 2, "mostly words the grammar does not have"
PY

# --init-from a checkpoint trained on another vocabulary of the same size: every tensor fits, but the ids
# stand for other characters: one warning; from the same vocabulary, none.
for v in 1 2; do
  for i in $(seq 300); do [ $v = 1 ] && echo "abcd dcba bad cab" || echo "wxyz zyxw zxw yxw"; done > "$work/v$v.txt"
done
tiny="gpt:gpt-char,n_layer=1,n_head=1,n_embd=8,block_size=8,dropout=0"
"$DP_TRAIN" --model "$tiny" --data "text:$work/v1.txt" --devices cpu --max-steps 2 --progress off \
  --save-dir "$work/v1" > /dev/null
for v in 1 2; do
  "$DP_TRAIN" --model "$tiny" --data "text:$work/v$v.txt" --devices cpu --max-steps 1 --progress off \
    --init-from "$work/v1/best.safetensors" > /dev/null 2> "$work/init$v.err"
done
grep -q "v1/best.safetensors was trained on another vocabulary than this data's" "$work/init2.err" ||
  { cat "$work/init2.err"; fail "--init-from across vocabularies gave no warning"; }
! grep -q "another vocabulary" "$work/init1.err" || fail "--init-from with the same vocabulary warned"

# The gpt2 preset's 50304 tokens on a text of 6 characters: a warning with the size to give; none once given.
for spec in "gpt:n_layer=1,n_head=1,n_embd=8,block_size=8" "gpt:n_layer=1,n_head=1,n_embd=8,block_size=8,vocab_size=6"; do
  "$DP_TRAIN" --model "$spec" --data "text:$work/v1.txt" --devices cpu --max-steps 1 --progress off \
    > /dev/null 2> "$work/vocab.err"
  if [[ $spec == *vocab_size=6 ]]; then
    [ ! -s "$work/vocab.err" ] || { cat "$work/vocab.err"; fail "vocab_size given: a warning"; }
  else
    grep -qF "dp-train: warning: the model's vocabulary of 50304 tokens is 8384x the data's 6: 50298 x 8 weights of the tied embedding and head stand for no token of the data (add vocab_size=6 to --model)" "$work/vocab.err" ||
      { cat "$work/vocab.err"; fail "gpt2's vocabulary on a 6-character text: no warning"; }
  fi
done

echo "e2e gpt_text: ok"
