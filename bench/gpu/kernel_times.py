#!/usr/bin/env python3
"""Sums the GPU time of each kernel in an Nsight Compute CSV
(`ncu --csv --print-units base --metrics gpu__time_duration.sum ...`) and
groups it: where a training step's GPU time goes.

  kernel_times.py NCU.csv [--steps N] [--top K]

--steps divides every total by the number of steps the profiled run took, so
the table reads per step. Kernels are profiled one at a time (ncu serializes
them), so the sum is GPU busy time, not the step's wall time.
"""
import argparse
import csv
import re
import sys
from collections import defaultdict

GROUPS = [  # first match wins; matched against the kernel's name in lower case
    ("channels-last copies (narrow/widen)", r"narrow_last_kernel|widen_first_kernel|transpose_kernel"),
    ("convert (narrow/widen/round)", r"narrow_kernel|widen_kernel|add_widened|round_kernel"),
    ("cuDNN layout transposes (NCHW<->NHWC)", r"nchwtonhwc|nhwctonchw"),
    # cuDNN's batch-norm graphs (their names say bn or norm; before the broad cuDNN pattern below)
    ("BatchNorm", r"bn_fw|bn_bw|bnfwd|bnbwd|batch_?norm|nhwc_?bn|norm_?(fwd|bwd|fprop|bprop)|dbn|sgbn"),
    # the GPT's kernels (before the broad cuDNN pattern: cuDNN's fused attention says sdpa or fmha)
    ("attention (cuDNN SDPA, fanout's softmax)", r"sdpa|fmha|flash|softmax_(forward|backward)_kernel|lse_rows|"
                                                  r"heads_kernel"),
    ("LayerNorm", r"ln_forward|ln_dx|layer_?norm|paramgrad"),  # ParamGrad(Fin): its weight and bias gradients
    # the row-block sums of bias gradients (linear and convolution layers): detail::channel_sum_add
    ("bias gradients (channel sums)", r"channelsum"),
    ("embedding (gather, sorted sums)", r"embedding_|pairs_kernel|radix|onesweep"),
    ("cuDNN convolution", r"conv|cudnn|fprop|dgrad|wgrad|winograd|implicit"),
    # cuBLAS's kernels (sm90_xmma_gemm_..., cutlass ...gemm...); a plain GEMM kernel cuDNN picks lands here too
    ("GEMM kernels (cuBLAS)", r"gemm|cublas|gemv|xmma|cutlass|sm90_|sm80_"),
    ("BatchNorm", r"channel_partials|partials_kernel<.*stats<|channel_finish|finalize_kernel|[^_]apply_kernel<|"
                  r"^void kernels::<unnamed>::(backward_)?apply_kernel|apply_add_relu_kernel|eval_kernel|batch_?norm"),
    ("optimizer", r"sgd_kernel|adam_kernel|scale_matrix|clamp_kernel"),
    ("pooling", r"pool"),
    ("loss", r"xent|count_correct|argmax"),
    ("elementwise (ReLU, add, bias)", r"map2_kernel|add_bias|broadcast_rows|column_sum|elementwise"),
    ("reduction (norms, sums)", r"reduce|cub::"),
    ("copies and fills", r"memcpy|memset|fill|copy"),
]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("csv")
    p.add_argument("--steps", type=float, default=1.0)
    p.add_argument("--top", type=int, default=25)
    a = p.parse_args()
    scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3, "second": 1e6}
    by_kernel = defaultdict(float)
    count = defaultdict(int)
    with open(a.csv, newline="") as f:
        lines = [l for l in f if l.startswith('"')]  # ncu prints its own lines before the table
    for row in csv.DictReader(lines):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        unit = row.get("Metric Unit", "nsecond")
        try:
            v = float(row["Metric Value"].replace(",", "")) * scale.get(unit, 1e-3)
        except ValueError:
            continue
        name = row["Kernel Name"]
        by_kernel[name] += v
        count[name] += 1
    if not by_kernel:
        sys.exit(f"{a.csv}: no gpu__time_duration.sum rows")
    total = sum(by_kernel.values())
    groups = defaultdict(float)
    for name, v in by_kernel.items():
        low = name.lower()
        g = next((g for g, rx in GROUPS if re.search(rx, low)), "other")
        groups[g] += v
    print(f"{sum(count.values())} kernels, {total / a.steps / 1e3:.3f} ms of GPU time per step ({a.steps:g} steps)")
    print(f"{'group':40} {'ms/step':>9} {'share':>7}")
    for g, v in sorted(groups.items(), key=lambda kv: -kv[1]):
        print(f"{g:40} {v / a.steps / 1e3:9.3f} {100 * v / total:6.1f}%")
    print(f"\ntop {a.top} kernels")
    print(f"{'us/step':>9} {'calls/step':>10}  kernel")
    for name, v in sorted(by_kernel.items(), key=lambda kv: -kv[1])[: a.top]:
        print(f"{v / a.steps:9.1f} {count[name] / a.steps:10.1f}  {name[:110]}")


if __name__ == "__main__":
    main()
