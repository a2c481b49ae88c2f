#!/usr/bin/env bash
# e2e: `cmake --install` gives a package that another project finds with
# find_package(fanout) and links as fanout::fanout; the consumers are the
# README's library example (your own loop, criterion, AdamW and clipping)
# and its "Writing a layer" example (a layer of your own, its gradient
# check, a TensorDataset and the Trainer over cpu:2) and its GPT example (a
# transformer block of your own on token windows over cpu:2). Headers: only
# <fanout/...> ones are used and installed, none of the backends' internal
# headers is, every one compiles warning-free under -Wall -Wextra, and the
# consumer's own models/ and runtime/ folders (first on
# its include path, each header an #error) are never picked up by fanout's.
set -euo pipefail
src=$1
build=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" > "$work/install.log" 2>&1
# A build with the e2e tests' fault hooks says so when it is installed (and only such a build).
if grep -q '^FANOUT_TEST_HOOKS:BOOL=ON' "$build/CMakeCache.txt"; then
  grep -q "this dp-train honours the e2e tests' FANOUT_TEST_\* fault hooks" "$work/install.log" ||
    { cat "$work/install.log"; echo "FAIL: installing a build with the fault hooks gives no warning"; exit 1; }
else
  ! grep -q "fault hooks" "$work/install.log" || { echo "FAIL: a build without the hooks warns of them"; exit 1; }
fi
inc="$work/prefix/include"
[ -f "$inc/fanout/runtime/core/tensor.h" ] || { echo "FAIL: no runtime/core/tensor.h under $inc/fanout"; exit 1; }
for internal in kernels/cpu kernels/cuda runtime/cuda; do
  [ ! -e "$inc/fanout/$internal" ] || { echo "FAIL: $internal is installed"; exit 1; }
done
[ ! -e "$inc/runtime" ] && [ ! -e "$inc/models" ] || { echo "FAIL: headers outside $inc/fanout"; exit 1; }
if grep -rhoE '#include "(runtime|kernels|models)/' "$inc/fanout" | head -1 | grep -q .; then
  echo "FAIL: an installed header includes a path without fanout/"; exit 1
fi
# Every installed header compiles without a warning under -Wall -Wextra when
# found through -I, as a Makefile would (CMake's imported target gives
# -isystem, which hides them).
(cd "$inc" && find fanout -name '*.h' | sort | sed 's/.*/#include <&>/') > "$work/all_headers.cpp"
c++ -std=c++20 -Wall -Wextra -Werror -fsyntax-only -I"$inc" "$work/all_headers.cpp" ||
  { echo "FAIL: the installed headers warn under -Wall -Wextra"; exit 1; }
mkdir -p "$work/app"
cat > "$work/app/CMakeLists.txt" <<'CM'
cmake_minimum_required(VERSION 3.20)
project(consumer CXX)
set(CMAKE_CXX_STANDARD 20)
find_package(fanout REQUIRED)
add_executable(consumer main.cpp)
target_link_libraries(consumer PRIVATE fanout::fanout)
add_executable(layer layer.cpp)
target_link_libraries(layer PRIVATE fanout::fanout)
add_executable(gpt gpt.cpp)
target_link_libraries(gpt PRIVATE fanout::fanout)
# The project's own folders come first on its include path.
target_include_directories(consumer BEFORE PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
target_include_directories(layer BEFORE PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
target_include_directories(gpt BEFORE PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
CM
# A project with folders named as fanout's: any of its headers picked up
# instead of fanout's stops the build.
for h in models/zoo/zoo.h models/layers/linear.h runtime/core/tensor.h runtime/nn/module.h kernels/declare.h; do
  mkdir -p "$work/app/$(dirname "$h")"
  echo "#error \"the consumer's own $h was included instead of fanout's\"" > "$work/app/$h"
done
# The README's library example, as it stands there.
sed -n '/<!-- library-example begin -->/,/<!-- library-example end -->/p' "$src/README.md" | sed '1,2d;$d' | sed '$d' \
  > "$work/app/main.cpp"
grep -q "int main" "$work/app/main.cpp" || { echo "FAIL: no library example in README.md"; exit 1; }
sed -n '/<!-- layer-example begin -->/,/<!-- layer-example end -->/p' "$src/README.md" | sed '1,2d;$d' | sed '$d' \
  > "$work/app/layer.cpp"
grep -q "int main" "$work/app/layer.cpp" || { echo "FAIL: no layer example in README.md"; exit 1; }
sed -n '/<!-- gpt-example begin -->/,/<!-- gpt-example end -->/p' "$src/README.md" | sed '1,2d;$d' | sed '$d' \
  > "$work/app/gpt.cpp"
grep -q "int main" "$work/app/gpt.cpp" || { echo "FAIL: no GPT example in README.md"; exit 1; }
if grep -hE '#include "(runtime|kernels|models)/' "$work/app/main.cpp" "$work/app/layer.cpp" "$work/app/gpt.cpp"; then
  echo "FAIL: the README's examples include fanout headers without <fanout/...>"; exit 1
fi
cmake -S "$work/app" -B "$work/app/build" -DCMAKE_PREFIX_PATH="$work/prefix" > "$work/cfg.log"
cmake --build "$work/app/build" -j2 > "$work/build.log"
(cd "$work" && LD_LIBRARY_PATH="$work/prefix/lib:${LD_LIBRARY_PATH:-}" "$work/app/build/consumer") | tee "$work/out.txt"
(cd "$work" && LD_LIBRARY_PATH="$work/prefix/lib:${LD_LIBRARY_PATH:-}" "$work/app/build/layer") | tee "$work/layer.txt"
(cd "$work" && LD_LIBRARY_PATH="$work/prefix/lib:${LD_LIBRARY_PATH:-}" "$work/app/build/gpt") | tee "$work/gpt.txt"
python3 - "$work" <<'PY'
import re, sys
from safetensors.numpy import load_file
work = sys.argv[1]
losses = [float(m) for m in re.findall(r"mean loss ([0-9.]+)", open(f"{work}/out.txt").read())]
assert len(losses) == 3 and losses[2] < 0.7 * losses[0], f"the example's loss did not fall: {losses}"
t = load_file(f"{work}/lenet.safetensors")
assert "conv1.weight" in t and "optimizer.exp_avg.conv1.weight" in t and "optimizer.exp_avg_sq.fc3.bias" in t, sorted(t)
print(f"README library example: mean loss {losses[0]:.3f} -> {losses[2]:.3f}; checkpoint with AdamW state")
out = open(f"{work}/layer.txt").read()
worst = float(re.search(r"gradient check: worst ([0-9.e+-]+)", out).group(1))
acc = float(re.search(r"test accuracy ([0-9.]+)", out).group(1))
steps = re.findall(r"step (\d+) loss ([0-9.]+)", out)
assert worst < 1e-2, f"the layer example's gradient check: {worst}"
assert acc >= 0.95, f"the layer example's test accuracy {acc}"
assert len(steps) == 3, f"on_step lines: {steps}"
print(f"README layer example: gradient check {worst:.1e}, test accuracy {acc:.4f}")
out = open(f"{work}/gpt.txt").read()
steps = [float(v) for v in re.findall(r"step \d+ loss ([0-9.]+)", out)]
acc = float(re.search(r"next-token accuracy ([0-9.]+)", out).group(1))
assert len(steps) >= 3 and steps[-1] < 0.5 * steps[0], f"the GPT example's loss did not fall: {steps}"
assert acc >= 0.95, f"the GPT example's next-token accuracy {acc}"
print(f"README GPT example: loss {steps[0]:.3f} -> {steps[-1]:.3f}, next-token accuracy {acc:.4f}")
PY
