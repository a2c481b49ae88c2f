"""What the layout checks share: the tree they read, its source files, and
the report (every finding on a line of its own, a summary, the exit code)."""
import os
import sys


def source_root():
    """The source tree: the first argument, else the one this script is in."""
    here = os.path.dirname(os.path.abspath(sys.argv[0]))
    return os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", ".."))


def sources(root, folders, suffixes):
    """(path relative to root with '/', full path) of every file under folders ending in suffixes, sorted."""
    for folder in folders:
        for dirpath, dirs, files in os.walk(os.path.join(root, folder)):
            dirs.sort()
            for f in sorted(files):
                if f.endswith(suffixes):
                    path = os.path.join(dirpath, f)
                    yield os.path.relpath(path, root).replace(os.sep, "/"), path


def report(findings, scanned, summary):
    """Prints the findings and the summary; exit code 1 when there are findings or nothing was read."""
    if scanned == 0:
        print(f"{os.path.basename(sys.argv[0])}: nothing to check under {source_root()}")
        return 1
    for line in findings:
        print(line)
    print(summary)
    return 1 if findings else 0
