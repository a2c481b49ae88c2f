"""What the PyTorch conformance scripts share. Importing it exits 77
(skipped) without torch and safetensors, and puts bench/pytorch (the
reference models) on the path."""
import os
import sys

try:
    import torch  # noqa: F401
    import safetensors.torch  # noqa: F401
except ImportError as e:
    print(f"{os.path.basename(sys.argv[0])}: skipped, needs torch and safetensors ({e})")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench", "pytorch"))


def rel(a, b, slack=None, scale=None):
    """max |a - b| (less `slack` per element) over `scale` (default max |b|)."""
    scale = max(b.abs().max().item() if scale is None else scale, 1e-30)
    diff = (a.double() - b.double()).abs()
    if slack is not None:
        diff = (diff - slack).clamp(min=0)
    return diff.max().item() / scale


def tool_from(args, usage):
    """The torch_tool path: the first argument, else $TORCH_TOOL."""
    tool = args[0] if args else os.environ.get("TORCH_TOOL")
    if not tool:
        raise SystemExit("usage: " + usage)
    return tool


def verdict(checks, failures):
    """Prints the count and the misses; the exit status (1 on any miss)."""
    print(f"{checks - len(failures)} of {checks} checks within tolerance")
    if failures:
        print("misses: " + ", ".join(failures))
        return 1
    return 0
