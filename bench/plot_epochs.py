#!/usr/bin/env python3
"""Plots `dp-bench --epochs` results: epoch time per configuration, fanout
beside PyTorch, one panel per setting (model, data, devices, batch), from the
latest invocation of each setting in the JSON-lines file. Bars are the median
run; the whisker spans the fastest and slowest run; each bar is labelled with
its speed-up over the same framework's one device and the test accuracy.

  plot_epochs.py --json results.jsonl --out epochs.png
  plot_epochs.py --check     (exits 0 when matplotlib imports)
"""
import argparse
import json
import sys

MODES = ["one device", "DP", "DDP", "hybrid"]
COLOURS = {"fanout": "#1f77b4", "pytorch": "#ee4c2c"}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json")
    p.add_argument("--out")
    p.add_argument("--check", action="store_true")
    args = p.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        print(f"plot_epochs.py: matplotlib is not installed ({e})", file=sys.stderr)
        return 4
    if args.check:
        return 0
    if not args.json or not args.out:
        p.error("--json and --out are required")
    rows = []
    with open(args.json) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            j = json.loads(line)
            if j.get("bench") == "epochs":
                rows.append(j)
    if not rows:
        print(f"plot_epochs.py: no dp-bench --epochs results in {args.json}", file=sys.stderr)
        return 1
    # The latest invocation of each setting.
    settings = {}
    for r in rows:
        key = (r["model"], r["data"], r["devices"], r["batch_size"])
        if key not in settings or r["run_id"] > settings[key][0]:
            settings[key] = (r["run_id"], [])
    for r in rows:
        key = (r["model"], r["data"], r["devices"], r["batch_size"])
        if r["run_id"] == settings[key][0]:
            settings[key][1].append(r)

    fig, axes = plt.subplots(1, len(settings), figsize=(6.5 * len(settings), 4.8), squeeze=False)
    for ax, (key, (_, rs)) in zip(axes[0], sorted(settings.items())):
        model, data, devices, batch = key
        rs = sorted(rs, key=lambda r: (MODES.index(r["mode"]) if r["mode"] in MODES else 9, r["framework"]))
        labels, heights, lo, hi, colours, notes = [], [], [], [], [], []
        for r in rs:
            labels.append(r["config"].replace("fanout ", "fanout\n").replace("PyTorch ", "PyTorch\n"))
            colours.append(COLOURS.get(r["framework"], "grey"))
            if "epoch_seconds" in r:
                m = r["epoch_seconds"]
                heights.append(m)
                lo.append(m - r["epoch_seconds_min"])
                hi.append(r["epoch_seconds_max"] - m)
                notes.append(f'{r["speedup_vs_one_device"]:.2f}x\nacc {r["test_acc"]:.3f}')
            else:
                heights.append(0)
                lo.append(0)
                hi.append(0)
                notes.append(r["status"].replace(": ", ":\n"))
        x = range(len(rs))
        ax.bar(x, heights, color=colours, yerr=[lo, hi], capsize=4)
        top = max(heights) if max(heights) > 0 else 1
        for i, (h, note) in enumerate(zip(heights, notes)):
            ax.text(i, h + 0.02 * top, note, ha="center", va="bottom", fontsize=7)
        ax.set_xticks(list(x))
        ax.set_xticklabels(labels, fontsize=7)
        ax.set_ylabel("epoch seconds (median run; whiskers: fastest, slowest)")
        ax.set_ylim(0, top * 1.3)
        cores = rs[0].get("host_cores", "?")
        ax.set_title(f"{model} on {data}, batch {batch}, devices {devices}, {cores} cores", fontsize=9)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in COLOURS.values()]
    fig.legend(handles, ["fanout", "PyTorch"], loc="lower center", ncol=2)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(args.out, dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main())
