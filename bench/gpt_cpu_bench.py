#!/usr/bin/env python3
"""GPT training steps on CPU devices, fanout beside PyTorch in one run, in
interleaved rounds so that drift in the machine's speed reaches both alike.

Each round runs, one after the other:
  fanout   dp-bench --devices cpu:N (one run: plain, DataParallel cpu:0,
           cpu:0..N-1 with the loss on the replicas and gathered, DDP)
  pytorch  bench/pytorch/gpt_step.py at --threads and at 1 thread
The step is nanoGPT's (AdamW with its two groups, clip_grad_norm_(1.0),
float32, random tokens; dropout 0, but 0.2 in char-dropout, nanoGPT's
shakespeare_char rate). Prints a Markdown table of the medians
over --rounds, each row against PyTorch's fastest thread count, and appends
every run to --json. --before runs another build (older code) in the same
rounds, its rows beside; --precision bf16-mixed runs both sides under
autocast; --plain measures fanout's one-device row alone (gpt2 with every
configuration in one process needs more than 24 GiB in bf16-mixed).

  python3 bench/gpt_cpu_bench.py --python /tmp/torchenv/bin/python [--configs char,gpt2]
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile

import benchutil  # noqa: E402  (bench/benchutil.py)

HERE = os.path.dirname(os.path.abspath(__file__))

# name: (dp-bench model, batch, tokens per row, betas, lr, fanout steps, fanout warm-up, gpt_step.py iters)
CONFIGS = {
    "char": ("gpt:gpt-char,n_layer=4,n_head=4,n_embd=128,block_size=64,dropout=0,vocab_size=65", 12, 64, "0.9,0.99",
             "1e-3", 20, 5, 20),
    "char-dropout": ("gpt:gpt-char,n_layer=4,n_head=4,n_embd=128,block_size=64,dropout=0.2,vocab_size=65", 12, 64,
                     "0.9,0.99", "1e-3", 20, 5, 20),
    "gpt2": ("gpt:gpt2,block_size=256", 2, 256, "0.9,0.95", "6e-4", 3, 1, 15),
    "head": ("gpt:gpt-char,n_layer=1,n_head=1,n_embd=64,block_size=256,dropout=0,vocab_size=50257", 8, 256,
             "0.9,0.95", "1e-3", 5, 1, 10),
}
ROWS = [("plain", "fanout one device (`plain cpu:0`, every core its threads)"),
        ("dp cpu:0", "fanout DataParallel `cpu:0`"),
        ("loss on replicas", "fanout DataParallel `cpu:2`, loss on the replicas"),
        ("gathered", "fanout DataParallel `cpu:2`, outputs gathered"),
        ("ddp", "fanout DDP, 2 processes x cpu")]


def fanout_run(args, name, build):
    model, batch, _, betas, _, steps, warmup, _ = CONFIGS[name]  # step mode's AdamW rate is fixed (1e-3)
    with tempfile.NamedTemporaryFile(suffix=".jsonl") as f:
        cmd = [os.path.join(build, "apps", "dp-bench"), "--model", model, "--batch-size", str(batch),
               "--optimizer", "adamw", "--betas", betas, "--clip-grad-norm", "1",
               "--no-decay-norm-bias", "--devices", "cpu" if args.plain else f"cpu:{args.devices}",
               *(["--no-ddp"] if args.plain else []), "--warmup", str(warmup), "--steps",
               str(steps), "--repeats", "1", "--precision", args.precision, "--json", f.name]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        rows = [json.loads(line) for line in open(f.name)]
    out = {}
    for key, _ in ROWS[:1] if args.plain else ROWS:
        hit = [r["ms_per_step"] for r in rows
               if r["config"] == key or r["config"].endswith(key) or r["config"].startswith(key + " ")]
        if hit:
            out[key] = hit[0]
    return out


def pytorch_run(args, name, threads):
    iters = CONFIGS[name][7]
    cmd = [args.python, os.path.join(HERE, "pytorch", "gpt_step.py"), "--configs", name, "--threads", str(threads),
           "--iters", str(iters), "--gpt2-batch", str(CONFIGS["gpt2"][1]), "--precision", args.precision]
    return benchutil.last_json(cmd)["ms_per_step"]


def main():
    p = benchutil.parser(__doc__)
    p.add_argument("--configs", default="char", help="comma list of: " + ", ".join(CONFIGS))
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--devices", type=int, default=2, help="fanout's cpu:N and PyTorch's threads")
    p.add_argument("--before", default="", help="another build (older code) measured in the same rounds")
    p.add_argument("--precision", default="32", choices=["32", "bf16-mixed"])
    p.add_argument("--plain", action="store_true", help="fanout's one-device row alone (one model in memory)")
    args = p.parse_args()
    for name in [c for c in args.configs.split(",") if c]:
        if name not in CONFIGS:
            sys.exit(f"gpt_cpu_bench: unknown config '{name}' (expected one of {', '.join(CONFIGS)})")
        runs = {key: [] for key, _ in ROWS}
        before = {key: [] for key, _ in ROWS}
        torch_runs = {args.devices: [], 1: []}
        for i in range(args.rounds):
            if args.before:
                for key, ms in fanout_run(args, name, args.before).items():
                    before[key].append(ms)
            for key, ms in fanout_run(args, name, args.build).items():
                runs[key].append(ms)
            for threads in torch_runs:
                torch_runs[threads].append(pytorch_run(args, name, threads))
            print(f"{name}: round {i + 1} of {args.rounds} done", file=sys.stderr, flush=True)
        med = {k: statistics.median(v) for k, v in runs.items() if v}
        bmed = {k: statistics.median(v) for k, v in before.items() if v}
        tmed = {t: statistics.median(v) for t, v in torch_runs.items()}
        best = min(tmed.values())
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps({"config": name, "model": CONFIGS[name][0], "precision": args.precision,
                                    "fanout_ms": runs, "before_ms": before if args.before else None,
                                    "pytorch_ms_by_threads": torch_runs, "rounds": args.rounds}) + "\n")
        tokens = CONFIGS[name][1] * CONFIGS[name][2]
        print(f"\n{CONFIGS[name][0]}, batch {CONFIGS[name][1]} of {CONFIGS[name][2]} tokens, precision "
              f"{args.precision}, medians of {args.rounds} interleaved rounds\n")
        bh, bs = ("before ms/step | ", "--- | ") if args.before else ("", "")
        print(f"| configuration | {bh}ms/step | tokens/s | vs PyTorch's fastest |")
        print(f"| --- | {bs}--- | --- | --- |")
        for key, label in ROWS:
            if key in med:
                b = f"{bmed[key]:.1f} | " if key in bmed else ("| " if args.before else "")
                print(f"| {label.replace('cpu:2', f'cpu:{args.devices}')} | {b}{med[key]:.1f} | "
                      f"{tokens / med[key] * 1e3:.0f} | {best / med[key]:.2f}x |")
        for t, ms in tmed.items():
            b = "| " if args.before else ""
            print(f"| PyTorch eager, {t} thread{'s' if t > 1 else ''} | {b}{ms:.1f} | {tokens / ms * 1e3:.0f} | "
                  f"{best / ms:.2f}x |")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
