#!/usr/bin/env bash
# Sets up a fresh machine (dependencies, build) and runs every test:
# unit, e2e, and cuda (the cuda tests skip with a reason where no GPU is visible).
set -euo pipefail
cd "$(dirname "$0")/.."
bash apps/setup.sh
# ctest runs one test per core: one kernel thread per test process keeps
# their OpenMP teams from waiting on each other's cores (threaded kernels
# have tests of their own that set their thread counts).
# nproc itself answers OMP_NUM_THREADS, so the cores are counted without it.
jobs=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
ctest --test-dir build --output-on-failure -j "$jobs" "$@"
