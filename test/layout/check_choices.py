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
import re
import sys

from layout_common import report, source_root, sources

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
    root = source_root()
    bad, scanned = [], 0
    for rel, path in sources(root, FOLDERS, SOURCES):
        scanned += 1
        if rel in EDGES:
            continue
        with open(path, encoding="utf-8", errors="replace") as fh:
            for n, line in enumerate(fh, 1):
                if COMPARE.search(line.split("//", 1)[0]):
                    bad.append(f"{rel}:{n}: {line.strip()}")
    return report(bad, scanned, f"{len(bad)} comparison(s) of a parsed choice outside its edge in {scanned} files")


if __name__ == "__main__":
    sys.exit(main())
