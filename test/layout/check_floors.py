#!/usr/bin/env python3
"""The floors of the tree (DESIGN.md, README "Layout"): each floor includes
only its own and lower floors' headers. Lists every include that runs from a
lower floor to a higher one, and every source file on no floor, and exits 1
if there is any.

  python3 test/layout/check_floors.py [SOURCE_DIR]
"""
import re
import sys

from layout_common import report, source_root, sources

# Lowest first. A path belongs to the floor of its longest matching prefix.
FLOORS = [
    # The CUDA backend's folder holds pieces of three floors: its error
    # macros, launch helpers, allocator and streams are core's ...
    ("core", ["runtime/core/", "runtime/cuda/cuda_check.h", "runtime/cuda/launch.cuh",
              "runtime/cuda/backend_cuda.cpp", "runtime/cuda/elementwise."]),
    ("kernels", ["kernels/"]),
    ("nn and models", ["runtime/nn/", "models/"]),
    ("optim", ["runtime/optim/"]),
    # ... its p2p communicator parallel's and its NCCL group distributed's.
    ("parallel and distributed", ["runtime/parallel/", "runtime/distributed/", "runtime/cuda/comm_cuda.cpp",
                           "runtime/cuda/nccl_group.cpp"]),
    ("data and io", ["runtime/data/", "runtime/io/"]),
    ("train", ["runtime/train/"]),
    ("apps", ["apps/", "bench/"]),
]
SOURCES = (".h", ".cpp", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def floor_of(path):
    best = None
    for level, (_, prefixes) in enumerate(FLOORS):
        for p in prefixes:
            if path.startswith(p) and (best is None or len(p) > best[1]):
                best = (level, len(p))
    return None if best is None else best[0]


def main():
    root = source_root()
    bad, files = [], 0
    for path, full in sources(root, ("runtime", "kernels", "models", "apps", "bench"), SOURCES):
        here = floor_of(path)
        if here is None:  # a new folder or CUDA backend file: give it its floor above
            bad.append(f"{path}: on no floor (add it to FLOORS in test/layout/check_floors.py)")
            continue
        files += 1
        with open(full, encoding="utf-8", errors="replace") as f:
            for n, line in enumerate(f, 1):
                m = INCLUDE.match(line)
                there = floor_of(m.group(1)) if m else None
                if there is not None and there > here:
                    bad.append(f"{path}:{n}: {FLOORS[here][0]} includes {m.group(1)} ({FLOORS[there][0]})")
    return report(bad, files, f"{files} files, {len(bad)} finding(s); the floors, lowest first: "
                  + " < ".join(name for name, _ in FLOORS))


if __name__ == "__main__":
    sys.exit(main())
