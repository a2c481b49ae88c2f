#!/usr/bin/env bash
# Sets up a fresh machine (dependencies, build) and runs every test:
# unit, e2e, and cuda (the cuda tests skip with a reason where no GPU is visible).
set -euo pipefail
cd "$(dirname "$0")/.."
bash apps/setup.sh
ctest --test-dir build --output-on-failure -j "$(nproc)" "$@"
