#!/usr/bin/env python3
"""Choices are parsed once, at the edge: the strategy ("dp"/"ddp") in
runtime/train/run_config, the process-group backend ("gloo"/"nccl") in
runtime/parallel/engine_factory.cpp, the communicator in DataParallel's
make_comm, and model names in models/zoo/zoo.cpp. Everywhere else code asks
the parsed value (RunConfig::distributed(), CriterionKind,
ProcessGroup::host_memory(), models::dense_output(), ...). Lists every
comparison of such a string outside its edge and exits 1 if there is any.

  python3 test/layout/check_choices.py [SOURCE_DIR]
"""
import os
import re
import sys

WORDS = r"dp|ddp|mse|cross_entropy|gloo|nccl|p2p|mlp|lenet|cnn|resnet18[^\"]*|heatmap3d[^\"]*"
COMPARE = re.compile(r'(?:[=!]=\s*"(?:%s)")|(?:"(?:%s)"\s*[=!]=)' % (WORDS, WORDS))
# file -> why it may compare: it is where the string is parsed.
EDGES = {
    "runtime/train/run_config.h": "parses --strategy (RunConfig::distributed)",
    "runtime/train/run_config.cpp": "validates --strategy and --ddp-backend",
    "runtime/parallel/engine_factory.cpp": "resolves the process-group backend",
    "runtime/parallel/data_parallel.cpp": "resolves the communicator (make_comm)",
    "models/zoo/zoo.cpp": "the model table",
}
FOLDERS = ("runtime", "kernels", "models", "apps", "bench")
SOURCES = (".h", ".cpp", ".cu", ".cuh")


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    bad, scanned = [], 0
    for folder in FOLDERS:
        for dirpath, _, files in os.walk(os.path.join(root, folder)):
            for f in sorted(files):
                if not f.endswith(SOURCES):
                    continue
                path = os.path.join(dirpath, f)
                rel = os.path.relpath(path, root).replace(os.sep, "/")
                scanned += 1
                if rel in EDGES:
                    continue
                with open(path, encoding="utf-8", errors="replace") as fh:
                    for n, line in enumerate(fh, 1):
                        code = line.split("//", 1)[0]
                        if COMPARE.search(code):
                            bad.append(f"{rel}:{n}: {line.strip()}")
    if scanned == 0:
        print(f"check_choices.py: no sources under {root}")
        return 1
    for b in bad:
        print(b)
    print(f"{len(bad)} comparison(s) of a parsed choice outside its edge in {scanned} files")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
