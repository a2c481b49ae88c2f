#!/usr/bin/env bash
# The build links Debian's oneDNN 2.6; the code also builds against oneDNN 3
# (FANOUT_DNNL3). This keeps it so: every source that includes oneDNN is
# compiled (syntax only, warnings as errors) against each oneDNN 3 header set
# apps/setup.sh fetched into third_party/onednn3. Exit 77 (skip) when none is there.
# Usage: onednn3_api.sh CXX SOURCE_DIR
set -euo pipefail
cxx=$1
src=$2
shopt -s nullglob
sets=("$src"/third_party/onednn3/*/include)
if [ ${#sets[@]} -eq 0 ]; then
  echo "no oneDNN 3 headers in $src/third_party/onednn3 (apps/setup.sh fetches them from PyPI)"
  exit 77
fi
mapfile -t files < <(cd "$src" && grep -rlE --include='*.cpp' 'oneapi/dnnl/|kernels/cpu/onednn\.h' kernels bench | sort)
[ ${#files[@]} -ge 3 ] || { echo "found only ${#files[@]} sources that include oneDNN: ${files[*]}"; exit 1; }
for inc in "${sets[@]}"; do
  major=$(awk '/#define DNNL_VERSION_MAJOR/ {print $3}' "$inc/oneapi/dnnl/dnnl_version.h")
  minor=$(awk '/#define DNNL_VERSION_MINOR/ {print $3}' "$inc/oneapi/dnnl/dnnl_version.h")
  [ "$major" = 3 ] || { echo "$inc holds oneDNN $major.$minor, not 3"; exit 1; }
  for f in "${files[@]}"; do
    "$cxx" -std=c++20 -fsyntax-only -fopenmp -Wall -Wextra -Wno-unused-parameter -Werror \
      -I"$inc" -I"$src" "$src/$f"
  done
  echo "oneDNN $major.$minor: ${#files[@]} sources compile (${files[*]})"
done
