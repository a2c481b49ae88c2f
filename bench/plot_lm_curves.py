#!/usr/bin/env python3
"""Validation-loss curves of language-model runs in one PNG, and a Markdown
table of where each run ended: dp-train's --metrics files (their evaluation
lines, {"eval": true, "step", "val_loss", "elapsed_seconds", ...}) beside
bench/pytorch/nanogpt_train.py's --json files ({"framework": "pytorch",
...}), as bench/nanogpt_side_by_side.sh writes them.

The table: per run the last evaluation's step and validation loss, the
training wall time to it (elapsed_seconds, evaluations excluded; a file with
no evaluation lines falls back to its epochs' epoch_seconds), the mean
training tokens per second over that time when --tokens-per-step is given,
and the time as a multiple of the first run's.

  plot_lm_curves.py --out curves.png [--title T] [--tokens-per-step N] LABEL=FILE ...
"""
import argparse
import json
import sys


def read_run(path):
    """(evaluation lines sorted by step, epoch-end lines) of one metrics file."""
    evals, epochs = [], []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            j = json.loads(line)
            if j.get("eval") or (j.get("framework") == "pytorch" and "val_loss" in j):
                evals.append(j)
            elif "epoch_seconds" in j:
                epochs.append(j)
    evals.sort(key=lambda j: j["step"])
    return evals, epochs


def summary(label, evals, epochs, tokens_per_step):
    row = {"label": label, "step": None, "val_loss": None, "seconds": None, "tokens_per_second": None}
    if evals:
        last = evals[-1]
        row.update(step=last["step"], val_loss=last["val_loss"], seconds=last.get("elapsed_seconds"))
    elif epochs:
        row.update(val_loss=epochs[-1].get("test_loss"), seconds=sum(e["epoch_seconds"] for e in epochs))
    if tokens_per_step and row["step"] and row["seconds"]:
        row["tokens_per_second"] = tokens_per_step * row["step"] / row["seconds"]
    return row


def table(rows):
    base = rows[0]["seconds"] if rows and rows[0]["seconds"] else None
    fmt = lambda v, f: "-" if v is None else format(v, f)  # noqa: E731
    out = ["| run | last step | final val loss | training time (s) | tokens/s | time / " + rows[0]["label"] + " |",
           "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        ratio = r["seconds"] / base if base and r["seconds"] else None
        out.append(f"| {r['label']} | {fmt(r['step'], 'd')} | {fmt(r['val_loss'], '.4f')} | "
                   f"{fmt(r['seconds'], '.1f')} | {fmt(r['tokens_per_second'], '.0f')} | {fmt(ratio, '.2f')} |")
    return "\n".join(out)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", metavar="LABEL=FILE")
    p.add_argument("--out", required=True, help="the PNG to write")
    p.add_argument("--title", default="validation loss")
    p.add_argument("--tokens-per-step", type=int, default=0, help="batch x block, for the tokens/s column")
    args = p.parse_args()
    runs = []
    for spec in args.runs:
        label, sep, path = spec.partition("=")
        if not sep or not label or not path:
            p.error(f"expected LABEL=FILE, got {spec!r}")
        runs.append((label, *read_run(path)))
    print(table([summary(label, e, ep, args.tokens_per_step) for label, e, ep in runs]))
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        print(f"plot_lm_curves.py: matplotlib is not installed ({e}); no plot", file=sys.stderr)
        return 4
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    markers = "osv^Dx"
    for k, (label, evals, _) in enumerate(runs):
        if not evals:
            print(f"plot_lm_curves.py: {label} has no evaluation lines; not plotted", file=sys.stderr)
            continue
        style = "--" if label.lower().startswith(("pytorch", "torch")) else "-"
        # Runs that coincide (fanout on one device and on several) stay visible: markers and widths differ.
        ax.plot([j["step"] for j in evals], [j["val_loss"] for j in evals], style, marker=markers[k % len(markers)],
                markersize=6 - k % 3, linewidth=2.2 - 0.5 * (k % 3), markerfacecolor="none" if k % 2 else None,
                label=label)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("validation loss (mean token cross-entropy)")
    ax.set_title(args.title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
