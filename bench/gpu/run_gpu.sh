#!/usr/bin/env bash
# shellcheck disable=SC2317  # step functions are called through run_step
# run_gpu.sh OUTDIR [STEP...]: the one script for a GPU machine that has only a
# CUDA image (nvcc, CMake, PyTorch with its CUDA libraries in site-packages)
# and where nothing can be installed. It builds fanout for sm_90 with what is
# there plus the dependency prefix the project carries, runs the tests,
# compute-sanitizer, dp-train and the benchmarks, and writes every log into
# OUTDIR. Every step runs even after a failure; at the end a summary table is
# printed (and written to OUTDIR/summary.txt) and the exit status is non-zero
# if any step failed.
#
# Steps (default: all but diagnose, goals and profile, in this order; name some to run only those, e.g. when a
# session limits each command's time, `run_gpu.sh out build` then
# `run_gpu.sh out ctest`; the build directory is reused):
#   env        OUTDIR/env.txt: nvidia-smi, nvcc, cmake, compilers, python/torch
#              versions, which CUDA libraries exist and which were chosen
#   configure  CMake for sm_90 with the prefix        -> configure.log
#   build      all targets, all cores                  -> build.log
#   ctest      every test label (unit, cuda, e2e), FANOUT_REQUIRE_GPU=1 so
#              that a GPU the tests cannot see fails them; then the low-type
#              convolution tests with FANOUT_CUDNN_LAYOUT=nchw, and the
#              conversion, convolution and bf16 training tests with
#              FANOUT_CUDA_CL_COPIES=wide -> ctest.log, ctest.xml
#   dp         dp-train DataParallel on 0,0 (one GPU, two replicas), 1 epoch
#              of lenet, and DDP with 2 processes on it  -> dp_0_0.log, ddp_0_0.log
#   memcheck   compute-sanitizer memcheck on every CUDA test, then the
#              conversion tests with FANOUT_CUDA_CL_COPIES=wide under
#              memcheck, racecheck and synccheck -> memcheck.log
#   diagnose   the CUDA engine tests that compare training passes with the
#              CPU (FANOUT_DIAG_FILTER), run plainly, with
#              CUDA_LAUNCH_BLOCKING=1 (a miss that goes away is a race between
#              streams), with FANOUT_CUDA_ALLOC=plain (each tensor its own
#              cudaMalloc: a miss that goes away depends on where the pool
#              puts tensors) and under initcheck (reads of unwritten memory)
#              and memcheck with plain allocations -> diagnose.log, diag_*.log
#   train      dp-train on cuda:0: lenet 3 epochs, cnn 10 epochs
#                                   -> dp_train_{lenet,cnn}.log / .jsonl
#   bench      PyTorch eager throughput (TF32 on and off) -> pytorch.jsonl;
#              dp-bench for resnet18 (3x32x32, batch 256) and lenet (batch
#              512) on cuda:0 and 0,0, TF32 on and off -> fanout_bench.jsonl
#   epochs     dp-bench --epochs: one epoch of resnet18 on synthetic CIFAR-size
#              data (and of cnn on Fashion-MNIST when carried), on cuda:0
#              (one device, DDP world size 1, PyTorch one GPU and DDP 1) and
#              on 0,0 (DP, DDP 2 processes) -> epochs.jsonl, epochs.png
#   heatmap    heatmap-bench (naive, vectorized CPU and CUDA renderers);
#              dp-bench heatmap3d on 0,0 (loss on the replicas against the
#              gathered outputs: time and bytes to the primary); dp-train
#              heatmap3d on cuda:0 and 0,0    -> heatmap*.log / .jsonl
#   optim      dp-train lenet with AdamW and clipping on cuda:0 and 0,0, and
#              on 0,0 with --shard-optimizer (bar 0.885); SGD against AdamW
#              step cost, dp-bench on 0,0 beside train_throughput.py, and
#              AdamW sharded (resnet18, lenet) -> optim*.log / .jsonl
#   precision  dp-train lenet in bf16-mixed and 16-mixed on cuda:0 and 0,0
#              (bar 0.88); dp-bench resnet18 and lenet on cuda:0 and 0,0 in
#              32, bf16-mixed and 16-mixed beside train_throughput.py
#              --precision (torch.autocast) -> precision*.log / .jsonl
#   goals      (named only) resnet18 batch 256 on 0,0 in TF32 and bf16-mixed
#              beside PyTorch TF32, bf16 NCHW, --best and --compile -> goals.jsonl;
#              bf16-mixed again with FANOUT_CUDA_CL_COPIES=wide -> goals_wide.jsonl
#   goals3d    (named only) the same rows for heatmap3d (1x64x64x64, batch 16,
#              as the heatmap step), without torch.compile -> goals3d.jsonl
#   gpt        (named only) dp-bench GPT rows on cuda:0 and 0,0, float32 (TF32) and
#              bf16-mixed, with tokens/s and MFU: gpt2 (batch 8, T 1024) and
#              nanoGPT's shakespeare_char size (gpt-char, batch 64, T 256),
#              beside bench/pytorch/gpt_step.py when it is there -> gpt.jsonl
#   graphs     (named only) dp-bench lenet (batch 512) and cnn (batch 256) on
#              cuda:0 in TF32 and bf16-mixed: the plain engine with CUDA
#              graphs and without ("plain cuda:0 no graphs")  -> graphs.jsonl
#   memory     (named only) bench/zero_memory.sh on 0,0 in bf16-mixed: gpt2
#              (T 1024, batch 16) unsharded and --shard-optimizer, each
#              with and without --checkpoint-activations: replica_memory by
#              kind and ms/step                   -> memory.log
#   profile    (named only) Nsight Compute's time for every kernel of a short
#              resnet18 run in TF32 and bf16-mixed (square and wide
#              channels-last copies), grouped -> profile.log
#   gptprofile (named only) the same for the GPT in bf16-mixed: gpt-char
#              (batch 64, T 256) and gpt2 (batch 8, T 1024) on cuda:0; GPU
#              busy time a step against the gpt step's ms a step tells
#              whether the step waits on the host    -> gptprofile.log
#
# Environment (all optional):
#   FANOUT_DEPS_PREFIX   Debian packages unpacked by bench/gpu/fetch_deps.sh
#                        (default third_party/prefix; PREFIX.tar.xz is unpacked
#                        when the folder is absent)
#   FANOUT_DATASETS      folder holding fashion-mnist/ (default third_party/datasets)
#   FANOUT_BUILD_DIR     build folder (default build-gpu in the repository)
#   FANOUT_JOBS          build parallelism (default: all cores)
#   FANOUT_BUILD_TARGETS targets for the build step (default: all)
#   FANOUT_DIAG_FILTER   gtest filter of test_cuda for the diagnose step
#   FANOUT_DIAG_SANITIZE_FILTER  the same for its sanitizer runs
#   FANOUT_STEP_TIMEOUT  seconds per command (default 3000)
#   FANOUT_CTEST_ARGS    extra ctest arguments, e.g. "-L cuda" or "-E e2e"
#   FANOUT_MEMCHECK_FILTER  gtest filter for memcheck (default: every test)
#   FANOUT_BENCH_ARGS    extra arguments for every dp-bench run
#   FANOUT_EPOCHS_MODELS   models of the epochs step (default "resnet18 cnn")
#   FANOUT_EPOCHS_DEVICES  its device lists (default "0 0,0")
#   FANOUT_LINK_DATASET  auto (default): when /usr/share/datasets/fashion-mnist
#                        is absent, link it to the carried copy so the e2e
#                        test (which reads that path) can run; 0: never
#   FANOUT_LOGS_TGZ      when set, OUTDIR is also packed into this .tgz at the
#                        end (for transports that return few files)
#   CUDNN_ROOT, NCCL_ROOT  searched first for headers and libraries
set -uo pipefail

usage() {
  sed -n '3,/^set -uo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
  exit 2
}
[ $# -ge 1 ] || usage
case $1 in -h | --help) usage ;; esac

mkdir -p "$1" || { echo "run_gpu.sh: cannot create $1" >&2; exit 2; }
out=$(cd "$1" && pwd)
shift
all_steps=(env configure build ctest dp memcheck train bench epochs heatmap optim precision)
if [ $# -gt 0 ]; then steps=("$@"); else steps=("${all_steps[@]}"); fi
for s in "${steps[@]}"; do
  case " ${all_steps[*]} diagnose goals goals3d gpt graphs memory profile gptprofile " in *" $s "*) ;; *) echo "run_gpu.sh: unknown step '$s' (steps: ${all_steps[*]} diagnose goals goals3d gpt graphs memory profile gptprofile)" >&2; exit 2 ;; esac
done

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
prefix=${FANOUT_DEPS_PREFIX:-$repo/third_party/prefix}
datasets=${FANOUT_DATASETS:-$repo/third_party/datasets}
build=${FANOUT_BUILD_DIR:-$repo/build-gpu}
jobs=${FANOUT_JOBS:-$(nproc 2>/dev/null || echo 4)}
step_timeout=${FANOUT_STEP_TIMEOUT:-3000}
ma=$(gcc -print-multiarch 2>/dev/null || true)
ma=${ma:-x86_64-linux-gnu}
export CMAKE_POLICY_VERSION_MINIMUM=3.5  # CMake 4 with the older packages' config files
setup_log="$out/setup.log"
: >"$setup_log"
note() { echo "$*" | tee -a "$setup_log"; }

# ---------------------------------------------------------------- setup ----

# The dependency prefix: a folder, or the packed archive beside it.
if [ ! -d "$prefix/usr" ] && [ -f "$prefix.tar.xz" ]; then
  note "unpacking $prefix.tar.xz into $prefix"
  if ! { mkdir -p "$prefix" && tar -C "$prefix" -xJf "$prefix.tar.xz" 2>>"$setup_log"; }; then
    note "WARNING: unpacking failed"
  fi
fi
if [ -d "$prefix/usr" ]; then
  note "dependency prefix: $prefix"
else
  note "WARNING: no dependency prefix at $prefix (run bench/gpu/fetch_deps.sh on a Debian machine); relying on the system"
fi

# CUDA toolkit.
nvcc=${CUDACXX:-$(command -v nvcc || true)}
[ -z "$nvcc" ] && [ -x /usr/local/cuda/bin/nvcc ] && nvcc=/usr/local/cuda/bin/nvcc
cuda_home=${CUDA_HOME:-}
[ -z "$cuda_home" ] && [ -n "$nvcc" ] && cuda_home=$(cd "$(dirname "$(readlink -f "$nvcc")")/.." && pwd)
note "nvcc: ${nvcc:-NOT FOUND}; CUDA toolkit: ${cuda_home:-NOT FOUND}"

python=$(command -v python3 || true)
site_dirs=()
if [ -n "$python" ]; then
  while IFS= read -r d; do [ -d "$d" ] && site_dirs+=("$d"); done < <(
    "$python" -c 'import site
for p in site.getsitepackages() + [site.getusersitepackages()]: print(p)' 2>/dev/null)
fi
note "python: ${python:-NOT FOUND}; site-packages: ${site_dirs[*]:-none}"

# Roots that may hold a library: explicit root, the toolkit, the system, and
# the nvidia/* wheels under site-packages (found by the header they ship).
roots_for() {  # roots_for HEADER EXPLICIT_ROOT
  local header=$1 explicit=$2 sp h
  [ -n "$explicit" ] && echo "$explicit"
  [ -n "$cuda_home" ] && echo "$cuda_home" && echo "$cuda_home/targets/x86_64-linux"
  echo /usr
  echo /usr/local
  for sp in "${site_dirs[@]}"; do
    [ -d "$sp/nvidia" ] || continue
    while IFS= read -r h; do dirname "$(dirname "$h")"; done < <(find "$sp/nvidia" -maxdepth 3 -name "$header" 2>/dev/null | sort)
  done
}
# locate VAR HEADER LIBNAME EXPLICIT_ROOT: sets VAR_INC and VAR_LIB from the
# first root that holds both the header and the library (plain .so or a
# versioned one, as wheels ship only libfoo.so.N).
locate() {
  local var=$1 header=$2 libname=$3 explicit=$4 root inc libdir f
  while IFS= read -r root; do
    [ -d "$root" ] || continue
    for inc in "$root/include" "$root/include/$ma"; do
      [ -e "$inc/$header" ] || continue
      for libdir in "$root/lib64" "$root/lib" "$root/lib/$ma"; do
        for f in "$libdir/$libname.so" "$libdir/$libname".so.[0-9]*; do
          if [ -e "$f" ]; then
            printf -v "${var}_INC" %s "$inc"
            printf -v "${var}_LIB" %s "$f"
            return 0
          fi
        done
      done
    done
  done < <(roots_for "$header" "$explicit")
  return 1
}
CUDNN_INC="" CUDNN_LIB="" NCCL_INC="" NCCL_LIB="" CUBLAS_INC="" CUBLAS_LIB=""
locate CUDNN cudnn.h libcudnn "${CUDNN_ROOT:-}" || true
locate NCCL nccl.h libnccl "${NCCL_ROOT:-}" || true
locate CUBLAS cublas_v2.h libcublas "" || true
note "cuDNN:  include ${CUDNN_INC:-NOT FOUND}, library ${CUDNN_LIB:-NOT FOUND}"
note "NCCL:   include ${NCCL_INC:-NOT FOUND}, library ${NCCL_LIB:-NOT FOUND}"
note "cuBLAS: include ${CUBLAS_INC:-NOT FOUND}, library ${CUBLAS_LIB:-NOT FOUND}"

# Headers that do not live in the toolkit's include folder reach the compiler
# through a shim folder holding links to just those headers (a wheel's include
# folder may also hold CUDA runtime headers of another version).
shim="$build/_gpu_include"
extra_flags=""
link_headers() {  # link_headers INCDIR GLOB
  [ -n "$1" ] && [ "$1" != "$cuda_home/include" ] || return 0
  mkdir -p "$shim"
  local f
  for f in "$1"/$2; do [ -e "$f" ] && ln -sfn "$f" "$shim/$(basename "$f")"; done
  extra_flags="-isystem $shim"
}
link_headers "$CUDNN_INC" 'cudnn*.h'
link_headers "$NCCL_INC" 'nccl*.h'
[ -n "$extra_flags" ] && note "extra include folder: $shim ($(find "$shim" -mindepth 1 -printf '%f ' 2>/dev/null))"

# Runtime search path for fanout's programs (not for Python: the prefix's
# older libraries must not shadow the system's there).
fanout_ld=""
add_ld() { case ":$fanout_ld:" in *":$1:"*) ;; *) fanout_ld=${fanout_ld:+$fanout_ld:}$1 ;; esac; }
for f in "$CUDNN_LIB" "$NCCL_LIB" "$CUBLAS_LIB"; do [ -n "$f" ] && add_ld "$(dirname "$f")"; done
[ -n "$cuda_home" ] && add_ld "$cuda_home/lib64"
add_ld "$prefix/usr/lib/$ma"
add_ld "$prefix/usr/lib"  # Gloo installs its library there
note "LD_LIBRARY_PATH for fanout programs: $fanout_ld"
# tmo CMD...: CMD under the step time limit; frun CMD...: the same, for
# fanout's own programs (with their library path).
tmo() { timeout --kill-after=30 "$step_timeout" "$@"; }
frun() { tmo env LD_LIBRARY_PATH="$fanout_ld${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$@"; }

# Fashion-MNIST for dp-train (and the e2e test, which reads the system path).
fashion=""
if [ -e "$datasets/fashion-mnist/train-images-idx3-ubyte.gz" ]; then
  fashion="$datasets/fashion-mnist"
elif [ -e /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  fashion=/usr/share/datasets/fashion-mnist
fi
if [ "${FANOUT_LINK_DATASET:-auto}" != 0 ] && [ -n "$fashion" ] && [ ! -e /usr/share/datasets/fashion-mnist ]; then
  if mkdir -p /usr/share/datasets 2>/dev/null && ln -s "$fashion" /usr/share/datasets/fashion-mnist 2>/dev/null; then
    note "linked /usr/share/datasets/fashion-mnist -> $fashion (for the e2e test)"
  else
    note "could not link /usr/share/datasets/fashion-mnist (e2e.dp_train will fail without it)"
  fi
fi
note "Fashion-MNIST: ${fashion:-NOT FOUND (dp-train runs on synthetic data)}"

generator=()
if command -v ninja >/dev/null; then generator=(-G Ninja); fi

# ---------------------------------------------------------------- steps ----

step_env() {
  {
    echo "== run_gpu.sh $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)"
    echo "repository: $repo (commit $(git -C "$repo" rev-parse HEAD 2>/dev/null || echo unknown)$(
      git -C "$repo" diff --quiet HEAD 2>/dev/null || echo ', with local changes'))"
    echo
    echo "== nvidia-smi"
    nvidia-smi 2>&1
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem,compute_cap \
      --format=csv 2>&1
    echo
    echo "== nvcc --version"
    "${nvcc:-nvcc}" --version 2>&1
    echo
    echo "== tools"
    cmake --version 2>&1 | head -1
    (ninja --version 2>&1 | sed 's/^/ninja /') || echo "ninja: none"
    gcc --version 2>&1 | head -1
    g++ --version 2>&1 | head -1
    command -v compute-sanitizer "${cuda_home:-/usr/local/cuda}/bin/compute-sanitizer" 2>&1 | head -1
    # shellcheck disable=SC1091
    (. /etc/os-release && echo "os: $PRETTY_NAME")
    ldd --version 2>&1 | head -1
    echo "cores: $(nproc), memory: $(awk '/MemTotal/ {print $2 " kB"}' /proc/meminfo)"
    echo
    echo "== python / torch"
    "${python:-python3}" - <<'PY' 2>&1
import sys
print("python", sys.version.split()[0], sys.executable)
try:
    import torch
    print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version())
    print("cuda available", torch.cuda.is_available())
    if torch.cuda.is_available():
        print("device", torch.cuda.get_device_name(0), torch.cuda.get_device_properties(0))
        try:
            print("nccl", torch.cuda.nccl.version())
        except Exception as e:  # noqa: BLE001
            print("nccl: unknown", e)
except Exception as e:  # noqa: BLE001
    print("torch: not importable:", e)
try:
    import torchvision
    print("torchvision", torchvision.__version__)
except Exception as e:  # noqa: BLE001
    print("torchvision: not importable:", e)
PY
    echo
    echo "== chosen paths"
    cat "$setup_log"
    echo
    echo "== CUDA libraries present"
    echo "-- ldconfig"
    ldconfig -p 2>/dev/null | grep -E 'lib(cudnn|nccl|cublas|cublasLt|cudart|dnnl|gomp|OpenCL|boost_program_options|gtest)\.' || true
    echo "-- toolkit ${cuda_home:-?}"
    ls "${cuda_home:-/nonexistent}"/lib64/lib{cudart,cublas,cublasLt,cudnn,nccl}.so* 2>/dev/null || true
    ls "${cuda_home:-/nonexistent}"/lib/lib{cudnn,nccl}.so* 2>/dev/null || true
    for sp in "${site_dirs[@]}"; do
      [ -d "$sp/nvidia" ] || continue
      echo "-- $sp/nvidia"
      find "$sp/nvidia" -maxdepth 3 \( -name 'libcudnn*.so*' -o -name 'libnccl*.so*' -o -name 'libcublas*.so*' \
        -o -name 'libcudart*.so*' -o -name 'cudnn.h' -o -name 'nccl.h' -o -name 'cublas_v2.h' \) 2>/dev/null | sort
    done
    echo
    echo "== dependency prefix"
    cat "$prefix/MANIFEST.txt" 2>/dev/null || echo "no $prefix/MANIFEST.txt"
  } >"$out/env.txt" 2>&1
  nvidia-smi -L >/dev/null 2>&1  # the step fails when no GPU answers
}

step_configure() {
  local args=(-S "$repo" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DFANOUT_CUDA=ON
    -DCMAKE_CUDA_ARCHITECTURES=90)
  [ -n "$nvcc" ] && args+=(-DCMAKE_CUDA_COMPILER="$nvcc")
  [ -d "$prefix/usr" ] && args+=(-DCMAKE_PREFIX_PATH="$prefix/usr")
  local dnnl_inc="$prefix/usr/include" dnnl_lib="$prefix/usr/lib/$ma/libdnnl.so"
  [ -e "$dnnl_inc/oneapi/dnnl/dnnl.hpp" ] && args+=(-DDNNL_INCLUDE_DIR="$dnnl_inc")
  [ -e "$dnnl_lib" ] && args+=(-DDNNL_LIBRARY="$dnnl_lib")
  [ -n "$CUDNN_LIB" ] && args+=(-DCUDNN_LIBRARY="$CUDNN_LIB")
  [ -n "$NCCL_LIB" ] && args+=(-DNCCL_LIBRARY="$NCCL_LIB")
  [ -n "$extra_flags" ] && args+=(-DCMAKE_CXX_FLAGS="$extra_flags" -DCMAKE_CUDA_FLAGS="$extra_flags")
  echo "cmake ${args[*]}"
  frun cmake "${args[@]}" || return
  # Where each dependency was found.
  grep -E '^(Boost_DIR|GTest_DIR|nlohmann_json_DIR|ZLIB_INCLUDE_DIR|ZLIB_LIBRARY_RELEASE|DNNL_INCLUDE_DIR|DNNL_LIBRARY|OpenMP_CXX_FLAGS|CUDNN_LIBRARY|NCCL_LIBRARY|CUDAToolkit_LIBRARY_DIR|CMAKE_CUDA_COMPILER):' \
    "$build/CMakeCache.txt"
}

step_build() {
  local targets=()
  # shellcheck disable=SC2206  # a space-separated list of targets
  [ -n "${FANOUT_BUILD_TARGETS:-}" ] && targets=(--target $FANOUT_BUILD_TARGETS)
  frun cmake --build "$build" -j "$jobs" "${targets[@]}"
}

step_ctest() {
  local extra=()
  # shellcheck disable=SC2206  # word splitting of user-given ctest arguments is intended
  [ -n "${FANOUT_CTEST_ARGS:-}" ] && extra=($FANOUT_CTEST_ARGS)
  # One test per core, so one kernel thread per test (test/run_tests.sh says why).
  local rc=0
  (cd "$build" && FANOUT_REQUIRE_GPU=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} frun ctest --output-on-failure \
    --timeout 1800 -j "$jobs" \
    --output-junit "$out/ctest.xml" "${extra[@]}") || rc=1
  # The convolutions' low-type path with NCHW copies, the layout the default replaced (kernels/cuda/conv.cu).
  echo "== FANOUT_CUDNN_LAYOUT=nchw: the convolution tests"
  FANOUT_REQUIRE_GPU=1 FANOUT_CUDNN_LAYOUT=nchw frun "$build/test/test_kernels" --gtest_filter='ConvOnBackend.*/cuda' ||
    rc=1
  FANOUT_REQUIRE_GPU=1 FANOUT_CUDNN_LAYOUT=nchw frun "$build/test/test_cuda" \
    --gtest_filter='CudaTraining.ConvLayersRoundOnceInTheLowType:CudaTraining.*Bf16*' || rc=1
  # The wide-tile channels-last copies (kernels/cuda/convert.cu), not yet the default.
  echo "== FANOUT_CUDA_CL_COPIES=wide: the conversion, convolution and bf16 training tests"
  FANOUT_REQUIRE_GPU=1 FANOUT_CUDA_CL_COPIES=wide frun "$build/test/test_kernels" \
    --gtest_filter='Convert.*/cuda:ConvOnBackend.*/cuda' || rc=1
  FANOUT_REQUIRE_GPU=1 FANOUT_CUDA_CL_COPIES=wide frun "$build/test/test_cuda" \
    --gtest_filter='CudaTraining.ConvLayersRoundOnceInTheLowType:CudaTraining.*Bf16*' || rc=1
  return "$rc"
}

sanitizer() {
  local c
  for c in "$(command -v compute-sanitizer 2>/dev/null)" "${cuda_home:-/usr/local/cuda}/bin/compute-sanitizer" \
    "${cuda_home:-/usr/local/cuda}/compute-sanitizer/compute-sanitizer"; do
    [ -n "$c" ] && [ -x "$c" ] && echo "$c" && return 0
  done
  echo "compute-sanitizer not found" >&2
  return 1
}

step_memcheck() {
  local cs rc=0 filter=${FANOUT_MEMCHECK_FILTER:-*/cuda:Cuda*}
  cs=$(sanitizer) || return 1
  # The CUDA instances of the kernel and layer tests (names end in /cuda) and
  # the CUDA engine tests (suites named Cuda*).
  for t in test_kernels test_models test_cuda; do
    [ -x "$build/test/$t" ] || { echo "no $build/test/$t (build step failed?)"; return 1; }
    # compute-sanitizer fails a program that makes no CUDA call: skip a binary
    # in which the filter selects no test.
    if ! "$build/test/$t" --gtest_list_tests --gtest_filter="$filter" | grep -q '^  '; then
      echo "== $t: no test matches the filter"
      continue
    fi
    FANOUT_REQUIRE_GPU=1 frun "$cs" --tool memcheck --error-exitcode 97 --print-limit 200 "$build/test/$t" \
      --gtest_filter="$filter" || rc=1
  done
  echo "== FANOUT_CUDA_CL_COPIES=wide: the conversion tests and a bf16 convolution layer"
  FANOUT_REQUIRE_GPU=1 FANOUT_CUDA_CL_COPIES=wide frun "$cs" --tool memcheck --error-exitcode 97 --print-limit 200 \
    "$build/test/test_kernels" --gtest_filter='Convert.*/cuda' || rc=1
  FANOUT_REQUIRE_GPU=1 FANOUT_CUDA_CL_COPIES=wide frun "$cs" --tool memcheck --error-exitcode 97 --print-limit 200 \
    "$build/test/test_cuda" --gtest_filter='CudaTraining.ConvLayersRoundOnceInTheLowType' || rc=1
  local tool
  for tool in racecheck synccheck; do  # the wide copies' shared tiles
    FANOUT_REQUIRE_GPU=1 FANOUT_CUDA_CL_COPIES=wide frun "$cs" --tool "$tool" --error-exitcode 97 --print-limit 200 \
      "$build/test/test_kernels" --gtest_filter='Convert.*Channels*/cuda' || rc=1
  done
  for tool in racecheck synccheck; do  # the softmax's block reductions, the embedding's runs
    FANOUT_REQUIRE_GPU=1 frun "$cs" --tool "$tool" --error-exitcode 97 --print-limit 200 \
      "$build/test/test_kernels" --gtest_filter='*Softmax*/cuda:*Embedding*/cuda' || rc=1
  done
  return "$rc"
}

step_diagnose() {
  local t="$build/test/test_cuda" cs rc=0 f
  f=${FANOUT_DIAG_FILTER:-CudaTraining.*:CudaDataParallel.*}
  [ -x "$t" ] || { echo "no $t (build step failed?)"; return 1; }
  echo "== plain";    FANOUT_REQUIRE_GPU=1 frun "$t" --gtest_filter="$f" >"$out/diag_plain.log" 2>&1 || rc=1
  tail -n 30 "$out/diag_plain.log"
  echo "== CUDA_LAUNCH_BLOCKING=1"
  CUDA_LAUNCH_BLOCKING=1 FANOUT_REQUIRE_GPU=1 frun "$t" --gtest_filter="$f" >"$out/diag_blocking.log" 2>&1 || rc=1
  tail -n 30 "$out/diag_blocking.log"
  echo "== FANOUT_CUDA_ALLOC=plain"
  FANOUT_CUDA_ALLOC=plain FANOUT_REQUIRE_GPU=1 frun "$t" --gtest_filter="$f" >"$out/diag_plain_alloc.log" 2>&1 || rc=1
  tail -n 30 "$out/diag_plain_alloc.log"
  cs=$(sanitizer) || return 1
  for tool in initcheck memcheck; do
    echo "== $tool (FANOUT_CUDA_ALLOC=plain: each tensor its own allocation)"
    FANOUT_CUDA_ALLOC=plain FANOUT_REQUIRE_GPU=1 frun "$cs" --tool "$tool" --error-exitcode 97 --print-limit 50 "$t" \
      --gtest_filter="${FANOUT_DIAG_SANITIZE_FILTER:-CudaTraining.GradientsMatchCpu:CudaTraining.Resnet18UnitsAloneMatchCpu}" \
      >"$out/diag_$tool.log" 2>&1 || rc=1
    tail -n 30 "$out/diag_$tool.log"
  done
  return "$rc"
}

dp_train_bin() { [ -x "$build/apps/dp-train" ] && echo "$build/apps/dp-train"; }

train_one() {  # train_one MODEL EPOCHS
  local bin data
  bin=$(dp_train_bin) || { echo "no dp-train in $build/apps (build step failed?)"; return 1; }
  if [ -n "$fashion" ]; then data="fashion-mnist:$fashion"; else data=synthetic; fi
  rm -f "$out/dp_train_$1.jsonl"
  echo "$bin --devices cuda:0 --model $1 --epochs $2 --data $data --progress lines --metrics $out/dp_train_$1.jsonl"
  frun "$bin" --devices cuda:0 --model "$1" --epochs "$2" --data "$data" --progress lines \
    --metrics "$out/dp_train_$1.jsonl"
}
step_train_lenet() { train_one lenet 3; }
step_dp() {
  local bin data rc=0
  bin=$(dp_train_bin) || { echo "no dp-train in $build/apps (build step failed?)"; return 1; }
  if [ -n "$fashion" ]; then data="fashion-mnist:$fashion"; else data=synthetic; fi
  echo "== DataParallel, two replicas on cuda:0"
  frun "$bin" --devices 0,0 --model lenet --epochs 1 --data "$data" --progress lines \
    --metrics "$out/dp_0_0.jsonl" 2>&1 | tee "$out/dp_0_0.log" || rc=1
  echo "== DDP, two processes on cuda:0 (Gloo: NCCL refuses a shared GPU)"
  frun "$bin" --devices 0,0 --strategy ddp --model lenet --epochs 1 --data "$data" --progress lines \
    --metrics "$out/ddp_0_0.jsonl" 2>&1 | tee "$out/ddp_0_0.log" || rc=1
  echo "== DDP, one process on cuda:0 over NCCL"
  frun "$bin" --devices 0 --strategy ddp --ddp-backend nccl --model lenet --epochs 1 --data "$data" \
    --progress lines --metrics "$out/ddp_nccl.jsonl" 2>&1 | tee "$out/ddp_nccl.log" || rc=1
  return "$rc"
}
step_train_cnn() { train_one cnn 10; }

step_bench_pytorch() {
  [ -n "$python" ] || { echo "no python3"; return 1; }
  : >"$out/pytorch.jsonl"
  local mode rc=0
  for mode in on off; do
    echo "== train_throughput.py --tf32 $mode"
    tmo "$python" "$repo/bench/pytorch/train_throughput.py" --tf32 "$mode" >>"$out/pytorch.jsonl" || rc=1
  done
  # PyTorch at its best: bf16 autocast, channels_last, cudnn.benchmark, fused
  # optimizer (SGD and AdamW); then torch.compile on top, bounded in time.
  for opt in sgd adamw; do
    echo "== train_throughput.py --best --optimizer $opt"
    tmo "$python" "$repo/bench/pytorch/train_throughput.py" --best --tf32 on --optimizer "$opt" --lr 1e-3 \
      >>"$out/pytorch.jsonl" || rc=1
  done
  echo "== train_throughput.py --best --compile (resnet18)"
  timeout --kill-after=10 "${FANOUT_COMPILE_TIMEOUT:-240}" "$python" "$repo/bench/pytorch/train_throughput.py" \
    --best --tf32 on --compile --models resnet18 >>"$out/pytorch.jsonl" || echo "torch.compile row: did not finish"
  cat "$out/pytorch.jsonl"
  return "$rc"
}

step_bench_fanout() {
  local b="$build/apps/dp-bench" rc=0 spec tf
  [ -x "$b" ] || { echo "no dp-bench in $build/apps (build step failed?)"; return 1; }
  : >"$out/fanout_bench.jsonl"
  for spec in "resnet18 3x32x32 256" "lenet 1x28x28 512"; do
    set -- $spec
    for tf in "" --allow-tf32; do
      echo "== dp-bench --model $1 --input $2 --batch-size $3 --devices 0,0 $tf"
      # shellcheck disable=SC2086  # optional flag and user-given arguments
      frun "$b" --model "$1" --input "$2" --batch-size "$3" --devices 0,0 $tf --json "$out/fanout_bench.jsonl" \
        ${FANOUT_BENCH_ARGS:-} || rc=1
    done
  done
  return "$rc"
}

step_heatmap() {
  local rc=0 bin
  [ -x "$build/bench/heatmap-bench" ] || { echo "no heatmap-bench in $build/bench (build step failed?)"; return 1; }
  echo "== heatmap-bench"
  frun "$build/bench/heatmap-bench" 2>&1 | tee "$out/heatmap_bench.log" || rc=1
  echo "== dp-bench --model heatmap3d --input 1x64x64x64 --batch-size 16 --devices 0,0"
  frun "$build/apps/dp-bench" --model heatmap3d --input 1x64x64x64 --batch-size 16 --devices 0,0 \
    --json "$out/heatmap_bench.jsonl" 2>&1 | tee -a "$out/heatmap_bench.log" || rc=1
  bin=$(dp_train_bin) || { echo "no dp-train in $build/apps (build step failed?)"; return 1; }
  for devs in 0 0,0; do
    echo "== dp-train --model heatmap3d --data synthetic3d --devices $devs"
    frun "$bin" --model heatmap3d --data synthetic3d --devices "$devs" --progress lines \
      --metrics "$out/heatmap_train_${devs/,/_}.jsonl" 2>&1 | tee "$out/heatmap_train_${devs/,/_}.log" || rc=1
  done
  return "$rc"
}

step_epochs() {
  local b="$build/apps/dp-bench" rc=0 devs
  [ -x "$b" ] || { echo "no dp-bench in $build/apps (build step failed?)"; return 1; }
  : >"$out/epochs.jsonl"
  for devs in ${FANOUT_EPOCHS_DEVICES:-0 0,0}; do
    if [[ " ${FANOUT_EPOCHS_MODELS:-resnet18 cnn} " == *" resnet18 "* ]]; then
      echo "== dp-bench --epochs 1 --model resnet18 --data synthetic:20000 --batch-size 256 --devices $devs"
      # shellcheck disable=SC2086  # user-given arguments
      frun "$b" --epochs 1 --model resnet18 --data synthetic:20000 --batch-size 256 --devices "$devs" \
        --repeats 3 --workers 4 --python "${python:-python3}" --json "$out/epochs.jsonl" ${FANOUT_BENCH_ARGS:-} || rc=1
    fi
    if [ -n "$fashion" ] && [[ " ${FANOUT_EPOCHS_MODELS:-resnet18 cnn} " == *" cnn "* ]]; then
      echo "== dp-bench --epochs 1 --model cnn --data fashion-mnist --batch-size 256 --devices $devs"
      # shellcheck disable=SC2086
      frun "$b" --epochs 1 --model cnn --data "fashion-mnist:$fashion" --batch-size 256 --devices "$devs" \
        --repeats 2 --workers 4 --python "${python:-python3}" --json "$out/epochs.jsonl" ${FANOUT_BENCH_ARGS:-} || rc=1
    fi
  done
  frun "${python:-python3}" "$repo/bench/plot_epochs.py" --json "$out/epochs.jsonl" --out "$out/epochs.png" || rc=1
  return "$rc"
}

# Optimizers on the GPU: dp-train lenet with AdamW and clipping on cuda:0
# (bar 0.885) and on 0,0 with --no-decay-norm-bias; then the step cost of SGD
# against AdamW (clipping on) for resnet18 and lenet, dp-bench on 0,0 beside
# train_throughput.py with the same torch.optim object.
step_optim() {
  local bin b="$build/apps/dp-bench" data rc=0 spec opt
  bin=$(dp_train_bin) || { echo "no dp-train in $build/apps (build step failed?)"; return 1; }
  if [ -n "$fashion" ]; then data="fashion-mnist:$fashion"; else data=synthetic; fi
  for devs in 0 0,0 0,0-sharded; do
    local shard=()
    [ "$devs" = 0,0-sharded ] && shard=(--shard-optimizer)
    echo "== dp-train --model lenet --optimizer adamw --lr 1e-3 --clip-grad-norm 1 --devices ${devs%-sharded} ${shard[*]}"
    frun "$bin" --devices "${devs%-sharded}" --model lenet --epochs 3 --data "$data" --optimizer adamw --lr 1e-3 \
      --clip-grad-norm 1 --no-decay-norm-bias "${shard[@]}" --progress lines \
      --metrics "$out/optim_lenet_${devs/,/_}.jsonl" 2>&1 | tee "$out/optim_lenet_${devs/,/_}.log" || rc=1
  done
  : >"$out/optim_bench.jsonl"
  for spec in "resnet18 3x32x32 256" "lenet 1x28x28 512"; do
    set -- $spec
    for opt in sgd adamw; do
      echo "== dp-bench --model $1 --batch-size $3 --devices 0,0 --optimizer $opt --clip-grad-norm 1"
      frun "$b" --model "$1" --input "$2" --batch-size "$3" --devices 0,0 --no-ddp --optimizer "$opt" \
        --clip-grad-norm 1 --json "$out/optim_bench.jsonl" || rc=1
      [ -n "$python" ] && { tmo "$python" "$repo/bench/pytorch/train_throughput.py" --models "$1" --batch "$3" \
        --optimizer "$opt" --clip-grad-norm 1 --tf32 off >>"$out/optim_bench.jsonl" || rc=1; }
    done
    # ZeRO-1: AdamW's state sharded over the two replicas (the "opt state B" column halves).
    echo "== dp-bench --model $1 --batch-size $3 --devices 0,0 --optimizer adamw --clip-grad-norm 1 --shard-optimizer"
    frun "$b" --model "$1" --input "$2" --batch-size "$3" --devices 0,0 --no-ddp --optimizer adamw \
      --clip-grad-norm 1 --shard-optimizer --json "$out/optim_bench.jsonl" || rc=1
  done
  return "$rc"
}

# Mixed precision on the GPU: lenet's bar in both modes on cuda:0 and 0,0,
# then step time in each precision beside PyTorch's autocast (same call).
# PyTorch runs with --tf32 off like fanout without --allow-tf32: its default
# lets cuDNN use TF32, which made the float32 rows of 2026-11-27 unlike.
step_precision() {
  local bin b="$build/apps/dp-bench" data rc=0 spec p devs
  bin=$(dp_train_bin) || { echo "no dp-train in $build/apps (build step failed?)"; return 1; }
  if [ -n "$fashion" ]; then data="fashion-mnist:$fashion"; else data=synthetic; fi
  for p in bf16-mixed 16-mixed; do
    for devs in 0 0,0; do
      echo "== dp-train --model lenet --precision $p --devices $devs"
      frun "$bin" --devices "$devs" --model lenet --epochs 3 --data "$data" --precision "$p" --progress lines \
        --metrics "$out/precision_lenet_${p}_${devs/,/_}.jsonl" 2>&1 | tee "$out/precision_lenet_${p}_${devs/,/_}.log" || rc=1
    done
  done
  : >"$out/precision_bench.jsonl"
  for spec in "resnet18 3x32x32 256" "lenet 1x28x28 512"; do
    set -- $spec
    for p in 32 bf16-mixed 16-mixed; do
      echo "== dp-bench --model $1 --batch-size $3 --devices 0,0 --precision $p"
      frun "$b" --model "$1" --input "$2" --batch-size "$3" --devices 0,0 --no-ddp --precision "$p" \
        --json "$out/precision_bench.jsonl" || rc=1
      [ -n "$python" ] && { tmo "$python" "$repo/bench/pytorch/train_throughput.py" --models "$1" --batch "$3" \
        --precision "$p" --tf32 off >>"$out/precision_bench.jsonl" || rc=1; }
    done
  done
  return "$rc"
}

# fanout's goal rows: dp-bench on 0,0 (plain and DataParallel rows) in TF32
# and bf16-mixed with cuDNN's search. goal_rows MODEL INPUT BATCH JSONL
goal_rows() {
  local p rc=0
  for p in 32 bf16-mixed; do
    echo "== dp-bench $1 $2 batch $3 --devices 0,0 --precision $p --allow-tf32 --cudnn-benchmark"
    frun "$build/apps/dp-bench" --model "$1" --input "$2" --batch-size "$3" --devices 0,0 --no-ddp \
      --precision "$p" --allow-tf32 --cudnn-benchmark --json "$4" || rc=1
  done
  return "$rc"
}

# PyTorch's goal rows beside them: TF32, bf16 autocast channels-first, and its
# best eager recipe (bf16, channels_last, cudnn.benchmark, fused SGD).
# pytorch_goal_rows JSONL TRAIN_THROUGHPUT_ARGS...
pytorch_goal_rows() {
  local json=$1 rc=0 tt="$repo/bench/pytorch/train_throughput.py"
  shift
  echo "== PyTorch TF32, cudnn.benchmark"
  tmo "$python" "$tt" "$@" --tf32 on --cudnn-benchmark >>"$json" || rc=1
  echo "== PyTorch bf16 autocast, cudnn.benchmark, fused SGD, channels first"
  tmo "$python" "$tt" "$@" --tf32 on --precision bf16-mixed --cudnn-benchmark --fused-optimizer >>"$json" || rc=1
  echo "== PyTorch --best"
  tmo "$python" "$tt" "$@" --tf32 on --best >>"$json" || rc=1
  return "$rc"
}

# heatmap3d's rows of the goals, same shapes as step_heatmap; no torch.compile.
step_goals3d() {
  local rc=0
  [ -x "$build/apps/dp-bench" ] || { echo "no dp-bench in $build/apps (build step failed?)"; return 1; }
  : >"$out/goals3d.jsonl"
  goal_rows heatmap3d 1x64x64x64 16 "$out/goals3d.jsonl" || rc=1
  [ -n "$python" ] || { echo "no python3"; return 1; }
  pytorch_goal_rows "$out/goals3d.jsonl" --models heatmap3d --batch 16 --shape 1x64x64x64 || rc=1
  cat "$out/goals3d.jsonl"
  return "$rc"
}

# The issue's goals in one step: resnet18 (3x32x32, batch 256) on cuda:0 and
# 0,0 in TF32 and bf16-mixed with cuDNN's search, beside PyTorch in TF32, its
# best eager recipe with and without channels_last (the layout question) and
# torch.compile on top (bounded by FANOUT_COMPILE_TIMEOUT).
step_goals() {
  local b="$build/apps/dp-bench" rc=0
  [ -x "$b" ] || { echo "no dp-bench in $build/apps (build step failed?)"; return 1; }
  : >"$out/goals.jsonl"
  goal_rows resnet18 3x32x32 256 "$out/goals.jsonl" || rc=1
  # The same bf16 rows with the wide-tile channels-last copies (kernels/cuda/convert.cu).
  echo "== the same, bf16-mixed, FANOUT_CUDA_CL_COPIES=wide -> goals_wide.jsonl"
  : >"$out/goals_wide.jsonl"
  FANOUT_CUDA_CL_COPIES=wide frun "$b" --model resnet18 --input 3x32x32 --batch-size 256 --devices 0,0 --no-ddp \
    --precision bf16-mixed --allow-tf32 --cudnn-benchmark --json "$out/goals_wide.jsonl" || rc=1
  [ -n "$python" ] || { echo "no python3"; return 1; }
  pytorch_goal_rows "$out/goals.jsonl" --models resnet18 --batch 256 || rc=1
  echo "== PyTorch --best --compile"
  timeout --kill-after=10 "${FANOUT_COMPILE_TIMEOUT:-240}" "$python" "$repo/bench/pytorch/train_throughput.py" \
    --models resnet18 --batch 256 --tf32 on --best --compile >>"$out/goals.jsonl" || echo "torch.compile row: did not finish"
  cat "$out/goals.jsonl"
  return "$rc"
}

# The transformer issue's CUDA rows: dp-bench GPT step time, tokens/s and MFU
# on cuda:0 and 0,0 in TF32 and bf16-mixed (AdamW, nanoGPT's settings), and
# PyTorch's GPT (F.scaled_dot_product_attention) beside them when its script is there;
# both clip the gradient norm at 1 and decay only the matrices, as nanoGPT.
step_gpt() {
  local b="$build/apps/dp-bench" rc=0 spec p devs tt="$repo/bench/pytorch/gpt_step.py"
  [ -x "$b" ] || { echo "no dp-bench in $build/apps (build step failed?)"; return 1; }
  : >"$out/gpt.jsonl"
  for spec in "gpt:gpt2 8 1024 --configs=gpt2" "gpt:gpt-char,dropout=0 64 256 --configs=shakespeare"; do
    set -- $spec
    for p in 32 bf16-mixed; do
      for devs in 0 0,0; do
        echo "== dp-bench --model $1 --batch-size $2 --input $3 --devices $devs --precision $p --allow-tf32"
        frun "$b" --model "$1" --batch-size "$2" --input "$3" --devices "$devs" --no-ddp --precision "$p" \
          --allow-tf32 --optimizer adamw --betas 0.9,0.95 --clip-grad-norm 1 --no-decay-norm-bias --warmup 3 --steps 10 \
          --repeats 3 --json "$out/gpt.jsonl" || rc=1
      done
      if [ -n "$python" ] && [ -f "$tt" ]; then
        echo "== PyTorch $1 batch $2 T $3 --precision $p"
        tmo "$python" "$tt" "$4" --gpt2-batch "$2" --gpt2-block "$3" --device cuda --precision "$p" \
          >>"$out/gpt.jsonl" || rc=1
      fi
    done
  done
  cat "$out/gpt.jsonl"
  return "$rc"
}

# CUDA graphs: the small CNNs' steps on one GPU, replayed from a graph and
# with plain launches (dp-bench's two plain rows), in TF32 and bf16-mixed.
step_graphs() {
  local b="$build/apps/dp-bench" rc=0 spec p
  [ -x "$b" ] || { echo "no dp-bench in $build/apps (build step failed?)"; return 1; }
  : >"$out/graphs.jsonl"
  for spec in "lenet 1x28x28 512" "cnn 1x28x28 256"; do
    set -- $spec
    for p in 32 bf16-mixed; do
      echo "== dp-bench --model $1 --input $2 --batch-size $3 --devices 0 --precision $p --allow-tf32"
      frun "$b" --model "$1" --input "$2" --batch-size "$3" --devices 0 --no-ddp --precision "$p" --allow-tf32 \
        --warmup 5 --steps 50 --repeats 3 --json "$out/graphs.jsonl" || rc=1
    done
  done
  cat "$out/graphs.jsonl"
  return "$rc"
}

# Per-replica memory of gpt2 on one GPU repeated (0,0) in bf16-mixed, with
# and without ZeRO-1 and activation checkpointing (--shard-grads is CPU-only).
step_memory() {
  [ -x "$build/apps/dp-train" ] || { echo "no dp-train in $build/apps (build step failed?)"; return 1; }
  frun bash "$repo/bench/zero_memory.sh" --build "$build" --model gpt:gpt2 --batch 16 --steps 6 --devices 0,0 \
    --modes none,none+ckpt,--shard-optimizer,--shard-optimizer+ckpt --extra "--precision bf16-mixed --allow-tf32"
}

# Where a resnet18 step's GPU time goes (batch 256, cuda:0, TF32 and
# bf16-mixed, cuDNN's heuristics): Nsight Compute times every kernel of a
# short dp-bench run (2 configurations x 3 steps: with --cuda-graphs off,
# plain and DataParallel over the one device), kernel_times.py groups them.
step_profile() {
  local b="$build/apps/dp-bench" rc=0 p ncu
  [ -x "$b" ] || { echo "no dp-bench in $build/apps (build step failed?)"; return 1; }
  ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu "${cuda_home:-/usr/local/cuda}"/bin/ncu 2>/dev/null | head -n 1)
  [ -n "$ncu" ] || { echo "ncu not found"; return 1; }
  for p in 32 bf16-mixed bf16-mixed-wide; do  # the last with FANOUT_CUDA_CL_COPIES=wide
    echo "== ncu: dp-bench resnet18 batch 256 --devices 0 --precision ${p%-wide} --allow-tf32 ($p)"
    timeout --kill-after=10 "${FANOUT_PROFILE_TIMEOUT:-120}" env LD_LIBRARY_PATH="$fanout_ld${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
      FANOUT_CUDA_CL_COPIES="$([ "$p" = bf16-mixed-wide ] && echo wide || echo square)" \
      "$ncu" --csv --print-units base --clock-control none --metrics gpu__time_duration.sum \
      --log-file "$out/ncu_$p.csv" "$b" --model resnet18 --input 3x32x32 --batch-size 256 --devices 0 --no-ddp \
      --precision "${p%-wide}" --allow-tf32 --cuda-graphs off --warmup 1 --steps 2 --repeats 1 >/dev/null || rc=1
    "${python:-python3}" "$repo/bench/gpu/kernel_times.py" "$out/ncu_$p.csv" --steps 6 || rc=1
  done
  return "$rc"
}

# Where a GPT step's GPU time goes (bf16-mixed, cuda:0): ncu as in the
# profile step (2 configurations x 3 steps). Kernels run one at a time under ncu, so the total is GPU busy
# time: far below the gpt step's ms a step, the step waits on the host.
step_gptprofile() {
  local b="$build/apps/dp-bench" rc=0 spec ncu
  [ -x "$b" ] || { echo "no dp-bench in $build/apps (build step failed?)"; return 1; }
  ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu "${cuda_home:-/usr/local/cuda}"/bin/ncu 2>/dev/null | head -n 1)
  [ -n "$ncu" ] || { echo "ncu not found"; return 1; }
  for spec in "gpt-char gpt:gpt-char,dropout=0 64 256" "gpt2 gpt:gpt2 8 1024"; do
    set -- $spec
    echo "== ncu: dp-bench $2 batch $3 T $4 --devices 0 --precision bf16-mixed --allow-tf32"
    timeout --kill-after=10 "${FANOUT_PROFILE_TIMEOUT:-150}" env LD_LIBRARY_PATH="$fanout_ld${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
      "$ncu" --csv --print-units base --clock-control none --metrics gpu__time_duration.sum \
      --log-file "$out/ncu_$1.csv" "$b" --model "$2" --batch-size "$3" --input "$4" --devices 0 --no-ddp \
      --precision bf16-mixed --allow-tf32 --cuda-graphs off --optimizer adamw --betas 0.9,0.95 --clip-grad-norm 1 \
      --no-decay-norm-bias --warmup 1 --steps 2 --repeats 1 \
      >/dev/null || rc=1
    "${python:-python3}" "$repo/bench/gpu/kernel_times.py" "$out/ncu_$1.csv" --steps 6 || rc=1
  done
  return "$rc"
}

# ------------------------------------------------------------- runner ----

names=() statuses=() seconds=() logs=()
run_step() {  # run_step NAME LOGFILE FUNCTION
  local name=$1 log=$2 fn=$3 t0 rc status
  echo "== $name -> $log"
  t0=$(date +%s)
  "$fn" >"$log" 2>&1
  rc=$?
  if [ $rc -eq 0 ]; then status=ok; elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then status="TIMEOUT"; else status="FAIL($rc)"; fi
  names+=("$name") statuses+=("$status") seconds+=($(($(date +%s) - t0))) logs+=("$(basename "$log")")
  echo "   $status"
  [ "$status" = ok ] || tail -n 15 "$log" | sed 's/^/   | /'
}

for s in "${steps[@]}"; do
  case $s in
    train)
      run_step train-lenet "$out/dp_train_lenet.log" step_train_lenet
      run_step train-cnn "$out/dp_train_cnn.log" step_train_cnn
      ;;
    bench)
      run_step bench-pytorch "$out/pytorch.log" step_bench_pytorch
      run_step bench-fanout "$out/fanout_bench.log" step_bench_fanout
      ;;
    *) run_step "$s" "$out/$s.log" "step_$s" ;;  # every other step: one function, its own log
  esac
done

failed=0
for st in "${statuses[@]}"; do [ "$st" = ok ] || failed=1; done
{
  echo
  echo "run_gpu.sh summary ($(date -u +%Y-%m-%dT%H:%M:%SZ)), logs in $out"
  printf '%-14s %-10s %8s  %s\n' step status seconds log
  for i in "${!names[@]}"; do
    printf '%-14s %-10s %8s  %s\n' "${names[$i]}" "${statuses[$i]}" "${seconds[$i]}" "${logs[$i]}"
  done
  if [ $failed = 0 ]; then echo "all steps passed"; else echo "SOME STEPS FAILED"; fi
} | tee "$out/summary.txt"
if [ -n "${FANOUT_LOGS_TGZ:-}" ]; then
  mkdir -p "$(dirname "$FANOUT_LOGS_TGZ")"
  tar -czf "$FANOUT_LOGS_TGZ" -C "$(dirname "$out")" "$(basename "$out")" && echo "logs packed into $FANOUT_LOGS_TGZ"
fi
exit $failed
