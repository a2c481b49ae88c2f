// The batches of the CUDA training tests, shared with batch_tool (which
// writes them for test/cuda/margins.py): `batch` samples drawn uniformly in
// [-1, 1) and their targets.
#pragma once
#include <random>
#include <string>

#include "models/zoo/zoo.h"
#include "runtime/core/tensor.h"
#include "runtime/nn/criterion.h"
#include "support/test_util.h"

namespace fanout::cudatest {

// A batch of `batch` samples and its targets: class labels, or for a dense
// model (heatmap3d, 3 landmarks) heatmaps of the input's spatial shape.
struct TargetBatch {
  Tensor x, y;
  LossOptions loss;
  int classes = 10;
};
inline TargetBatch make_batch(const std::string& model, const Shape& sample, int64_t batch, std::mt19937_64& rng) {
  TargetBatch b;
  Shape xs = sample;
  xs.ndim = sample.ndim + 1;
  xs[0] = batch;
  for (int i = 0; i < sample.ndim; ++i) xs[i + 1] = sample[i];
  b.x = testing::random_tensor(xs, rng);
  if (models::dense_output(model)) {
    b.classes = 3;
    b.loss.criterion = CriterionKind::Mse;
    Shape ys = xs;
    ys[1] = b.classes;
    b.y = testing::random_heatmaps(ys, rng);
  } else {
    b.y = testing::random_labels(batch, b.classes, rng);
  }
  return b;
}

// The zoo's image models at the sizes the CPU mixed-precision tests take.
struct ZooCase {
  const char* model;
  Shape sample;
};
inline const ZooCase kImageZoo[] = {{"mlp", Shape{1, 12, 12}},        {"lenet", Shape{1, 28, 28}},
                                    {"cnn", Shape{3, 16, 16}},        {"resnet18", Shape{3, 16, 16}},
                                    {"heatmap3d", Shape{1, 8, 8, 8}}, {"heatmap3d:group", Shape{1, 8, 8, 8}}};

}  // namespace fanout::cudatest

// A suite parameterized by the low type, instantiated for bfloat16 and float16 (names BF16, F16).
#define FANOUT_LOW_TYPE_SUITE(Suite)                                                       \
  INSTANTIATE_TEST_SUITE_P(Types, Suite, ::testing::Values(DType::BF16, DType::F16),      \
                           [](const auto& info) { return info.param == DType::BF16 ? "BF16" : "F16"; })
