#!/usr/bin/env python3
"""same_tensors.py REF RUN...: each RUN safetensors file holds REF's tensors
bit for bit (the same names, dtypes and bytes); exit 1 naming the first
difference."""
import sys

from safetensors.numpy import load_file


def main():
    if len(sys.argv) < 3:
        sys.exit("usage: same_tensors.py REF RUN...")
    ref = load_file(sys.argv[1])
    for run in sys.argv[2:]:
        got = load_file(run)
        if sorted(got) != sorted(ref):
            sys.exit(f"{run}: tensors {sorted(set(got) ^ set(ref))} are not in both")
        for k in ref:
            if got[k].dtype != ref[k].dtype or got[k].tobytes() != ref[k].tobytes():
                sys.exit(f"{run}: {k} differs from {sys.argv[1]}")
    print(f"{len(sys.argv) - 2} checkpoint(s) equal {sys.argv[1]} bit for bit ({len(ref)} tensors)")


if __name__ == "__main__":
    main()
