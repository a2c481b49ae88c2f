#!/usr/bin/env bash
# e2e: `cmake --install` gives a package that another project finds with
# find_package(fanout) and links as fanout::fanout; the consumer trains a step.
set -euo pipefail
src=$1
build=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" > "$work/install.log"
mkdir -p "$work/app"
cat > "$work/app/CMakeLists.txt" <<'CM'
cmake_minimum_required(VERSION 3.20)
project(consumer CXX)
set(CMAKE_CXX_STANDARD 20)
find_package(fanout REQUIRED)
add_executable(consumer main.cpp)
target_link_libraries(consumer PRIVATE fanout::fanout)
CM
cat > "$work/app/main.cpp" <<'CPP'
#include <cstdio>
#include <memory>
#include "models/zoo/zoo.h"
#include "runtime/data/loader.h"
#include "runtime/parallel/single_device.h"
#include "runtime/train/checkpoint.h"
int main(int argc, char** argv) {
  using namespace fanout;
  auto data = data::make_synthetic(32, 1);
  auto model = models::make_model("lenet", data.train.sample_shape(), 10, 1);
  SingleDeviceEngine engine(*model, Device::cpu(), kernels::SgdHyper{}, LossOptions{}, 1);
  data::LoaderOptions lo;
  lo.batch_size = 16;
  lo.workers = 1;
  data::DataLoader loader(data.train, std::make_unique<data::RandomSampler>(data.train.size(), 1), lo);
  loader.start_epoch(0);
  Tensor x, y;
  double loss = 0;
  while (loader.next(x, y)) loss = engine.train_step(x, y, 0.01f).loss_sum;
  train::CheckpointState st;
  st.epoch = 1;
  train::save_checkpoint(argv[1], engine, st);
  std::printf("consumer trained: last batch loss sum %.4f\n", loss);
  return loss > 0 && argc == 2 ? 0 : 1;
}
CPP
cmake -S "$work/app" -B "$work/app/build" -DCMAKE_PREFIX_PATH="$work/prefix" > "$work/cfg.log"
cmake --build "$work/app/build" -j2 > "$work/build.log"
LD_LIBRARY_PATH="$work/prefix/lib:${LD_LIBRARY_PATH:-}" "$work/app/build/consumer" "$work/consumer.safetensors"
test -s "$work/consumer.safetensors"
