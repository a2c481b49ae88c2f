"""Sums up the tests ctest skipped (its "(Skipped)" lines in the log given),
by reason. Under CI=true, a skip with no documented reason fails (exit 1):
a CUDA test skips only where no GPU is visible, a test of CUDA-only behaviour
on its CPU instance, the PyTorch conformance test only where PyTorch is not
installed; anything else skipping in CI (a missing
Redis, oneDNN 3's headers not fetched) is a broken set-up, not a pass."""
import os
import re
import sys

# The /cpu instances of tests of CUDA-only behaviour (TF32 math, the CUDA
# loss's NaN for a bad label), which skip on every machine.
CUDA_ONLY = ("ConvOnBackend.Tf32WithinTf32Tolerance/cpu", "GemmOnBackend.Tf32WithinTf32Tolerance/cpu",
             "SoftmaxXentOnBackend.LabelOutOfRangeGivesNanLossOnCuda/cpu",
             "AttentionOnBackend.FusedCudnnPathOnHopper/cpu")

REASONS = (
    ("no GPU visible", re.compile(r"(^|[./])Cuda|/cuda\b")),
    ("CUDA-only behaviour, CPU instance", re.compile("^(" + "|".join(re.escape(n) for n in CUDA_ONLY) + ")$")),
    ("PyTorch not installed", re.compile(r"^models\.(gpt_)?torch_python_interop$")),
)


def main():
    skipped = []
    with open(sys.argv[1], errors="replace") as log:
        for line in log:
            m = re.match(r"\s*\d+ - (\S+).*\(Skipped\)\s*$", line)
            if m:
                skipped.append(m.group(1))
    counts = {reason: 0 for reason, _ in REASONS}
    other = []
    for name in skipped:
        for reason, pattern in REASONS:
            if pattern.search(name):
                counts[reason] += 1
                break
        else:
            other.append(name)
    print(f"skip summary: {len(skipped)} skipped", end="")
    print("".join(f"; {n} {reason}" for reason, n in counts.items() if n), end="")
    print(f"; {len(other)} for another reason" if other else "")
    for name in other:
        print(f"  skipped for another reason: {name}")
    if other and os.environ.get("CI") == "true":
        print("skip summary: under CI=true only the documented skips are allowed", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
