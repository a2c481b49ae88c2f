// DataParallel with the loss on the replicas against the gathered path
// (torch.nn.DataParallel's): the same losses, metrics and parameters, for
// class labels and for dense heatmap targets, and only the replicas' sums
// reaching the primary.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>

#include "models/layers/activation.h"
#include "models/layers/conv.h"
#include "models/layers/sequential.h"
#include "models/zoo/zoo.h"
#include "runtime/parallel/data_parallel.h"
#include "runtime/parallel/single_device.h"
#include "support/test_util.h"
#include "support/trained.h"

namespace fanout {
namespace {

using testing::random_tensor;

// A small fully convolutional net: (N, 1, H, W) -> (N, 2, H, W) heatmaps.
std::unique_ptr<Module> heatmap_net(uint64_t seed) {
  auto m = std::make_unique<models::Sequential>();
  m->add("conv1", std::make_unique<models::Conv2d>(1, 4, 3, 1, 1));
  m->add("relu1", std::make_unique<models::ReLU>(true));
  m->add("conv2", std::make_unique<models::Conv2d>(4, 2, 3, 1, 1));
  m->init(seed);
  return m;
}

struct DpRun {
  std::vector<StepResult> train, eval;
  std::vector<int64_t> bytes;  // to the primary, per training step
  Tensor params;
};

template <class MakeModel>
DpRun run_dp(MakeModel make, const LossOptions& loss, bool on_replicas, const std::vector<testing::Batch>& batches,
           int devices) {
  auto m = make();
  DataParallelOptions o;
  o.loss_on_replicas = on_replicas;
  testing::Trained<DataParallelEngine> eng(*m, parse_devices("cpu:" + std::to_string(devices)), *make_criterion(loss), o);
  EXPECT_EQ(eng.loss_on_replicas(), on_replicas);
  DpRun r;
  for (auto& b : batches) {
    r.train.push_back(eng.train_step(b.x, b.y, 0.05f));
    r.bytes.push_back(eng.bytes_to_primary());
  }
  for (auto& b : batches) r.eval.push_back(eng.eval_step(b.x, b.y));
  r.params = m->arenas().params.to(Device::cpu());
  return r;
}

void expect_same_results(const DpRun& a, const DpRun& b) {
  ASSERT_EQ(a.train.size(), b.train.size());
  for (size_t i = 0; i < a.train.size(); ++i) {
    for (auto [x, y] : {std::pair{&a.train[i], &b.train[i]}, std::pair{&a.eval[i], &b.eval[i]}}) {
      EXPECT_NEAR(x->loss_sum, y->loss_sum, 1e-5 * std::abs(y->loss_sum)) << "step " << i;
      EXPECT_EQ(x->count, y->count);
      EXPECT_EQ(x->sums[kCorrectSum].value(), y->sums[kCorrectSum].value());
      EXPECT_EQ(x->sums[kPointsSum].value(), y->sums[kPointsSum].value());
      EXPECT_EQ(x->sums[kNearSum].value(), y->sums[kNearSum].value());
      EXPECT_EQ(x->sums[kDistanceSum].value(), y->sums[kDistanceSum].value());
    }
  }
  EXPECT_LT(testing::max_rel_diff(a.params, b.params), 1e-5);
}

TEST(LossOnReplicas, ClassLabelsMatchTheGatheredPath) {
  const Shape sample{1, 28, 28};
  auto batches = testing::random_batches(sample, 22, 4, 31);
  auto make = [&] { return models::make_model("lenet", sample, 10, 5); };
  const LossOptions xent{CriterionKind::CrossEntropy, 0.1f};
  const DpRun local = run_dp(make, xent, true, batches, 3), gathered = run_dp(make, xent, false, batches, 3);
  expect_same_results(local, gathered);
  // Replicas 1 and 2 hold 8 and 6 of the 22 rows: their row losses, labels (the rows not ignored: the
  // accuracy's denominator) and correct counts reach the primary, against their logits (10 floats a row)
  // and labels gathered.
  EXPECT_EQ(local.bytes[0], (8 + 6) * (4 + 4) + 2 * 4);
  EXPECT_EQ(gathered.bytes[0], (8 + 6) * (10 * 4 + 4));
}

// Rows labelled -1 are ignored, as torch's ignore_index: they are no right or wrong answer, so the
// accuracy counts only the others (its denominator, sums[kTargetsSum]), on either path.
TEST(LossOnReplicas, IgnoredLabelsAreNoPartOfTheAccuracy) {
  const Shape sample{1, 28, 28};
  auto batches = testing::random_batches(sample, 22, 2, 33);
  std::vector<int64_t> kept;
  for (auto& b : batches) {
    int64_t n = 0;
    for (int64_t i = 0; i < 22; ++i) {
      if (i % 5 == 1) b.y.data<int32_t>()[i] = -1;
      n += b.y.data<int32_t>()[i] != -1;
    }
    kept.push_back(n);
  }
  auto make = [&] { return models::make_model("lenet", sample, 10, 5); };
  const LossOptions xent{CriterionKind::CrossEntropy, 0.0f};
  const DpRun local = run_dp(make, xent, true, batches, 3), gathered = run_dp(make, xent, false, batches, 3);
  for (const DpRun* r : {&local, &gathered})
    for (size_t i = 0; i < batches.size(); ++i) {
      EXPECT_EQ(r->train[i].count, 22);
      EXPECT_EQ(r->train[i].sums[kTargetsSum].value(), static_cast<double>(kept[i])) << "step " << i;
      EXPECT_LE(r->train[i].sums[kCorrectSum].value(), static_cast<double>(kept[i]));
    }
  expect_same_results(local, gathered);
}

TEST(LossOnReplicas, HeatmapTargetsMatchTheGatheredPathAndOneDevice) {
  std::mt19937_64 rng(32);
  std::vector<testing::Batch> batches;
  for (int s = 0; s < 4; ++s) batches.push_back({random_tensor(Shape{10, 1, 12, 9}, rng), testing::random_heatmaps(Shape{10, 2, 12, 9}, rng)});
  auto make = [] { return heatmap_net(6); };
  const LossOptions mse{CriterionKind::Mse, 0.0f};
  const DpRun local = run_dp(make, mse, true, batches, 3), gathered = run_dp(make, mse, false, batches, 3);
  expect_same_results(local, gathered);
  EXPECT_EQ(local.train[0].sums[kPointsSum].value(), 20);  // every (row, channel) has a peak
  // Replicas 1 and 2 hold 4 and 2 rows: their row losses and the two argmax planes (index and
  // value of output and target) per (row, channel), against their outputs and targets.
  EXPECT_EQ(local.bytes[0], (4 + 2) * 4 + (4 + 2) * 2 * 16);
  EXPECT_EQ(gathered.bytes[0], (4 + 2) * 2 * 12 * 9 * 4 * 2);
  EXPECT_GT(gathered.bytes[0], 10 * local.bytes[0]);

  auto one = make();
  testing::Trained<SingleDeviceEngine> eng(*one, Device::cpu(), *make_criterion(mse), 0);
  for (size_t i = 0; i < batches.size(); ++i) {
    const StepResult r = eng.train_step(batches[i].x, batches[i].y, 0.05f);
    EXPECT_NEAR(r.loss_sum, local.train[i].loss_sum, 1e-5 * r.loss_sum) << "step " << i;
    EXPECT_EQ(r.sums[kPointsSum].value(), local.train[i].sums[kPointsSum].value());
  }
  EXPECT_LT(testing::max_rel_diff(one->arenas().params.to(Device::cpu()), local.params), 1e-5);
}

TEST(LossOnReplicas, OneDeviceMovesNothing) {
  const Shape sample{1, 28, 28};
  auto batches = testing::random_batches(sample, 8, 1, 33);
  auto make = [&] { return models::make_model("mlp", sample, 10, 5); };
  const DpRun local = run_dp(make, {}, true, batches, 1), gathered = run_dp(make, {}, false, batches, 1);
  EXPECT_EQ(local.bytes[0], 0);
  EXPECT_EQ(gathered.bytes[0], 0);
  expect_same_results(local, gathered);
}

TEST(LossOnReplicas, TargetsThatDoNotMatchTheBatchAreOneLineErrors) {
  const Shape sample{1, 28, 28};
  auto m = models::make_model("mlp", sample, 10, 5);
  testing::Trained<DataParallelEngine> eng(*m, parse_devices("cpu:2"), *make_criterion({}));
  auto b = testing::random_batches(sample, 8, 1, 34)[0];
  testing::expect_user_error([&] { eng.train_step(b.x, b.y.slice(0, 5), 0.05f); }, {"targets", "do not match"});
  std::mt19937_64 rng(35);
  const Tensor dense = random_tensor(Shape{8, 10}, rng);
  testing::expect_user_error([&] { eng.train_step(b.x, dense, 0.05f); }, {"cross_entropy", "int32 class indices"});
  // The engine still trains after the errors.
  EXPECT_EQ(eng.train_step(b.x, b.y, 0.05f).count, 8);
}

}  // namespace
}  // namespace fanout
