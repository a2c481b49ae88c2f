#!/usr/bin/env python3
"""One CPU device, fanout beside PyTorch in one run: ms per training step of
every zoo model, each measured in interleaved pairs so that drift in the
machine's speed reaches both alike.

  fanout   dp-bench --devices cpu, the plain single-device row (oneDNN with
           every core as one device's threads)
  pytorch  bench/pytorch/train_throughput.py --device cpu with as many
           intra-op threads, NCHW and (its own row) channels_last

SGD, momentum 0.9, weight decay 5e-4, random inputs (no loader);
--precision bf16-mixed runs both sides under autocast. Prints a
Markdown table (medians of --pairs runs, each the mean of --steps steps
after warm-up) and writes every run as a JSON line to --json.

  python3 bench/cpu_step_bench.py --build build --python /tmp/torchenv/bin/python
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile

import benchutil  # noqa: E402  (bench/benchutil.py)

HERE = os.path.dirname(os.path.abspath(__file__))

# (model, batch, sample shape, timed steps per run)
CASES = [
    ("lenet", 32, "1x28x28", 40),
    ("lenet", 256, "1x28x28", 10),
    ("cnn", 128, "1x28x28", 6),
    ("resnet18", 32, "3x32x32", 3),
    ("mlp", 256, "1x28x28", 20),
    ("heatmap3d", 8, "1x32x32x32", 3),
]


def fanout_run(args, model, batch, shape, steps, build=None):
    with tempfile.NamedTemporaryFile(suffix=".jsonl") as f:
        cmd = [os.path.join(build or args.build, "apps", "dp-bench"), "--model", model, "--batch-size", str(batch),
               "--input", shape, "--devices", "cpu", "--no-ddp", "--warmup", "2", "--steps", str(steps),
               "--repeats", "1", "--precision", args.precision, "--json", f.name] + args.fanout_args
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        rows = [json.loads(line) for line in open(f.name)]
    return next(r["ms_per_step"] for r in rows if r["config"].startswith("plain"))


def pytorch_run(args, model, batch, shape, steps, channels_last):
    cmd = [args.python, os.path.join(HERE, "pytorch", "train_throughput.py"), "--device", "cpu", "--models", model,
           "--batch", str(batch), "--shape", shape, "--warmup", "2", "--iters", str(steps), "--lr", "0.01",
           "--threads", str(args.threads), "--precision", args.precision] + (["--channels-last"] if channels_last else [])
    return benchutil.last_json(cmd)["step_ms"]


def main():
    p = benchutil.parser(__doc__)
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="PyTorch's intra-op threads")
    p.add_argument("--before", default="", help="another build (older code) measured in the same pairs")
    p.add_argument("--models", default="", help="comma list of models to keep (default: every case)")
    p.add_argument("--no-channels-last", action="store_true", help="leave PyTorch's channels_last row out")
    p.add_argument("--precision", default="32", choices=["32", "bf16-mixed"])
    p.add_argument("fanout_args", nargs="*", help="after --: extra dp-bench arguments")
    args = p.parse_args()
    keep = set(m for m in args.models.split(",") if m)
    before = "fanout before ms/step | " if args.before else ""
    print(f"| model | batch | {before}fanout ms/step | PyTorch NCHW ms/step | PyTorch channels_last ms/step | "
          f"PyTorch best / fanout |")
    print("| --- | --- | " + "--- | " * (4 if args.before else 3) + "--- |")
    for model, batch, shape, steps in CASES:
        if keep and model not in keep:
            continue
        runs = {"fanout": [], "nchw": [], "cl": [], "before": []}
        for _ in range(args.pairs):
            if args.before:
                runs["before"].append(fanout_run(args, model, batch, shape, steps, args.before))
            runs["fanout"].append(fanout_run(args, model, batch, shape, steps))
            runs["nchw"].append(pytorch_run(args, model, batch, shape, steps, False))
            if not args.no_channels_last and model != "mlp":
                runs["cl"].append(pytorch_run(args, model, batch, shape, steps, True))
        med = {k: statistics.median(v) if v else None for k, v in runs.items()}
        best = min(v for k, v in med.items() if k in ("nchw", "cl") and v is not None)
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps({"model": model, "batch": batch, "shape": shape, "precision": args.precision,
                                    "runs_ms": runs,
                                    "median_ms": med, "pytorch_threads": args.threads}) + "\n")
        cl = f"{med['cl']:.2f}" if med["cl"] is not None else "-"
        b = f"{med['before']:.2f} | " if args.before else ""
        print(f"| {model} | {batch} | {b}{med['fanout']:.2f} | {med['nchw']:.2f} | {cl} | {best / med['fanout']:.2f} |",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
