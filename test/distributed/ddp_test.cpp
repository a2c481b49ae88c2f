// DDP engine with ranks as threads over Gloo: gradient accumulation without
// reduction (no_sync) then one reduction equal to one big batch, parameters
// that get no gradient named, SyncBatchNorm across processes, and evaluation
// split over ranks equal to one device's, to the bit; a GPT (dropout,
// AdamW, clipping) over 2 ranks, and over 2 ranks of cpu:2, bit for bit as
// one device with split-invariant math.
#include <gtest/gtest.h>

#include <cstring>

#include <cstdlib>
#include <filesystem>

#include "models/layers/linear.h"
#include "models/layers/sequential.h"
#include "models/zoo/gpt.h"
#include "models/zoo/zoo.h"
#include "runtime/core/error.h"
#include "runtime/data/dataset.h"
#include "runtime/optim/clip.h"
#include "runtime/parallel/engine_factory.h"
#include "runtime/train/trainer.h"
#include "support/dist_util.h"
#include "support/test_util.h"
#include "support/trained.h"

namespace fanout {
namespace {

using testing::random_labels;
using testing::random_tensor;
using testing::run_ranks;
using testing::TempDir;

optim::OptimizerOptions hyper() {
  optim::OptimizerOptions h;
  h.lr = 0.05f;
  h.momentum = 0.9f;
  return h;
}

testing::EngineRun ddp_engine(Module& m, int rank, int world, const std::string& dir, const std::string& run,
                                   const std::string& devices = "cpu", const MathOptions& math = {},
                                   bool sync_bn = false) {
  EngineSpec spec;
  spec.devices = parse_devices(devices);
  spec.dp.math = math;
  spec.dp.sync_bn = sync_bn;
  spec.group = distributed::make_gloo_group({rank, world, "file:" + dir, run, 60});
  return testing::EngineRun(make_engine(m, std::move(spec)), hyper());
}

// Gradients of a model as doubles (float32 or float64 arena).
std::vector<double> grads_of(Module& m) {
  const Tensor& g = m.arenas().grads;
  std::vector<double> v(static_cast<size_t>(g.numel()));
  for (int64_t i = 0; i < g.numel(); ++i) v[i] = g.dtype() == DType::F64 ? g.f64()[i] : g.f32()[i];
  return v;
}

double max_rel(const std::vector<double>& a, const std::vector<double>& b) {
  double worst = 0, scale = 0;
  for (double x : b) scale = std::max(scale, std::abs(x));
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]) / scale);
  return worst;
}

class Accumulate : public ::testing::TestWithParam<bool> {};

// K = 4 micro-batches of 16 rows over 2 ranks (8 rows each), reduced once,
// equal one batch of 64 on one device; between reductions each rank's
// gradients are its own.
TEST_P(Accumulate, MicroBatchesEqualOneBatchAndStayLocalUntilTheLast) {
  const bool split_invariant = GetParam();
  MathOptions math;
  math.split_invariant = split_invariant;
  const Shape sample{1, 10, 10};
  std::mt19937_64 rng(5);
  Tensor x = random_tensor(Shape{64, 1, 10, 10}, rng), y = random_labels(64, 10, rng);

  auto ref_model = models::make_model("mlp", sample, 10, 3);
  testing::EngineRun ref_engine(make_engine(*ref_model, testing::engine_on("cpu", split_invariant)), hyper());
  ref_engine->forward_backward(x, y, 1.0f / 64, true);
  const auto expected = grads_of(*ref_model);

  TempDir dir;
  std::vector<std::vector<double>> first(2), final_grads(2);
  run_ranks(2, [&](int r) {
    auto m = models::make_model("mlp", sample, 10, 3);
    auto e = ddp_engine(*m, r, 2, dir.path(), "acc", "cpu", math);
    for (int k = 0; k < 4; ++k) {
      const int64_t b = k * 16 + r * 8;
      e->forward_backward(x.slice(b, b + 8), y.slice(b, b + 8), 1.0f / 64, /*sync=*/k == 3);
      if (k == 0) first[r] = grads_of(*m);
    }
    final_grads[r] = grads_of(*m);
  });
  // Before the reduction: each rank holds the gradient of its own rows only.
  EXPECT_GT(max_rel(first[0], first[1]), 1e-3);
  EXPECT_GT(max_rel(first[0], final_grads[0]), 1e-3);
  for (int r = 0; r < 2; ++r) {
    if (split_invariant) {
      EXPECT_EQ(final_grads[r], expected) << "rank " << r;
    } else {
      EXPECT_LT(max_rel(final_grads[r], expected), 1e-5) << "rank " << r;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Math, Accumulate, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "SplitInvariant" : "Default"; });

// A model with a layer the loss never reaches.
class WithUnused : public Module {
 public:
  WithUnused() {
    used_ = &register_module("used", std::make_unique<models::Linear>(4, 3));
    register_module("spare", std::make_unique<models::Linear>(4, 2));
  }
  Tensor forward(const Tensor& x, Context& ctx) override { return used_->forward(x.view(Shape{x.size(0), 4}), ctx); }
  Tensor backward(const Tensor& dy, Context& ctx) override { return used_->backward(dy, ctx); }
  std::unique_ptr<Module> make_like() const override { return std::make_unique<WithUnused>(); }
  std::string type_name() const override { return "WithUnused"; }

 private:
  models::Linear* used_;
};

TEST(Ddp, ParametersWithoutGradientAreNamed) {
  TempDir dir;
  std::vector<std::string> errors(2);
  run_ranks(2, [&](int r) {
    WithUnused m;
    m.init(1);
    auto e = ddp_engine(m, r, 2, dir.path(), "unused");
    std::mt19937_64 rng(1);
    Tensor x = random_tensor(Shape{4, 4, 1, 1}, rng), y = random_labels(4, 3, rng);
    try {
      e.train_step(x, y, 0.1f);
    } catch (const Error& err) {
      errors[r] = err.what();
    }
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(errors[r].find("spare.weight, spare.bias"), std::string::npos) << errors[r];
    EXPECT_NE(errors[r].find("no gradient"), std::string::npos) << errors[r];
  }
}

// SyncBatchNorm over 2 processes of 2 replicas each equals one device
// normalizing the whole batch: the statistics and the gradients cross both.
TEST(Ddp, SyncBatchNormAcrossProcessesAndReplicasEqualsOneDevice) {
  const Shape sample{3, 12, 12};
  std::mt19937_64 rng(9);
  Tensor x = random_tensor(Shape{16, 3, 12, 12}, rng), y = random_labels(16, 10, rng);
  auto ref_model = models::make_model("cnn", sample, 10, 4);
  testing::EngineRun ref_engine(make_engine(*ref_model, testing::engine_on("cpu", false)), hyper());
  for (int s = 0; s < 3; ++s) ref_engine.train_step(x, y, 0.05f);
  const Tensor expected = ref_model->arenas().params.to(Device::cpu());
  const Tensor expected_buffers = ref_model->arenas().buffers.to(Device::cpu());

  // The same without SyncBatchNorm (each replica normalizes its 4 rows)
  // misses the bound by far: the bound can tell synchronized from not.
  for (bool sync_bn : {true, false}) {
    SCOPED_TRACE(sync_bn ? "SyncBatchNorm" : "per-replica BatchNorm");
    TempDir dir;
    std::vector<Tensor> got(2), got_buffers(2);
    run_ranks(2, [&](int r) {
      auto m = models::make_model("cnn", sample, 10, 4);
      auto e = ddp_engine(*m, r, 2, dir.path(), "syncbn", "cpu:2", {}, sync_bn);
      for (int s = 0; s < 3; ++s) e.train_step(x.slice(r * 8, r * 8 + 8), y.slice(r * 8, r * 8 + 8), 0.05f);
      got[r] = m->arenas().params.to(Device::cpu());
      got_buffers[r] = m->arenas().buffers.to(Device::cpu());
    });
    for (int r = 0; r < 2; ++r) {
      if (sync_bn) {
        EXPECT_LT(testing::max_rel_diff(got[r], expected), 1e-4) << "rank " << r;
        EXPECT_LT(testing::max_rel_diff(got_buffers[r], expected_buffers), 1e-4) << "rank " << r;
      } else {
        EXPECT_GT(testing::max_rel_diff(got[r], expected), 1e-2) << "rank " << r;
        EXPECT_GT(testing::max_rel_diff(got_buffers[r], expected_buffers), 1e-2) << "rank " << r;
      }
    }
  }
}

// Evaluation over 3 ranks of Fashion-MNIST's 10,000 test images (not
// divisible by 3): each rank takes its shard, the sums are added across
// ranks, and the result is one device's test loss and accuracy.
// Split-invariant: to the bit. Default math: a rank's batches hold other
// images than one device's, and a GEMM's rounding (oneDNN's) depends on its
// row count, so each logit may differ in its last bits: the loss to 1e-6
// relative, the accuracy to one image in 10,000.
class DistributedEvaluation : public ::testing::TestWithParam<bool> {};
INSTANTIATE_TEST_SUITE_P(Math, DistributedEvaluation, ::testing::Values(true, false),
                         [](const auto& info) { return info.param ? "SplitInvariant" : "Default"; });

TEST_P(DistributedEvaluation, EqualsOneDevice) {
  const std::string dir_fm = data::default_fashion_mnist_dir();
  if (!std::filesystem::is_directory(dir_fm))
    GTEST_SKIP() << dir_fm << " is absent (install the Debian package dataset-fashion-mnist)";
  const data::TrainTest data = data::open_dataset("fashion-mnist", 0);
  ASSERT_EQ(data.test.size(), 10000);
  const bool exact = GetParam();
  MathOptions math;
  math.split_invariant = exact;  // each image's logits independent of its batch's size
  train::TrainerConfig tc;
  tc.batch_size = 3;
  tc.eval_batch_size = 1000;
  tc.progress = train::Progress::Mode::Off;
  tc.summary_out = nullptr;

  auto ref_model = models::make_model("lenet", data.train.sample_shape(), 10, 7);
  EngineSpec ref;
  ref.devices = parse_devices("cpu");
  ref.dp.math = math;
  testing::EngineRun ref_engine(make_engine(*ref_model, std::move(ref)), hyper());
  train::EpochMetrics expected;
  train::Trainer(tc, *ref_engine.engine, *ref_engine.opt, data).evaluate(expected);
  EXPECT_GT(expected.test_loss, 0.5);  // an untrained model: far from zero

  TempDir dir;
  std::vector<train::EpochMetrics> got(3);
  run_ranks(3, [&](int r) {
    auto m = models::make_model("lenet", data.train.sample_shape(), 10, 7);
    auto e = ddp_engine(*m, r, 3, dir.path(), "eval", "cpu", math);
    train::Trainer(tc, *e.engine, *e.opt, data).evaluate(got[r]);
  });
  for (int r = 0; r < 3; ++r) {
    if (exact) {
      EXPECT_EQ(got[r].test_loss, expected.test_loss) << "rank " << r;
      EXPECT_EQ(got[r].test_metric("acc"), expected.test_metric("acc")) << "rank " << r;
    } else {
      EXPECT_NEAR(got[r].test_loss, expected.test_loss, 1e-6 * expected.test_loss) << "rank " << r;
      EXPECT_NEAR(got[r].test_metric("acc"), expected.test_metric("acc"), 1.0 / 10000) << "rank " << r;
    }
    EXPECT_EQ(got[r].test_loss, got[0].test_loss) << "every rank holds the same sums";
  }
}

}  // namespace
}  // namespace fanout

namespace fanout {
namespace {

// Ranks that do not run the same model or options end at start-up, every
// one with one line naming the first difference (before, a different model
// met its peers in a broadcast of another size).
TEST(DdpAgreement, ADifferentModelOrBatchSizeIsOneLineOnEveryRank) {
  struct Case {
    const char* model1;
    int64_t batch1;
    const char* expect;
  };
  for (const Case& c : {Case{"mlp", 32, "rank 1 has parameter elements "},
                        Case{"lenet", 64, "rank 1 has batch size 64 where rank 0 has 32"}}) {
    SCOPED_TRACE(c.expect);
    testing::TempDir dir;
    std::vector<std::string> errors(2);
    testing::run_ranks(2, [&](int r) {
      auto m = models::make_model(r == 0 ? "lenet" : c.model1, Shape{1, 28, 28}, 10, 1);
      EngineSpec spec;
      spec.devices = parse_devices("cpu");
      spec.group = distributed::make_gloo_group({r, 2, "file:" + dir.path(), "agree", 20});
      spec.agree = {{"batch size", r == 0 ? 32 : c.batch1}};
      try {
        make_engine(*m, std::move(spec));
      } catch (const Error& e) {
        errors[r] = e.what();
      }
    });
    for (int r = 0; r < 2; ++r) {
      EXPECT_NE(errors[r].find(c.expect), std::string::npos) << "rank " << r << ": " << errors[r];
      EXPECT_NE(errors[r].find("every rank must run the same model and options"), std::string::npos) << errors[r];
      EXPECT_EQ(errors[r].find('\n'), std::string::npos);
    }
  }
}

// Rows r, r + world, ... of t: rank r's share of a batch, as DistributedSampler deals an epoch's samples.
Tensor dealt(const Tensor& t, int r, int world) {
  const int64_t n = (t.size(0) - r + world - 1) / world, row = t.nbytes() / static_cast<size_t>(t.size(0));
  Shape s = t.shape();
  s.d[0] = n;
  Tensor out = Tensor::empty(s, t.dtype());
  for (int64_t k = 0; k < n; ++k)
    std::memcpy(static_cast<char*>(out.raw()) + k * row, static_cast<const char*>(t.raw()) + (r + k * world) * row,
                static_cast<size_t>(row));
  return out;
}

// Ten AdamW steps (clipping at 1.0) of a small GPT with dropout 0.1 on
// token batches of 8 rows; rank r takes rows r, r + 2, ... of each batch, as
// dp-train's DistributedSampler deals them, and draws their dropout masks.
TEST(Ddp, GptEqualsOneDeviceBitForBit) {
  const models::GPTConfig c{.block_size = 8, .vocab_size = 13, .n_layer = 2, .n_head = 2, .n_embd = 16, .dropout = 0.1f};
  std::mt19937_64 rng(41);
  std::vector<testing::Batch> data;
  for (int s = 0; s < 10; ++s) {
    Tensor x = Tensor::empty(Shape{8, 8}, DType::I32), y = Tensor::empty(Shape{8, 8}, DType::I32);
    for (int64_t i = 0; i < 64; ++i) {
      x.data<int32_t>()[i] = static_cast<int32_t>(rng() % 13);
      y.data<int32_t>()[i] = i % 9 == 4 ? -1 : static_cast<int32_t>(rng() % 13);
    }
    data.push_back({x, y});
  }
  MathOptions math;
  math.split_invariant = true;
  auto step = [](testing::EngineRun& e, const Tensor& x, const Tensor& y, float scale) {
    e->forward_backward(x, y, scale, true);
    optim::clip_grad_norm(*e.opt, 1.0);
    e.opt->step();
    e.opt->zero_grad();
  };
  auto one = models::gpt(c, 5);
  {
    EngineSpec spec = testing::engine_on("cpu", true);
    spec.loss.criterion = CriterionKind::TokenCrossEntropy;
    testing::EngineRun e(make_engine(*one, std::move(spec)), testing::test_adamw(1e-2f));
    for (const auto& b : data) step(e, b.x, b.y, 1.0f / 8);
  }
  const Tensor want = one->arenas().params.to(Device::cpu());
  for (const char* devices : {"cpu", "cpu:2"}) {
    SCOPED_TRACE(devices);
    TempDir dir;
    std::vector<Tensor> got(2);
    run_ranks(2, [&](int r) {
      auto m = models::gpt(c, 5);
      EngineSpec spec;
      spec.devices = parse_devices(devices);
      spec.loss.criterion = CriterionKind::TokenCrossEntropy;
      spec.dp.math = math;
      spec.group = distributed::make_gloo_group({r, 2, "file:" + dir.path(), "gpt", 60});
      testing::EngineRun e(make_engine(*m, std::move(spec)), testing::test_adamw(1e-2f));
      for (const auto& b : data) step(e, dealt(b.x, r, 2), dealt(b.y, r, 2), 1.0f / 8);
      got[r] = m->arenas().params.to(Device::cpu());
    });
    for (int r = 0; r < 2; ++r) EXPECT_TRUE(testing::same_bits(got[r], want)) << "rank " << r;
  }
}

}  // namespace
}  // namespace fanout
