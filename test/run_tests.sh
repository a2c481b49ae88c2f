#!/usr/bin/env bash
# Sets up a fresh machine (dependencies, build) and runs every test:
# unit, e2e, and cuda (the cuda tests skip with a reason where no GPU is visible).
# It ends with a summary of the skipped tests; under CI=true a skip other than
# the documented ones (a CUDA test without a GPU; the CPU instance of a test
# of CUDA-only behaviour; the PyTorch conformance test without PyTorch) fails
# the run (test/skip_summary.py).
set -euo pipefail
cd "$(dirname "$0")/.."
# Everything, with dp-train's fault hooks for the e2e tests (apps/test_hooks.h).
FANOUT_BUILD_ALL=1 FANOUT_TEST_HOOKS=ON bash apps/setup.sh
# ctest runs one test per core: one kernel thread per test process keeps
# their OpenMP teams from waiting on each other's cores (threaded kernels
# have tests of their own that set their thread counts).
# nproc itself answers OMP_NUM_THREADS, so the cores are counted without it.
jobs=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
log=$(mktemp)
trap 'rm -f "$log"' EXIT
set +e
ctest --test-dir build --output-on-failure -j "$jobs" "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
set -e
python3 test/skip_summary.py "$log" || rc=${rc/#0/1}
exit "$rc"
