#!/usr/bin/env bash
# Installs fanout's build dependencies (Debian packages; root or sudo) and
# builds it into ./build. Used by the README's two commands and by CI: the
# library and the apps, or with FANOUT_BUILD_ALL=1 everything (tests and
# benchmarks too). FANOUT_TEST_HOOKS=ON builds dp-train with the e2e tests'
# fault hooks (apps/test_hooks.h); anything else builds it without them.
set -euo pipefail
cd "$(dirname "$0")/.."

pkgs=(build-essential cmake ninja-build pkg-config libdnnl-dev libboost-program-options-dev
      nlohmann-json3-dev zlib1g-dev libgloo-dev libhiredis-dev redis-server libgtest-dev libbenchmark-dev dataset-fashion-mnist fortunes python3 python3-pip openmpi-bin
      iproute2 iputils-ping nftables libjpeg62-turbo-dev libpng-dev)
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
  python3 -m pip install -q safetensors numpy matplotlib pillow 2> /dev/null ||
  python3 -m pip install -q --break-system-packages safetensors numpy matplotlib pillow

# oneDNN 3's headers (two PyPI wheels of about 200 KB, hashes pinned) for the
# test that keeps the CPU backend building against oneDNN 3 as well as 2.6.
# Without the network the test skips.
onednn3="third_party/onednn3"
if [ ! -f "$onednn3/3.13/include/oneapi/dnnl/dnnl.hpp" ]; then
  tmp=$(mktemp -d)
  cat > "$tmp/req.txt" << 'REQ'
onednn-devel-cpu-gomp==2023.2.0 --hash=sha256:9763c69e8c907e119056bd52ad918ca84ac9ba939d130a99dfa95ccca3e5e284
onednn-devel==2026.1.0 --hash=sha256:5dc592efaed768834ac02d9086b350e08440501b11ea3f6b230a66551c9b5fac
REQ
  if python3 -m pip download -q --no-deps --only-binary=:all: --require-hashes -r "$tmp/req.txt" -d "$tmp" 2> /dev/null; then
    python3 - "$tmp" "$onednn3" << 'PY'
import glob, os, sys, zipfile
tmp, out = sys.argv[1], sys.argv[2]
for wheel, version in (("onednn_devel_cpu_gomp-2023.2.0", "3.2"), ("onednn_devel-2026.1.0", "3.13")):
    with zipfile.ZipFile(glob.glob(os.path.join(tmp, wheel + "-*.whl"))[0]) as z:
        for name in z.namelist():
            head, sep, rest = name.partition(".data/data/include/")
            if sep and not name.endswith("/"):
                target = os.path.join(out, version, "include", rest)
                os.makedirs(os.path.dirname(target), exist_ok=True)
                with open(target, "wb") as f:
                    f.write(z.read(name))
PY
  else
    echo "setup: could not fetch oneDNN 3's headers from PyPI; kernels.onednn3_api will skip"
  fi
  rm -rf "$tmp"
fi

# The CUDA toolkit usually sits in /usr/local/cuda without being on PATH:
# find it there, so that a GPU machine builds the CUDA backend.
if ! command -v nvcc > /dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
jobs=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)  # nproc answers OMP_NUM_THREADS
hooks=OFF
[ "${FANOUT_TEST_HOOKS:-}" = ON ] && hooks=ON
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DFANOUT_TEST_HOOKS=$hooks ${FANOUT_CMAKE_ARGS:-} \
  > build-configure.log || { cat build-configure.log; exit 1; }
if [ "${FANOUT_BUILD_ALL:-}" = 1 ]; then
  cmake --build build -j "$jobs"
else
  cmake --build build -j "$jobs" --target dp-train dp-bench dp-generate
fi
