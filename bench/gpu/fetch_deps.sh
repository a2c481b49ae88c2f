#!/usr/bin/env bash
# fetch_deps.sh [PREFIX]: runs on a Debian/Ubuntu build machine (with apt and
# network) and prepares the dependencies that a GPU machine with only a CUDA
# image lacks: `apt-get download`s the Debian packages below and unpacks them
# with `dpkg-deb -x` into PREFIX (default: $FANOUT_DEPS_PREFIX, else
# third_party/prefix in the repository), then prunes what a build does not
# need.
#
#   oneDNN (libdnnl, the CPU backend's convolutions and GEMM; OpenMP threads)
#   with the OpenCL loader it links, Boost.Program_options
#   (runtime, dev, and only the Boost headers it includes), nlohmann-json,
#   GoogleTest/GoogleMock, Google Benchmark, zlib, Gloo (DDP's CPU collectives)
#   with hiredis and the verbs/netlink libraries it links.
#
# Outputs (all ignored by git through a '*' .gitignore written beside them):
#   PREFIX/              the unpacked prefix (53 MiB, 38 of them oneDNN's
#                        shared library), PREFIX/MANIFEST.txt
#   PREFIX.tar.xz        the same, packed (8.4 MiB): what travels to a GPU
#                        machine; run_gpu.sh unpacks it when PREFIX is absent
#                        (PACK=0 skips it)
#   DATASETS/fashion-mnist/  with FETCH_DATA=1 (default): the IDX files of the
#                        Debian package dataset-fashion-mnist (~30 MiB, already
#                        gzip'd), for dp-train on real data. DATASETS defaults
#                        to $FANOUT_DATASETS, else third_party/datasets.
# Re-running starts from empty outputs. bench/gpu/run_gpu.sh finds them through
# FANOUT_DEPS_PREFIX and FANOUT_DATASETS (same defaults).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
prefix=${1:-${FANOUT_DEPS_PREFIX:-$repo/third_party/prefix}}
fetch_data=${FETCH_DATA:-1}
pack=${PACK:-1}
datasets=${FANOUT_DATASETS:-$repo/third_party/datasets}
arch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo x86_64-linux-gnu)

die() { echo "fetch_deps.sh: $*" >&2; exit 1; }
command -v apt-get >/dev/null || die "needs apt-get (a Debian or Ubuntu machine)"
command -v dpkg-deb >/dev/null || die "needs dpkg-deb"

# The first dependency of package $1 whose name matches $2 (resolves the
# versioned names, e.g. libboost-program-options-dev -> ...1.74-dev).
dep_of() {
  apt-cache depends --no-recommends --no-suggests "$1" 2>/dev/null |
    awk -v pat="$2" '$1 == "Depends:" && $2 ~ pat { gsub(/[<>]/, "", $2); print $2; exit }'
}

po_dev=$(dep_of libboost-program-options-dev '^libboost-program-options[0-9.]+-dev$')
[ -n "$po_dev" ] || die "cannot resolve libboost-program-options-dev's versioned package"
po_rt=$(dep_of "$po_dev" '^libboost-program-options[0-9.]+$')
boost_dev=$(dep_of "$po_dev" '^libboost[0-9.]+-dev$')
bench_rt=$(dep_of libbenchmark-dev '^libbenchmark[0-9]')
if [ -z "$po_rt" ] || [ -z "$boost_dev" ]; then die "cannot resolve Boost packages (got '$po_rt', '$boost_dev')"; fi

packages=(
  libdnnl-dev libdnnl2 ocl-icd-libopencl1
  libboost-program-options-dev "$po_dev" "$po_rt" "$boost_dev"
  nlohmann-json3-dev
  libgtest-dev libgmock-dev
  libbenchmark-dev
  zlib1g-dev zlib1g
  libgloo-dev libgloo0 libhiredis-dev libhiredis0.14 libibverbs1 libnl-3-200 libnl-route-3-200
  libjpeg62-turbo-dev libjpeg62-turbo libpng-dev libpng16-16
)
[ -n "$bench_rt" ] && packages+=("$bench_rt")
[ "$fetch_data" = 1 ] && packages+=(dataset-fashion-mnist)

debs=$(mktemp -d)
trap 'rm -rf "$debs"' EXIT
echo "fetch_deps.sh: downloading ${#packages[@]} packages into $debs"
(cd "$debs" && apt-get download "${packages[@]}") || die "apt-get download failed (try: apt-get update)"

rm -rf "$prefix" "$prefix.tar.xz"
mkdir -p "$prefix"
for deb in "$debs"/*.deb; do
  case $(basename "$deb") in
    dataset-fashion-mnist_*) ;;  # unpacked beside the prefix, below
    *) dpkg-deb -x "$deb" "$prefix" ;;
  esac
done
if [ "$fetch_data" = 1 ]; then
  rm -rf "$datasets/fashion-mnist"
  mkdir -p "$datasets"
  echo '*' >"$datasets/.gitignore"
  ds_tmp=$(mktemp -d)
  dpkg-deb -x "$debs"/dataset-fashion-mnist_*.deb "$ds_tmp"
  mv "$ds_tmp/usr/share/datasets/fashion-mnist" "$datasets/fashion-mnist"
  rm -rf "$ds_tmp"
fi

# ---- prune ----
rm -rf "${prefix:?}"/usr/share/doc "${prefix:?}"/usr/share/man "${prefix:?}"/usr/share/lintian \
  "${prefix:?}"/usr/share/bug "${prefix:?}"/usr/src "${prefix:?}"/etc
lib="$prefix/usr/lib/$arch"
# Static archives that have a shared twin; GoogleTest and Google Benchmark
# ship static archives only, so those stay.
find "$prefix" -name 'libboost_*.a' -delete
# oneDNN's CMake package names absolute paths; the build finds it by path.
rm -rf "$lib/cmake/dnnl"

# Boost: keep only the headers that <boost/program_options.hpp> pulls in (under
# several language standards), plus the small configuration trees whose
# choice depends on the compiler.
inc="$prefix/usr/include"
if [ -d "$inc/boost" ]; then
  keep=$(mktemp)
  for std in c++14 c++17 c++20 c++2b; do
    echo '#include <boost/program_options.hpp>' |
      g++ -std=$std -x c++ -M -nostdinc++ -I"$inc" -isystem /usr/include/c++/"$(g++ -dumpversion | cut -d. -f1)" \
        -isystem /usr/include/"$arch"/c++/"$(g++ -dumpversion | cut -d. -f1)" - 2>/dev/null || true
    echo '#include <boost/program_options.hpp>' | g++ -std=$std -x c++ -M -I"$inc" - 2>/dev/null || true
  done | sed 's/[ \\]/\n/g' | grep "^$inc/boost/" | sort -u >"$keep"
  [ -s "$keep" ] || die "could not compute the Boost header closure (is g++ installed?)"
  pruned=$(mktemp -d)
  while read -r f; do
    rel=${f#"$inc"/}
    mkdir -p "$pruned/$(dirname "$rel")"
    cp -p "$f" "$pruned/$rel"
  done <"$keep"
  for d in config predef detail type_traits; do
    [ -d "$inc/boost/$d" ] && mkdir -p "$pruned/boost/$d" && cp -rp "$inc/boost/$d/." "$pruned/boost/$d/"
  done
  cp -p "$inc/boost/version.hpp" "$pruned/boost/" 2>/dev/null || true
  rm -rf "$inc/boost"
  mv "$pruned/boost" "$inc/boost"
  rm -rf "$pruned" "$keep"
fi

# Absolute symlinks (e.g. libz.so -> /lib/...) would point outside the prefix:
# make them relative when the target is inside the prefix.
while IFS= read -r -d '' link; do
  target=$(readlink "$link")
  case $target in
    /*)
      if [ -e "$prefix$target" ]; then
        ln -sfn "$(realpath --relative-to="$(dirname "$link")" "$prefix$target")" "$link"
      fi
      ;;
  esac
done < <(find "$prefix" -type l -print0)
# zlib1g puts its runtime under /lib on some releases and usr/lib on others.
if [ ! -e "$lib/libz.so" ] && [ -e "$prefix/lib/$arch/libz.so.1" ]; then
  ln -sfn "../../../lib/$arch/libz.so.1" "$lib/libz.so"
fi

echo '*' >"$prefix/.gitignore"

# ---- check and describe ----
missing=0
need() {  # need DESCRIPTION PATH...: one of the paths must exist
  local what=$1
  shift
  for p in "$@"; do
    if [ -e "$p" ]; then
      printf '  %-34s %s\n' "$what" "${p#"$prefix"/}"
      return 0
    fi
  done
  printf '  %-34s MISSING\n' "$what"
  missing=1
}
{
  echo "fanout GPU-machine dependency prefix, made by bench/gpu/fetch_deps.sh on $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  # shellcheck disable=SC1091
  echo "host: $(. /etc/os-release && echo "$PRETTY_NAME"), glibc $(ldd --version | head -1 | awk '{print $NF}'), arch $arch"
  echo
  echo "packages:"
  for deb in "$debs"/*.deb; do
    printf '  %-40s %-28s %8s KiB .deb\n' "$(dpkg-deb -f "$deb" Package)" "$(dpkg-deb -f "$deb" Version)" \
      "$(($(stat -c %s "$deb") / 1024))"
  done
  echo
  echo "what the build looks for:"
  need "oneapi/dnnl/dnnl.hpp" "$inc/oneapi/dnnl/dnnl.hpp"
  need "libdnnl.so" "$lib/libdnnl.so"
  need "libdnnl.so.2" "$lib/libdnnl.so.2"
  need "libOpenCL.so.1" "$lib/libOpenCL.so.1"
  need "boost/program_options.hpp" "$inc/boost/program_options.hpp"
  need "libboost_program_options.so" "$lib/libboost_program_options.so"
  need "Boost CMake config" "$lib"/cmake/Boost-*/BoostConfig.cmake
  need "gtest/gtest.h" "$inc/gtest/gtest.h"
  need "libgtest.a" "$lib/libgtest.a"
  need "GTest CMake config" "$lib/cmake/GTest/GTestConfig.cmake"
  need "benchmark/benchmark.h" "$inc/benchmark/benchmark.h"
  need "nlohmann/json.hpp" "$inc/nlohmann/json.hpp"
  need "nlohmann_json CMake config" "$prefix/usr/share/cmake/nlohmann_json/nlohmann_jsonConfig.cmake" \
    "$lib/cmake/nlohmann_json/nlohmann_jsonConfig.cmake"
  need "zlib.h" "$inc/zlib.h"
  need "libz.so" "$lib/libz.so"
  need "gloo/config.h" "$inc/gloo/config.h"
  need "libgloo.so" "$prefix/usr/lib/libgloo.so"
  need "libhiredis.so" "$lib/libhiredis.so"
  need "libibverbs.so.1" "$lib/libibverbs.so.1"
  need "jpeglib.h" "$inc/jpeglib.h"
  need "jconfig.h" "$inc/$arch/jconfig.h"
  need "libjpeg.so" "$lib/libjpeg.so"
  need "png.h" "$inc/png.h"
  need "libpng.so" "$lib/libpng.so"
  if [ "$fetch_data" = 1 ]; then
    need "Fashion-MNIST (outside the prefix)" "$datasets/fashion-mnist/train-images-idx3-ubyte.gz"
  fi
  echo
  echo "prefix size: $(du -sh "$prefix" | cut -f1) unpacked"
  du -sh "$prefix"/usr/include "$lib" 2>/dev/null | sed 's/^/  /'
  if [ "$fetch_data" = 1 ]; then
    echo "dataset: $(du -sh "$datasets/fashion-mnist" | cut -f1) at $datasets/fashion-mnist"
  fi
} | tee "$prefix/MANIFEST.txt"
[ "$missing" = 0 ] || die "some files are missing (see above)"
if [ "$pack" = 1 ]; then
  mkdir -p "$(dirname "$prefix")"
  # Keep the archive out of git too: a new folder (third_party/ by default)
  # holds only generated files, so it ignores everything in it.
  ign="$(dirname "$prefix")/.gitignore"
  if [ ! -e "$ign" ]; then
    echo '*' >"$ign"
  elif ! grep -qxF '*' "$ign" && ! grep -qxF "$(basename "$prefix").tar.xz" "$ign"; then
    printf '%s\n' "$(basename "$prefix").tar.xz" >>"$ign"
  fi
  tar -C "$prefix" -cf - . | xz -6 -T2 >"$prefix.tar.xz"
  echo "packed: $prefix.tar.xz ($(du -sh "$prefix.tar.xz" | cut -f1))" | tee -a "$prefix/MANIFEST.txt"
fi
echo "fetch_deps.sh: prefix ready at $prefix"
