#!/usr/bin/env bash
# Installs fanout's build dependencies (Debian packages; root or sudo) and
# builds it into ./build. Used by the README's two commands and by CI.
set -euo pipefail
cd "$(dirname "$0")/.."

pkgs=(build-essential cmake ninja-build pkg-config libdnnl-dev libboost-program-options-dev
      nlohmann-json3-dev zlib1g-dev libgloo-dev libhiredis-dev redis-server libgtest-dev libbenchmark-dev dataset-fashion-mnist python3 python3-pip openmpi-bin)
missing=()
for p in "${pkgs[@]}"; do
  dpkg -s "$p" > /dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  echo "setup: installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" > /dev/null
fi
# Python packages for the checkpoint interop test and dp-bench's plot.
python3 -c "import safetensors, numpy, matplotlib" 2> /dev/null ||
  python3 -m pip install -q safetensors numpy matplotlib 2> /dev/null ||
  python3 -m pip install -q --break-system-packages safetensors numpy matplotlib

# The CUDA toolkit usually sits in /usr/local/cuda without being on PATH:
# find it there, so that a GPU machine builds the CUDA backend.
if ! command -v nvcc > /dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
jobs=$(nproc)
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release ${FANOUT_CMAKE_ARGS:-} > build-configure.log ||
  { cat build-configure.log; exit 1; }
cmake --build build -j "$jobs"
