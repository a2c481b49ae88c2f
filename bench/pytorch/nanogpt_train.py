#!/usr/bin/env python3
"""Trains bench/pytorch/gpt.py (nanoGPT's model) on a token directory the way
fanout's dp-train trains its GPT, batch for batch, for side-by-side curves
(bench/nanogpt_side_by_side.sh).

What matches dp-train (--data tokens:DIR or text:FILE, one process, no
--drop-last, --accumulate 1):
  data     train.bin / val.bin (flat uint16) and meta.json's vocab_size, as
           fanout writes them; window i of a split is tokens
           [i * block, i * block + block + 1), x its first block tokens and y
           the block after the first; (len - 1) // block windows.
  batches  epoch e's order is fanout's shuffled_indices(n_train, seed, e)
           (window_order.py); batch b of the epoch is order[b*B : (b+1)*B],
           the last one short when B does not divide n_train; the next epoch
           goes on with its own order.
  step     mean cross-entropy over the batch's tokens, backward,
           clip_grad_norm_ (--clip-grad-norm, 0: off), AdamW with nanoGPT's
           two groups (--weight-decay on parameters of two or more
           dimensions, none on the rest: dp-train's --no-decay-norm-bias).
  lr       runtime/optim/lr_schedule.cpp's warmup-cosine at the 0-based index
           of the step: lr (it + 1) / (warmup + 1) while it < warmup, min_lr
           after lr_decay_steps, the cosine from lr to min_lr between; with
           fanout's float32 and double steps, to the bit.
  eval     after every --eval-every optimizer steps (and after the last step):
           the validation loss (mean token cross-entropy, eval mode, no
           gradients) on R = min(K B, n_val) windows floor(i n_val / R) for
           --eval-steps K (0: every window); the train loss is the mean over
           the steps since the previous evaluation.

What does not match: the initial weights (torch's generator under
torch.manual_seed(--seed), as nanoGPT initializes, against fanout's own) and
so every loss after them, unless dp-train starts from this run's:
--save-init FILE writes them for dp-train --init-from FILE; then only the
kernels' float rounding differs.

Output: one JSON line per evaluation appended to --json (and a summary line
on stdout):
  {"framework": "pytorch", "step", "epoch", "train_loss", "val_loss",
   "elapsed_seconds" (training wall time so far, evaluations excluded),
   "tokens_per_second" (since the previous evaluation), "lr", "val_rows"}

  python bench/pytorch/nanogpt_train.py --data DIR --max-steps 2000 --json out.jsonl
"""
import argparse
import json
import math
import os
import struct
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt  # noqa: E402  (bench/pytorch/gpt.py)
import window_order  # noqa: E402  (bench/pytorch/window_order.py)
from token_windows import Windows  # noqa: E402  (bench/pytorch/token_windows.py)


def f32(v):
    """v rounded to float32, as a Python float."""
    return struct.unpack("f", struct.pack("f", v))[0]


def warmup_cosine(it, lr, min_lr, warmup, decay):
    """fanout's warmup-cosine learning rate for 0-based step `it` (float32 in, float32 out)."""
    lr, min_lr = f32(lr), f32(min_lr)
    if it < warmup:
        return f32(lr * (it + 1) / (warmup + 1))
    if it > decay:
        return min_lr
    ratio = (it - warmup) / (decay - warmup)
    # lr - min_lr is a float32 difference there (two floats), the rest double.
    return f32(min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * f32(lr - min_lr))


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="token directory: train.bin, val.bin, meta.json")
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--n-embd", type=int, default=128)
    p.add_argument("--block-size", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=12)
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--bias", action="store_true", help="biases in LayerNorm and Linear (gpt-char has none)")
    p.add_argument("--max-steps", type=int, default=2000)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--min-lr", type=float, default=None, help="default: lr / 10")
    p.add_argument("--warmup-steps", type=int, default=100)
    p.add_argument("--lr-decay-steps", type=int, default=None, help="default: --max-steps")
    p.add_argument("--beta1", type=float, default=0.9)
    p.add_argument("--beta2", type=float, default=0.99)
    p.add_argument("--eps", type=float, default=1e-8)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--clip-grad-norm", type=float, default=1.0, help="0: off")
    p.add_argument("--seed", type=int, default=0, help="torch.manual_seed and fanout's shuffling seed")
    p.add_argument("--eval-every", type=int, default=250)
    p.add_argument("--eval-steps", type=int, default=200, help="validation batches per evaluation (0: all)")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--json", default=None, help="append one JSON line per evaluation here")
    p.add_argument("--save-init", default=None, metavar="FILE",
                   help="write the initial weights as safetensors in fanout's names (for dp-train --init-from)")
    a = p.parse_args()
    if a.min_lr is None:
        a.min_lr = a.lr / 10
    if a.lr_decay_steps is None:
        a.lr_decay_steps = a.max_steps
    if a.max_steps < 1 or a.batch_size < 1 or a.eval_every < 1 or a.eval_steps < 0:
        p.error("--max-steps, --batch-size and --eval-every must be positive, --eval-steps non-negative")
    if not 0 <= a.warmup_steps < a.lr_decay_steps:
        p.error("warmup-cosine needs 0 <= --warmup-steps < --lr-decay-steps")
    if not 0 <= a.seed < 2 ** 64:
        p.error("--seed must be in [0, 2^64)")
    return a


def save_fanout_weights(model, path):
    """The model's weights as fanout's state_dict names them: the tied lm_head weight only as wte's."""
    from safetensors.torch import save_file
    state = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    save_file(state, path)


@torch.no_grad()
def evaluate(model, val, rows, batch):
    model.eval()
    total, tokens = 0.0, 0
    for b in range(0, len(rows), batch):
        x, y = val.batch(rows[b:b + batch])
        logits, _ = model(x, y)
        total += F.cross_entropy(logits.view(-1, logits.size(-1)), y.reshape(-1), reduction="sum").item()
        tokens += y.numel()
    model.train()
    return total / tokens


def main():
    a = parse_args()
    torch.set_num_threads(a.threads)
    with open(os.path.join(a.data, "meta.json")) as f:
        vocab = json.load(f)["vocab_size"]
    train = Windows(os.path.join(a.data, "train.bin"), a.block_size)
    val = Windows(os.path.join(a.data, "val.bin"), a.block_size)
    val_rows = window_order.eval_subset(val.n, window_order.eval_rows(val.n, a.eval_steps, a.batch_size))

    torch.manual_seed(a.seed)
    config = gpt.GPTConfig(block_size=a.block_size, vocab_size=vocab, n_layer=a.n_layer, n_head=a.n_head,
                           n_embd=a.n_embd, dropout=a.dropout, bias=a.bias)
    model = gpt.GPT(config)
    model.train()
    if a.save_init:
        save_fanout_weights(model, a.save_init)
    opt = torch.optim.AdamW(model.optimizer_groups(a.weight_decay), lr=a.lr, betas=(a.beta1, a.beta2), eps=a.eps)
    params = [p for p in model.parameters() if p.requires_grad]
    print(f"pytorch {torch.__version__}: {model.num_params(non_embedding=False)} parameters, vocab {vocab}, "
          f"{train.n} training and {val.n} validation windows ({len(val_rows)} evaluated), "
          f"{a.threads} threads", flush=True)

    out = open(a.json, "a") if a.json else None
    batches = window_order.train_batches(train.n, a.batch_size, a.seed)
    trained = 0.0  # seconds of training, evaluations excluded
    since_loss, since_tokens = 0.0, 0
    seconds_at_eval = 0.0
    for step in range(a.max_steps):
        t0 = time.perf_counter()
        epoch, indices = next(batches)
        x, y = train.batch(indices)
        lr = warmup_cosine(step, a.lr, a.min_lr, a.warmup_steps, a.lr_decay_steps)
        for g in opt.param_groups:
            g["lr"] = lr
        _, loss = model(x, y)
        loss.backward()
        if a.clip_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(params, a.clip_grad_norm)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss_value = loss.item()
        trained += time.perf_counter() - t0
        if not math.isfinite(loss_value):
            raise SystemExit(f"training diverged: loss is {loss_value} at step {step + 1}")
        # The mean over the steps' tokens (a short last batch of an epoch weighs by its tokens).
        since_loss += loss_value * y.numel()
        since_tokens += y.numel()
        done = step + 1
        if done % a.eval_every == 0 or done == a.max_steps:
            val_loss = evaluate(model, val, val_rows, a.batch_size)
            dt = trained - seconds_at_eval
            line = {"framework": "pytorch", "step": done, "epoch": epoch + 1, "train_loss": since_loss / since_tokens,
                    "val_loss": val_loss, "elapsed_seconds": trained,
                    "tokens_per_second": since_tokens / dt if dt > 0 else 0.0, "lr": lr, "val_rows": len(val_rows),
                    "threads": a.threads}
            print(f"step {done}/{a.max_steps}  train loss {line['train_loss']:.4f}  val loss {val_loss:.4f}  "
                  f"{line['tokens_per_second']:.0f} tokens/s  lr {lr:.4g}  {trained:.1f} s", flush=True)
            if out:
                out.write(json.dumps(line) + "\n")
                out.flush()
            seconds_at_eval = trained
            since_loss, since_tokens = 0.0, 0
    if out:
        out.close()


if __name__ == "__main__":
    main()
