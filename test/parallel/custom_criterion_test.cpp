// A criterion the library does not ship (class-weighted cross-entropy,
// written as a user would against runtime/nn/criterion.h) trains through
// DataParallelEngine and the Trainer with AdamW and clipping, checkpoints and
// resumes bit for bit; with every weight 1 it is the built-in criterion.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "models/zoo/zoo.h"
#include "runtime/core/error.h"
#include "runtime/parallel/data_parallel.h"
#include "runtime/train/checkpoint.h"
#include "runtime/train/trainer.h"
#include "support/dist_util.h"
#include "support/test_util.h"

namespace fanout {
namespace {

// torch.nn.CrossEntropyLoss(weight=w, reduction="sum") row by row, on CPU
// devices: row i's loss is -w[y_i] * log softmax(out_i)[y_i], computed in
// double and rounded to float; the gradient is grad_scale * w[y_i] * (p - onehot).
class WeightedCrossEntropy final : public Criterion {
 public:
  explicit WeightedCrossEntropy(std::vector<double> w, std::vector<MetricSpec> metrics = {accuracy_metric()})
      : w_(std::move(w)), metrics_(std::move(metrics)) {}
  const std::string& name() const override { return name_; }
  bool dense_targets() const override { return false; }
  void forward(Context& ctx, const Tensor& out, const Tensor& target, bool train, float grad_scale) override {
    FANOUT_USER_CHECK(out.device().is_cpu() && out.dim() == 2 && out.size(1) == static_cast<int64_t>(w_.size()))
        << "weighted cross-entropy takes (N, " << w_.size() << ") outputs on a CPU device";
    const int64_t n = out.size(0), c = out.size(1);
    ensure(rows_, Shape{n}, Device::cpu());
    if (train) ensure(grad_, out.shape(), Device::cpu());
    correct_ = 0;
    for (int64_t i = 0; i < n; ++i) {
      const float* o = out.f32() + i * c;
      const int y = target.data<int32_t>()[i];
      double mx = o[0];
      int arg = 0;
      for (int64_t j = 1; j < c; ++j)
        if (o[j] > mx) mx = o[j], arg = static_cast<int>(j);
      double z = 0;
      for (int64_t j = 0; j < c; ++j) z += std::exp(o[j] - mx);
      rows_.f32()[i] = static_cast<float>(-w_[y] * (o[y] - mx - std::log(z)));
      correct_ += arg == y;
      if (train)
        for (int64_t j = 0; j < c; ++j)
          grad_.f32()[i * c + j] =
              static_cast<float>(grad_scale * w_[y] * (std::exp(o[j] - mx) / z - (j == y ? 1.0 : 0.0)));
    }
  }
  const Tensor& grad() const override { return grad_; }
  StepResult read(Context&) override {
    StepResult r = StepResult::of_rows(rows_.f32(), rows_.numel());
    r.sums[kCorrectSum].add(static_cast<float>(correct_));
    return r;
  }
  int64_t result_bytes(const Shape& out) const override { return out[0] * 4 + 8; }
  std::unique_ptr<Criterion> clone() const override { return std::make_unique<WeightedCrossEntropy>(w_, metrics_); }
  std::vector<MetricSpec> metrics() const override { return metrics_; }
  std::vector<std::string> sum_names() const override { return {"correct"}; }

 private:
  const std::string name_ = "weighted_cross_entropy";
  std::vector<double> w_;
  std::vector<MetricSpec> metrics_;
  Tensor rows_, grad_;
  int64_t correct_ = 0;
};

FILE* devnull() {
  static FILE* f = std::fopen("/dev/null", "w");
  return f;
}

struct UserRun {
  std::unique_ptr<Module> model;
  std::unique_ptr<DataParallelEngine> engine;
  std::unique_ptr<optim::Optimizer> opt;
  std::unique_ptr<train::Trainer> trainer;
};

UserRun make_user_run(const data::TrainTest& data, const Criterion& loss, uint64_t init_seed) {
  UserRun r;
  r.model = models::make_model("lenet", data.train.sample_shape(), 10, init_seed);
  DataParallelOptions dpo;
  dpo.seed = 3;
  r.engine = std::make_unique<DataParallelEngine>(*r.model, parse_devices("cpu:2"), loss, dpo);
  optim::OptimizerOptions o;
  o.kind = optim::OptimizerKind::AdamW;
  o.lr = 2e-3f;
  o.weight_decay = 0.01f;
  o.no_decay_norm_bias = true;
  r.opt = optim::make_optimizer(r.engine->model(), r.engine->primary_context(), o);
  train::TrainerConfig tc;
  tc.epochs = 3;
  tc.batch_size = 32;
  tc.seed = 3;
  tc.schedule = optim::parse_lr_schedule("cosine", 2e-3f, 3, 0);
  tc.clip_grad_norm = 1.0;
  tc.progress = train::Progress::Mode::Off;
  tc.summary_out = devnull();
  r.trainer = std::make_unique<train::Trainer>(tc, *r.engine, *r.opt, data);
  return r;
}

TEST(CustomCriterion, TrainsThroughDataParallelAndTheTrainerAndResumes) {
  const auto data = data::make_synthetic(256, 4);
  std::vector<double> w(10);
  for (int i = 0; i < 10; ++i) w[i] = 0.5 + 0.1 * i;
  const WeightedCrossEntropy loss(w);

  UserRun whole = make_user_run(data, loss, 1);
  std::vector<train::EpochMetrics> epochs;
  whole.trainer->on_epoch_end = [&](const train::EpochMetrics& m) { epochs.push_back(m); };
  whole.trainer->run();
  EXPECT_EQ(whole.engine->criterion().name(), "weighted_cross_entropy");
  ASSERT_EQ(epochs.size(), 3u);
  EXPECT_TRUE(epochs[0].grad_norms);
  EXPECT_GT(epochs[0].grad_norm_max, 0.0);
  EXPECT_LT(epochs[2].train_loss, 0.5 * epochs[0].train_loss);
  EXPECT_GT(epochs[2].test_metric("acc"), 0.5);
  // Its metric, by the name it gave, in the metrics file and the summary line.
  const nlohmann::json j = train::metrics_json(epochs[2]);
  EXPECT_EQ(j["test_acc"].get<double>(), epochs[2].test_metric("acc"));
  EXPECT_EQ(j["train_acc"].get<double>(), epochs[2].train_metric("acc"));
  EXPECT_FALSE(j.contains("test_loc_error"));
  char acc[32];
  std::snprintf(acc, sizeof acc, " acc %.4f", epochs[2].test_metric("acc"));
  EXPECT_NE(train::summary_line(epochs[2], 3).find(acc), std::string::npos) << train::summary_line(epochs[2], 3);

  // Two epochs, a checkpoint, a fresh engine from other weights, the third epoch.
  testing::TempDir dir;
  const std::string path = dir.path() + "/user.safetensors";
  UserRun a = make_user_run(data, loss, 1);
  a.trainer->run(0, 2);
  train::CheckpointState st;
  st.epoch = 2;
  train::save_checkpoint(path, *a.engine, a.opt.get(), st);
  UserRun b = make_user_run(data, loss, 9);
  EXPECT_EQ(train::load_checkpoint(path, *b.engine, *b.opt).epoch, 2);
  b.trainer->run(2);
  EXPECT_TRUE(testing::same_bits(b.model->arenas().params, whole.model->arenas().params));
  EXPECT_EQ(b.opt->steps(), whole.opt->steps());
}

TEST(CustomCriterion, UnitWeightsAreTheBuiltInCrossEntropy) {
  const auto data = data::make_synthetic(64, 5);
  auto run = [&](const Criterion& loss) {
    UserRun r = make_user_run(data, loss, 2);
    return r.trainer->train_epoch(0).train_loss;
  };
  const double mine = run(WeightedCrossEntropy(std::vector<double>(10, 1.0)));
  const double builtin = run(*make_criterion({}));
  EXPECT_NEAR(mine, builtin, 1e-5 * builtin);
}

// The Trainer reports a criterion's metrics by the names and formats the
// criterion gives, and knows none of them itself.
TEST(CustomCriterion, NamesItsOwnMetrics) {
  const auto data = data::make_synthetic(96, 6);
  const std::vector<double> w(10, 1.0);
  MetricSpec right{"right_pct", "right %.1f%%", "right %.2f%%", kCorrectSum, MetricSpec::kRows, 100};
  UserRun r = make_user_run(data, WeightedCrossEntropy(w, {right}), 2);
  std::vector<train::EpochMetrics> epochs;
  r.trainer->on_epoch_end = [&](const train::EpochMetrics& m) { epochs.push_back(m); };
  r.trainer->run(0, 1);
  ASSERT_EQ(epochs.size(), 1u);
  const train::EpochMetrics& m = epochs[0];
  const double share = m.test_metric("right_pct");
  EXPECT_GE(share, 0.0);
  EXPECT_LE(share, 1.0);
  EXPECT_EQ(m.test_metric("acc"), 0.0);  // not this criterion's
  const nlohmann::json j = train::metrics_json(m);
  EXPECT_EQ(j["test_right_pct"].get<double>(), share);
  EXPECT_TRUE(j.contains("train_right_pct"));
  EXPECT_FALSE(j.contains("test_acc"));
  char want[64];
  std::snprintf(want, sizeof want, " right %.1f%%", 100 * share);
  EXPECT_NE(train::summary_line(m, 3).find(want), std::string::npos) << train::summary_line(m, 3);
  std::snprintf(want, sizeof want, "final test right %.2f%%", 100 * share);
  EXPECT_EQ(train::final_line(m), want);
}

TEST(CustomCriterion, MalformedMetricIsAOneLineError) {
  const auto data = data::make_synthetic(64, 7);
  const std::vector<double> w(10, 1.0);
  const MetricSpec bad_format{"x", "x %s", "x %f", kCorrectSum, MetricSpec::kRows, 1};
  const MetricSpec bad_sum{"y", "y %f", "y %f", kMetricSums, MetricSpec::kRows, 1};
  for (const MetricSpec& spec : {bad_format, bad_sum}) {
    UserRun r = make_user_run(data, WeightedCrossEntropy(w, {spec}), 2);
    testing::expect_user_error([&] { r.trainer->train_epoch(0); },
                               {"criterion weighted_cross_entropy: metric '" + spec.key + "'", "floating-point"});
  }
}

}  // namespace
}  // namespace fanout
