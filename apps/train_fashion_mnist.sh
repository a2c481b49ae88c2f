#!/usr/bin/env bash
# Sets up a fresh machine (dependencies, build) and trains on Fashion-MNIST on
# every GPU, or on the CPU where there is none. Extra arguments go to dp-train.
set -euo pipefail
cd "$(dirname "$0")/.."
bash apps/setup.sh
exec ./build/apps/dp-train --model cnn --data fashion-mnist --epochs 10 --devices auto "$@"
