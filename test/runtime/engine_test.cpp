// Single-device engine: a training step lowers the loss, matches the manual
// forward / backward / SGD sequence, and allocates nothing once warm.
#include <gtest/gtest.h>

#include "models/zoo/zoo.h"
#include "runtime/data/loader.h"
#include "runtime/parallel/single_device.h"
#include "support/test_util.h"

namespace fanout {
namespace {

TEST(SingleDeviceEngine, LossFallsOnAFixedBatch) {
  auto model = models::make_model("mlp", Shape{3, 8, 8}, 10, 1);
  kernels::SgdHyper h;
  h.lr = 0.05f;
  h.momentum = 0.9f;
  SingleDeviceEngine eng(*model, Device::cpu(), h, {}, 1);
  std::mt19937_64 rng(2);
  Tensor x = testing::random_tensor(Shape{16, 3, 8, 8}, rng);
  Tensor y = testing::random_labels(16, 10, rng);
  const double first = eng.train_step(x, y, 0.05f).loss_sum / 16;
  double last = first;
  for (int i = 0; i < 40; ++i) last = eng.train_step(x, y, 0.05f).loss_sum / 16;
  EXPECT_LT(last, 0.2 * first);
  EXPECT_EQ(eng.eval_step(x, y).correct, 16);
}

TEST(SingleDeviceEngine, SteadyStateAllocatesNothing) {
  auto data = data::make_synthetic(64, 3);
  auto model = models::make_model("cnn", data.train.sample_shape(), 10, 3);
  kernels::SgdHyper h;
  h.momentum = 0.9f;
  SingleDeviceEngine eng(*model, Device::cpu(), h, {}, 3);
  data::LoaderOptions lo;
  lo.batch_size = 24;  // 24, 24, 16: a smaller last batch
  data::DataLoader loader(data.train, std::make_unique<data::RandomSampler>(data.train.size(), 3), lo);
  loader.start_epoch(0);
  Tensor x, y;
  std::vector<std::pair<Tensor, Tensor>> batches;
  while (loader.next(x, y)) batches.emplace_back(x.to(Device::cpu()), y.to(Device::cpu()));
  for (auto& [bx, by] : batches) eng.train_step(bx, by, 0.01f);  // warm-up: every batch size seen
  const auto before = alloc_stats();
  for (int rep = 0; rep < 2; ++rep)
    for (auto& [bx, by] : batches) eng.train_step(bx, by, 0.01f);
  const auto after = alloc_stats();
  EXPECT_EQ(after.host_allocs, before.host_allocs);
  EXPECT_EQ(after.device_allocs, before.device_allocs);
}

}  // namespace
}  // namespace fanout
