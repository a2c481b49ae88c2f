#!/usr/bin/env bash
# Builds the safetensors parser fuzzer (libFuzzer + ASan + UBSan, with clang)
# from the few fanout sources it needs, writes a small seed corpus and runs it.
#
#   test/fuzz/run_fuzz.sh [SECONDS=60] [WORK_DIR=build-fuzz]
#
# Exit status: 0 when the run found nothing; libFuzzer's non-zero status
# otherwise, with the crashing input under WORK_DIR/artifacts/.
set -euo pipefail
export LC_ALL=C  # ${#s} counts bytes

secs=${1:-60}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
work=${2:-$root/build-fuzz}
mkdir -p "$work"
work=$(cd "$work" && pwd)

cxx=${FUZZ_CXX:-}
if [[ -z $cxx ]]; then
  for c in clang++ clang++-19 clang++-18 clang++-17 clang++-16 clang++-15 clang++-14; do
    if command -v "$c" >/dev/null; then cxx=$c; break; fi
  done
fi
if [[ -z $cxx ]]; then
  echo "run_fuzz.sh: needs clang++ with libFuzzer (e.g. apt-get install clang libclang-rt-14-dev)" >&2
  exit 2
fi

bin=$work/safetensors_fuzz
echo "building $bin with $cxx"
"$cxx" -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
  -I"$root" \
  "$root/test/fuzz/safetensors_fuzz.cpp" \
  "$root/runtime/io/safetensors.cpp" \
  "$root/runtime/core/tensor.cpp" \
  "$root/runtime/core/memory.cpp" \
  "$root/runtime/core/device.cpp" \
  "$root/runtime/core/backend_none.cpp" \
  -o "$bin"

# Seed corpus: valid files covering every dtype, scalars, empty tensors,
# metadata and ignored keys. The fuzzer adds what it finds beside them.
corpus=$work/corpus
mkdir -p "$corpus" "$work/artifacts"
seed() {  # seed NAME HEADER [DATA as printf escapes]
  local header=$2
  header+=$(printf '%*s' $(((8 - ${#header} % 8) % 8)) '')
  local n=${#header}
  {
    printf "$(printf '\\x%02x\\x%02x\\x%02x\\x%02x' $((n & 255)) $(((n >> 8) & 255)) $(((n >> 16) & 255)) 0)"
    printf '\x00\x00\x00\x00'
    printf '%s' "$header"
    printf "${3:-}"
  } >"$corpus/seed_$1"
}
seed empty '{}'
seed metadata '{"__metadata__":{"format":"pt","epoch":"3"}}'
seed one_f32 '{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}' '\x00\x00\x80\x3f\x00\x00\x00\xc0'
seed all_dtypes '{"__metadata__":{"k":"v"},"a":{"dtype":"F32","shape":[1,2],"data_offsets":[0,8]},"n":{"dtype":"I64","shape":[],"data_offsets":[8,16]},"l":{"dtype":"I32","shape":[1],"data_offsets":[16,20]},"p":{"dtype":"U8","shape":[3],"data_offsets":[20,23]}}' \
  '\x00\x00\x80\x3f\x00\x00\x00\x40\x07\x00\x00\x00\x00\x00\x00\x00\x05\x00\x00\x00\x01\x02\x03'
seed five_d '{"v":{"dtype":"F32","shape":[1,1,0,2,3],"data_offsets":[0,0]},"e":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}}'
seed extra_keys '{"w":{"x":{"y":[1,[2,{"z":null}],"s",1.5,true]},"dtype":"U8","shape":[2],"data_offsets":[0,2]}}' '\x01\x02'
seed unordered '{"b":{"dtype":"U8","shape":[1],"data_offsets":[1,2]},"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}' '\x01\x02'

dict=$work/safetensors.dict
cat >"$dict" <<'DICT'
"{"
"}"
"["
"]"
":"
","
"\""
"\"dtype\""
"\"shape\""
"\"data_offsets\""
"\"__metadata__\""
"\"F32\""
"\"I32\""
"\"I64\""
"\"U8\""
"\"F16\""
"18446744073709551615"
"9223372036854775807"
"4294967296"
"-1"
"1e3"
"\\u0000"
"\\ud800"
DICT

echo "fuzzing for ${secs}s (corpus $corpus)"
"$bin" -max_total_time="$secs" -max_len=4096 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
  -dict="$dict" -artifact_prefix="$work/artifacts/" "$corpus"
