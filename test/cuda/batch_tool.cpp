// batch_tool: writes what a CUDA training test trains on, for
// test/cuda/margins.py to measure in float64 with PyTorch:
//   batch_tool MODEL SHAPE BATCH MODEL_SEED DATA_SEED STEPS OUT
// OUT (safetensors) holds init.<name> (every parameter and buffer of
// make_model(MODEL, SHAPE, classes, MODEL_SEED)) and x<i>, y<i> for i < STEPS:
// the batches make_batch draws, one after another, from mt19937_64(DATA_SEED).
// Exit codes: 0 ok, 1 error (message on stderr), 2 usage.
#include <cstdio>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cuda/target_batch.h"
#include "runtime/io/safetensors.h"
#include "support/shape_arg.h"

using namespace fanout;

int main(int argc, char** argv) {
  if (argc != 8) {
    std::fprintf(stderr, "usage: batch_tool MODEL SHAPE BATCH MODEL_SEED DATA_SEED STEPS OUT\n");
    return 2;
  }
  try {
    const std::string model = argv[1];
    const Shape sample = testing::parse_shape(argv[2]);
    const int64_t batch = std::stoll(argv[3]);
    std::mt19937_64 rng(std::stoull(argv[5]));
    std::vector<std::pair<std::string, Tensor>> out;
    int classes = 10;
    for (int i = 0; i < std::stoi(argv[6]); ++i) {
      const cudatest::TargetBatch b = cudatest::make_batch(model, sample, batch, rng);
      out.emplace_back("x" + std::to_string(i), b.x);
      out.emplace_back("y" + std::to_string(i), b.y);
      classes = b.classes;
    }
    auto m = models::make_model(model, sample, classes, std::stoull(argv[4]));
    for (auto& [n, t] : m->state_dict()) out.emplace_back("init." + n, t.to(Device::cpu()));
    io::save_safetensors(argv[7], out, {{"model", model}});
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "batch_tool: %s\n", e.what());
    return 1;
  }
}
