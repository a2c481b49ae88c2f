// Data of any shape through the loader and the Trainer (data::Dataset,
// data::TensorDataset), with a model of the user's own built from layers:
//  - (N, 2) points in 3 classes: the loader gives the same batches with 0
//    and 2 workers, and training with split-invariant math gives the same
//    parameters bit for bit on cpu and DataParallel cpu:2 with either
//    worker count; the classes are learned (test accuracy >= 0.95).
//  - (N, 16) features with dense (N, 4) targets under mse: the test loss
//    falls below 2% of predicting zero (measured 1.1%), and cpu:2 with 2
//    workers gives cpu's parameters bit for bit (split-invariant).
//  - Token ids: (N, T) int32 inputs and (N, T) int32 targets (-1 ignored)
//    batch as int32 with 0 and 2 workers alike, and a GPT learns a
//    deterministic sequence through the Trainer (token_cross_entropy; test
//    accuracy over the targets 1.0), on cpu and on cpu:2 with 2 workers bit
//    for bit (split-invariant).
//  - An ImageDataset without statistics is used as it is (no normalization).
//  - Bad tensors are one-line errors naming the dataset.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "models/layers/activation.h"
#include "models/layers/linear.h"
#include "models/layers/sequential.h"
#include "models/layers/smooth_activation.h"
#include "models/zoo/gpt.h"
#include "runtime/data/loader.h"
#include "runtime/optim/optimizer.h"
#include "runtime/parallel/engine_factory.h"
#include "runtime/train/trainer.h"
#include "support/test_util.h"

namespace fanout {
namespace {

using models::Linear;
using models::ReLU;
using models::Sequential;

// n points around 3 centres on a circle of radius 2, class = centre.
data::TensorDataset blobs(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> noise(0.0f, 0.35f);
  Tensor x = Tensor::empty(Shape{n, 2}), y = Tensor::empty(Shape{n}, DType::I32);
  for (int64_t i = 0; i < n; ++i) {
    const int c = static_cast<int>(i % 3);
    const double a = 2.0 * M_PI * c / 3;
    x.f32()[2 * i] = static_cast<float>(2 * std::cos(a)) + noise(rng);
    x.f32()[2 * i + 1] = static_cast<float>(2 * std::sin(a)) + noise(rng);
    y.data<int32_t>()[i] = c;
  }
  return data::TensorDataset(x, y, "blobs");
}

// y = A x + small noise, A fixed by the seed: (n, 16) -> (n, 4).
data::TensorDataset regression(int64_t n, uint64_t data_seed) {
  std::mt19937_64 fixed(77), rng(data_seed);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> a(4 * 16);
  for (float& v : a) v = g(fixed) * 0.25f;
  Tensor x = Tensor::empty(Shape{n, 16}), y = Tensor::empty(Shape{n, 4});
  for (int64_t i = 0; i < n; ++i) {
    for (int k = 0; k < 16; ++k) x.f32()[i * 16 + k] = g(rng);
    for (int o = 0; o < 4; ++o) {
      double s = 0;
      for (int k = 0; k < 16; ++k) s += a[o * 16 + k] * x.f32()[i * 16 + k];
      y.f32()[i * 4 + o] = static_cast<float>(s) + 0.01f * g(rng);
    }
  }
  return data::TensorDataset(x, y, "regression");
}

std::unique_ptr<Module> two_layers(int64_t in, int64_t hidden, int64_t out, uint64_t seed) {
  auto m = std::make_unique<Sequential>();
  m->add("fc1", std::make_unique<Linear>(in, hidden));
  m->add("act", std::make_unique<ReLU>());
  m->add("fc2", std::make_unique<Linear>(hidden, out));
  m->init(seed);
  return m;
}

struct Result {
  train::EpochMetrics metrics;
  Tensor params;
};

Result fit(const data::Dataset& train, const data::Dataset& test, std::unique_ptr<Module> model,
           const std::string& devices, int workers, const LossOptions& loss, bool split_invariant, int epochs,
           optim::OptimizerKind kind = optim::OptimizerKind::SGD) {
  EngineSpec spec;
  spec.devices = parse_devices(devices);
  spec.loss = loss;
  spec.dp.math.split_invariant = split_invariant;
  spec.dp.seed = 1;
  auto engine = make_engine(*model, std::move(spec));
  optim::OptimizerOptions o;
  o.kind = kind;
  o.lr = kind == optim::OptimizerKind::SGD ? 0.05f : 1e-2f;
  o.momentum = kind == optim::OptimizerKind::SGD ? 0.9f : 0.0f;
  auto opt = optim::make_optimizer(engine->model(), engine->primary_context(), o);
  train::TrainerConfig tc;
  tc.epochs = epochs;
  tc.batch_size = 32;
  tc.seed = 2;
  tc.workers = workers;
  tc.schedule = optim::parse_lr_schedule("constant", o.lr, epochs, 0);
  tc.progress = train::Progress::Mode::Off;
  tc.summary_out = nullptr;
  train::Trainer t(tc, *engine, *opt, train, test);
  Result r{t.run(), {}};
  r.params = model->arenas().params.to(Device::cpu());
  return r;
}

// Each batch of one epoch of ds through a loader with `workers` threads
// (RandomSampler seeded 5), handed to fn(x, y).
template <class Fn>
void for_each_batch(const data::Dataset& ds, int64_t batch_size, int workers, int epoch, Fn fn) {
  data::LoaderOptions lo;
  lo.batch_size = batch_size;
  lo.workers = workers;
  data::DataLoader loader(ds, std::make_unique<data::RandomSampler>(ds.size(), 5), lo);
  loader.start_epoch(epoch);
  Tensor x, y;
  while (loader.next(x, y)) fn(x, y);
}

TEST(TensorDataset, LoaderGivesTheSameBatchesForAnyWorkerCount) {
  const data::TensorDataset ds = blobs(100, 1);
  EXPECT_EQ(ds.sample_shape(), Shape{2});
  EXPECT_EQ(ds.target_kind(), data::TargetKind::ClassIndex);
  std::vector<std::vector<float>> xs[2];
  std::vector<std::vector<int32_t>> ys[2];
  for (int w : {0, 2})
    for_each_batch(ds, 16, w, 3, [&](const Tensor& x, const Tensor& y) {
      ASSERT_EQ(x.dim(), 2);
      ASSERT_EQ(x.size(1), 2);
      xs[w > 0].emplace_back(x.f32(), x.f32() + x.numel());
      ys[w > 0].emplace_back(y.data<int32_t>(), y.data<int32_t>() + y.numel());
    });
  ASSERT_EQ(xs[0].size(), 7u);  // 100 rows in batches of 16
  EXPECT_EQ(xs[0], xs[1]);
  EXPECT_EQ(ys[0], ys[1]);
}

TEST(TensorDataset, PointsTrainTheSameOnAnyDeviceAndWorkerCount) {
  const data::TensorDataset train = blobs(600, 1), test = blobs(300, 2);
  const Result want = fit(train, test, two_layers(2, 32, 3, 4), "cpu", 0, {}, true, 4);
  EXPECT_GE(want.metrics.test_metric("acc"), 0.95);
  for (const char* devices : {"cpu", "cpu:2"})
    for (int workers : {0, 2}) {
      if (std::string(devices) == "cpu" && workers == 0) continue;
      SCOPED_TRACE(std::string(devices) + ", " + std::to_string(workers) + " workers");
      const Result got = fit(train, test, two_layers(2, 32, 3, 4), devices, workers, {}, true, 4);
      EXPECT_TRUE(testing::same_bits(got.params, want.params));
      EXPECT_EQ(got.metrics.test_metric("acc"), want.metrics.test_metric("acc"));
    }
}

TEST(TensorDataset, DenseTargetsTrainUnderMse) {
  const data::TensorDataset train = regression(512, 1), test = regression(256, 2);
  EXPECT_EQ(train.target_kind(), data::TargetKind::Dense);
  EXPECT_EQ(train.target_shape(), Shape{4});
  double zero = 0;  // the mse of predicting 0
  for (int64_t i = 0; i < test.targets().numel(); ++i) zero += std::pow(test.targets().f32()[i], 2);
  zero /= static_cast<double>(test.targets().numel());
  LossOptions mse;
  mse.criterion = CriterionKind::Mse;
  const Result r = fit(train, test, two_layers(16, 32, 4, 3), "cpu", 0, mse, true, 8);
  EXPECT_LT(r.metrics.test_loss, 0.02 * zero) << "predicting zero: " << zero;
  const Result dp = fit(train, test, two_layers(16, 32, 4, 3), "cpu:2", 2, mse, true, 8);
  EXPECT_TRUE(testing::same_bits(dp.params, r.params)) << "cpu:2 with 2 workers against cpu with none";
}

// n windows of T + 1 tokens of a fixed cycle over `v` ids (the next token is
// a function of the current one), x the first T, y the last T; every 7th
// target ignored.
data::TensorDataset cycles(int64_t n, int64_t t, int v, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const int perm[6] = {3, 0, 5, 1, 4, 2};  // next(i) = perm[i]
  Tensor x = Tensor::empty(Shape{n, t}, DType::I32), y = Tensor::empty(Shape{n, t}, DType::I32);
  for (int64_t i = 0; i < n; ++i) {
    int tok = static_cast<int>(rng() % static_cast<uint64_t>(v));
    for (int64_t j = 0; j < t; ++j) {
      x.data<int32_t>()[i * t + j] = tok;
      tok = perm[tok];
      y.data<int32_t>()[i * t + j] = (i * t + j) % 7 == 3 ? -1 : tok;
    }
  }
  return data::TensorDataset(x, y, "cycles");
}

TEST(TensorDataset, TokenIdsBatchAsInt32AndTrainAGPT) {
  const data::TensorDataset train = cycles(192, 8, 6, 1), test = cycles(32, 8, 6, 2);
  EXPECT_EQ(train.input_dtype(), DType::I32);
  EXPECT_EQ(train.target_shape(), Shape{8});
  std::vector<std::vector<int32_t>> seen[2];
  for (int w : {0, 2})
    for_each_batch(train, 20, w, 1, [&](const Tensor& x, const Tensor& y) {
      ASSERT_EQ(x.dtype(), DType::I32);
      ASSERT_EQ(y.dtype(), DType::I32);
      ASSERT_EQ(x.size(1), 8);
      ASSERT_EQ(y.shape(), x.shape());
      seen[w > 0].emplace_back(x.data<int32_t>(), x.data<int32_t>() + x.numel());
      seen[w > 0].back().insert(seen[w > 0].back().end(), y.data<int32_t>(), y.data<int32_t>() + y.numel());
    });
  ASSERT_EQ(seen[0].size(), 10u);  // 192 windows in batches of 20
  EXPECT_EQ(seen[0], seen[1]);
  auto model = [] {
    return models::gpt({.block_size = 8, .vocab_size = 6, .n_layer = 1, .n_head = 2, .n_embd = 16}, 3);
  };
  LossOptions loss;
  loss.criterion = CriterionKind::TokenCrossEntropy;
  const auto adamw = optim::OptimizerKind::AdamW;
  const Result one = fit(train, test, model(), "cpu", 0, loss, true, 30, adamw);
  EXPECT_EQ(one.metrics.test_metric("acc"), 1.0) << "the cycle is learned; test loss " << one.metrics.test_loss;
  const Result dp = fit(train, test, model(), "cpu:2", 2, loss, true, 30, adamw);
  EXPECT_TRUE(testing::same_bits(dp.params, one.params)) << "cpu:2 with 2 workers against cpu with none";
}

TEST(TensorDataset, ImagesWithoutStatisticsAreUsedAsTheyAre) {
  data::ImageDataset ds;
  ds.name = "plain";
  ds.images = Tensor::empty(Shape{3, 1, 2, 2}, DType::U8);
  for (int i = 0; i < 12; ++i) ds.images.data<uint8_t>()[i] = static_cast<uint8_t>(20 * i + 3);
  ds.labels = Tensor::zeros(Shape{3}, DType::I32);
  ds.check({});
  float out[4];
  ds.normalized(2, out);
  for (int k = 0; k < 4; ++k) EXPECT_FLOAT_EQ(out[k], (20 * (8 + k) + 3) / 255.0f);
}

TEST(TensorDataset, BadTensorsAreOneLineErrors) {
  const Tensor x = Tensor::zeros(Shape{4, 2}), labels = Tensor::zeros(Shape{4}, DType::I32);
  testing::expect_user_error([&] { data::TensorDataset(x, Tensor::zeros(Shape{3}, DType::I32), "p"); },
                             {"TensorDataset 'p' has 4 inputs but 3 targets"});
  testing::expect_user_error([&] { data::TensorDataset(Tensor::zeros(Shape{4, 2}, DType::U8), labels, "p"); },
                             {"inputs must be a (N, ...) float32 or int32 tensor"});
  testing::expect_user_error([&] { data::TensorDataset(x, Tensor::zeros(Shape{4, 2}, DType::F64), "p"); },
                             {"targets must be (N, ...) int32 class indices or float32"});
  Tensor neg = Tensor::zeros(Shape{4}, DType::I32);
  neg.data<int32_t>()[2] = -1;
  EXPECT_NO_THROW(data::TensorDataset(x, neg, "p")) << "-1: a sample the loss ignores";
  neg.data<int32_t>()[2] = -3;
  testing::expect_user_error([&] { data::TensorDataset(x, neg, "p"); },
                             {"label -3 of sample 2 is below -1 (the ignored index)"});
  Tensor below = Tensor::zeros(Shape{4, 3}, DType::I32);
  below.data<int32_t>()[7] = -2;  // per-position targets may be -1 (ignored), not less
  testing::expect_user_error([&] { data::TensorDataset(x, below, "p"); },
                             {"label -2 of sample 2 is below -1 (the ignored index)"});
  const data::TensorDataset ds(x, labels, "p");
  data::LoaderOptions lo;
  lo.augment.hflip = true;
  testing::expect_user_error(
      [&] { data::DataLoader(ds, std::make_unique<data::SequentialSampler>(4), lo); },
      {"dataset 'p' cannot be augmented"});
}

}  // namespace
}  // namespace fanout
