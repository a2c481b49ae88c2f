// Trainer timing and memory fields: the timing warm-up changes what is
// timed, never what is trained; the data wait is the loader's share of the
// epoch; the epoch reports peak memory. Timing is checked against injected
// delays (sleeps), by relations that hold whatever the machine's load: never
// against a wall-clock threshold.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <cmath>
#include <numeric>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <thread>
#include <tuple>

#include <unistd.h>

#include "models/zoo/zoo.h"
#include "runtime/parallel/single_device.h"
#include "runtime/train/run_config.h"
#include "runtime/train/trainer.h"
#include "support/dist_util.h"
#include "support/test_util.h"
#include "support/trained.h"

namespace fanout {
namespace {

struct TrainedRun {
  std::unique_ptr<Module> model;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<optim::Optimizer> opt;
  train::EpochMetrics last;
};

using OnStep = std::function<void(const train::StepInfo&)>;

TrainedRun train_two_epochs(const data::Dataset& train, const data::Dataset& test, int timing_warmup,
                            int64_t eval_batch = 1000, const OnStep& on_step = {}) {
  TrainedRun r;
  r.model = models::make_model("mlp", train.sample_shape(), 10, 3);
  r.engine = std::make_unique<SingleDeviceEngine>(*r.model, Device::cpu(), *make_criterion({}), 3);
  r.opt = optim::make_optimizer(r.engine->model(), r.engine->primary_context(), testing::test_sgd());
  train::TrainerConfig tc;
  tc.epochs = 2;
  tc.batch_size = 16;  // 128 samples: 8 steps an epoch
  tc.seed = 3;
  tc.timing_warmup = timing_warmup;
  tc.eval_batch_size = eval_batch;
  tc.schedule = optim::parse_lr_schedule("constant", 0.05f, 2, 0);
  tc.progress = train::Progress::Mode::Off;
  tc.summary_out = nullptr;
  train::Trainer t(tc, *r.engine, *r.opt, train, test);
  t.on_step = on_step;
  r.last = t.run();
  return r;
}

TrainedRun train_two_epochs(const data::TrainTest& data, int timing_warmup, int64_t eval_batch = 1000,
                            const OnStep& on_step = {}) {
  return train_two_epochs(data.train, data.test, timing_warmup, eval_batch, on_step);
}

void expect_same_training(const TrainedRun& a, const TrainedRun& b, const char* what) {
  const Tensor &pa = a.model->arenas().params, &pb = b.model->arenas().params;
  ASSERT_EQ(pa.nbytes(), pb.nbytes());
  EXPECT_EQ(std::memcmp(pa.raw(), pb.raw(), pa.nbytes()), 0) << what << " changed training";
  EXPECT_EQ(a.last.test_metric("acc"), b.last.test_metric("acc")) << what;
}

// A slow step: batch `batch` (1-based) of the last epoch sleeps kDelay in
// on_step, after its optimizer step and inside the epoch's time. The other
// steps of these runs (an mlp on 16 rows) take milliseconds (tens on a busy
// machine).
constexpr double kDelay = 1.0;
OnStep slow_step(int64_t batch) {
  return [batch](const train::StepInfo& s) {
    if (s.epoch == 1 && s.batch == batch) std::this_thread::sleep_for(std::chrono::duration<double>(kDelay));
  };
}

// 128 samples in batches of 16: 8 steps an epoch. The steady time is the
// time after the warm-up's steps, scaled to all 8: its window (steady time
// x (8 - warm-up) / 8) excludes a slow step inside the warm-up and holds one
// after it: those bounds follow from the sleep alone, whatever the load. The
// comparisons of one time with another fail only if the fast steps of one
// part of an epoch ran slower than the rest by most of the delay.
TEST(Trainer, TimingWarmupTimesLessAndTrainsTheSame) {
  const auto data = data::make_synthetic(128, 4);
  const TrainedRun plain = train_two_epochs(data, 0, 1000, slow_step(1)),
                   warm = train_two_epochs(data, 3, 1000, slow_step(1)),
                   all = train_two_epochs(data, 100, 1000, slow_step(1)),
                   late = train_two_epochs(data, 3, 1000, slow_step(5));
  for (const TrainedRun* r : {&warm, &all, &late}) {
    expect_same_training(plain, *r, "the timing warm-up");
    EXPECT_GT(r->last.steady_epoch_seconds, 0);
    EXPECT_GT(r->last.images_per_second, 0);
    EXPECT_GE(r->last.data_wait_fraction, 0);
    EXPECT_LE(r->last.data_wait_fraction, 1);
    EXPECT_GE(r->last.epoch_seconds, kDelay) << "the epoch's time holds the slow step";
  }
  // Without a warm-up the steady time is the epoch's time, slow step included.
  EXPECT_EQ(plain.last.steady_epoch_seconds, plain.last.epoch_seconds);
  EXPECT_GE(plain.last.steady_epoch_seconds, kDelay);
  // A warm-up of 3 with the slow first step: the window of the last 5 steps
  // leaves the delay out, so the steady time is below the epoch's by about
  // the delay (half of it allows for scaling 5 fast steps to 8).
  const double eps = 1e-9;
  EXPECT_LE(warm.last.steady_epoch_seconds * 5 / 8, warm.last.epoch_seconds - kDelay + eps)
      << "the steady time holds the warm-up's slow step";
  EXPECT_LT(warm.last.steady_epoch_seconds, warm.last.epoch_seconds - kDelay / 2)
      << "steady " << warm.last.steady_epoch_seconds << " s, epoch " << warm.last.epoch_seconds << " s";
  // A warm-up of every step but one: the last step alone, scaled by 8.
  EXPECT_LE(all.last.steady_epoch_seconds / 8, all.last.epoch_seconds - kDelay + eps);
  // The same slow step after the warm-up (step 5) is in the steady time.
  EXPECT_GE(late.last.steady_epoch_seconds * 5 / 8, kDelay - eps) << "the steady time lost a step after the warm-up";
  EXPECT_GT(late.last.steady_epoch_seconds, warm.last.steady_epoch_seconds);
}

// A dataset whose every sample takes `sleep_s` to read (a slow disk).
class SlowDataset : public data::Dataset {
 public:
  SlowDataset(const data::Dataset& d, double sleep_s) : d_(d), sleep_s_(sleep_s) { name = d.name; }
  int64_t size() const override { return d_.size(); }
  Shape sample_shape() const override { return d_.sample_shape(); }
  data::TargetKind target_kind() const override { return d_.target_kind(); }
  Shape target_shape() const override { return d_.target_shape(); }
  void get(int64_t i, const data::SampleDraw& draw, void* x, void* y) const override {
    std::this_thread::sleep_for(std::chrono::duration<double>(sleep_s_));
    d_.get(i, draw, x, y);
  }
  void check(const data::Augment& augment) const override { d_.check(augment); }

 private:
  const data::Dataset& d_;
  double sleep_s_;
};

// The data wait is the share of the (steady) epoch spent waiting for the
// loader. Without loader workers the batches are built on the training
// thread, inside the wait: with a slow dataset the wait (share x the epoch's
// time) holds at least every sample's sleep, and the share is larger than
// with the same data read at once. The slow reads change nothing trained.
TEST(Trainer, DataWaitIsTheLoadersShareOfTheEpoch) {
  const auto data = data::make_synthetic(128, 4);
  constexpr double kSampleSleep = 0.004;  // 128 samples: 0.5 s an epoch
  const SlowDataset slow_train(data.train, kSampleSleep);
  const TrainedRun fast = train_two_epochs(data, 0), slow = train_two_epochs(slow_train, data.test, 0);
  expect_same_training(fast, slow, "a slow dataset");
  EXPECT_GE(slow.last.data_wait_fraction * slow.last.epoch_seconds, 128 * kSampleSleep * (1 - 1e-9))
      << "data wait " << slow.last.data_wait_fraction << " of " << slow.last.epoch_seconds << " s";
  EXPECT_LE(slow.last.data_wait_fraction, 1);
  EXPECT_GE(fast.last.data_wait_fraction, 0);
  EXPECT_GT(slow.last.data_wait_fraction, fast.last.data_wait_fraction);
}

// Forwards to an engine and records the most rows one eval_step was given.
class RowsSeen : public Engine {
 public:
  explicit RowsSeen(Engine& e) : e_(e) {}
  StepResult forward_backward(const Tensor& x, const Tensor& y, float scale, bool sync) override {
    return e_.forward_backward(x, y, scale, sync);
  }
  StepResult eval_step(const Tensor& x, const Tensor& y) override {
    max_eval_rows = std::max(max_eval_rows, x.size(0));
    return e_.eval_step(x, y);
  }
  Module& model() override { return e_.model(); }
  Context& primary_context() override { return e_.primary_context(); }
  std::vector<Device> devices() const override { return e_.devices(); }
  const Criterion& criterion() const override { return e_.criterion(); }
  int64_t max_eval_rows = 0;

 private:
  Engine& e_;
};

// Evaluation runs the model on at most the training batch at a time, so it
// needs no buffer beyond training's; the metrics do not depend on the eval
// batch (rows are independent in eval mode and the loss sums exact).
TEST(Trainer, EvaluationSeesAtMostTheTrainingBatch) {
  const auto data = data::make_synthetic(640, 4);  // 128 test rows
  const TrainedRun small = train_two_epochs(data, 0, 16), whole = train_two_epochs(data, 0, 1000);
  EXPECT_EQ(small.last.test_loss, whole.last.test_loss);
  EXPECT_EQ(small.last.test_metric("acc"), whole.last.test_metric("acc"));
  RowsSeen seen(*whole.engine);
  train::TrainerConfig tc;
  tc.batch_size = 16;
  tc.eval_batch_size = 1000;
  tc.schedule = optim::parse_lr_schedule("constant", 0.05f, 1, 0);
  tc.progress = train::Progress::Mode::Off;
  tc.summary_out = nullptr;
  train::Trainer t(tc, seen, *whole.opt, data);
  train::EpochMetrics m;
  t.evaluate(m);
  EXPECT_EQ(seen.max_eval_rows, 16);
  EXPECT_EQ(m.test_loss, whole.last.test_loss);
  EXPECT_EQ(m.test_metric("acc"), whole.last.test_metric("acc"));
}

// The learning rate has one source, the optimizer's: a Trainer whose
// schedule was left at its defaults trains at the optimizer's rate.
TEST(Trainer, TrainsAtTheOptimizersLearningRate) {
  const auto data = data::make_synthetic(64, 4);
  auto model = models::make_model("mlp", data.train.sample_shape(), 10, 3);
  SingleDeviceEngine engine(*model, Device::cpu(), *make_criterion({}), 3);
  optim::OptimizerOptions o = testing::test_sgd();
  o.lr = 0.02f;
  auto opt = optim::make_optimizer(engine.model(), engine.primary_context(), o);
  train::TrainerConfig tc;  // schedule: constant, base_lr left at its default
  tc.batch_size = 16;
  tc.progress = train::Progress::Mode::Off;
  tc.summary_out = nullptr;
  train::Trainer t(tc, engine, *opt, data);
  EXPECT_EQ(t.train_epoch(0).lr, 0.02f);
  EXPECT_EQ(opt->lr(), 0.02f);
  EXPECT_EQ(opt->steps(), 4);
}

TEST(Trainer, EpochReportsPeakMemory) {
  const auto data = data::make_synthetic(128, 4);
  const TrainedRun r = train_two_epochs(data, 0);
  EXPECT_GT(r.last.peak_host_bytes, 0);
  EXPECT_TRUE(r.last.peak_device_bytes.empty());  // CPU devices: host memory only
  const nlohmann::json j = train::metrics_json(r.last);
  for (const char* k : {"steady_epoch_seconds", "peak_host_bytes", "peak_device_bytes", "epoch_seconds", "test_acc"})
    EXPECT_TRUE(j.contains(k)) << k;
  EXPECT_NE(train::memory_summary(r.last).find("GiB host"), std::string::npos);
}

}  // namespace
}  // namespace fanout

namespace fanout {
namespace {

// on_step: once per optimizer step, in order, with the step's rows and
// their mean loss (the epoch's loss is their row-weighted mean), the
// schedule's rate and the norm before clipping.
TEST(Trainer, OnStepReportsEveryOptimizerStep) {
  const auto data = data::make_synthetic(120, 4);  // 120 rows in batches of 16: 8 batches, the last of 8 rows
  auto model = models::make_model("mlp", data.train.sample_shape(), 10, 3);
  SingleDeviceEngine engine(*model, Device::cpu(), *make_criterion({}), 3);
  auto opt = optim::make_optimizer(engine.model(), engine.primary_context(), testing::test_sgd());
  train::TrainerConfig tc;
  tc.epochs = 2;
  tc.batch_size = 16;
  tc.accumulate = 3;  // steps of batches 1-3, 4-6, 7-8
  tc.seed = 3;
  tc.clip_grad_norm = 1e-3;  // clips every step
  tc.schedule = optim::parse_lr_schedule("step:1:0.5", 0.05f, 2, 0);
  tc.progress = train::Progress::Mode::Off;
  tc.summary_out = nullptr;
  train::Trainer t(tc, engine, *opt, data);
  std::vector<train::StepInfo> seen;
  t.on_step = [&](const train::StepInfo& s) { seen.push_back(s); };
  std::vector<train::EpochMetrics> epochs;
  t.on_epoch_end = [&](const train::EpochMetrics& m) { epochs.push_back(m); };
  t.run();
  ASSERT_EQ(seen.size(), 6u);
  EXPECT_EQ(train::optimizer_steps_per_epoch(tc, 1, 0, data.train), 3);
  // Rank shares as torch's DistributedSampler pads or drops them: 120 rows on 7 ranks, 2 a batch.
  train::TrainerConfig ranks = tc;
  ranks.batch_size = 14;
  ranks.accumulate = 1;
  EXPECT_EQ(train::optimizer_steps_per_epoch(ranks, 7, 3, data.train), 9);  // ceil(120 / 7) = 18 rows
  ranks.drop_last = true;
  EXPECT_EQ(train::optimizer_steps_per_epoch(ranks, 7, 3, data.train), 8);  // floor: 17 rows, 8 full batches (the odd row dropped)
  const int64_t batches[] = {3, 6, 8}, rows[] = {48, 48, 24};
  for (size_t i = 0; i < seen.size(); ++i) {
    const train::StepInfo& s = seen[i];
    SCOPED_TRACE("step " + std::to_string(i + 1));
    EXPECT_EQ(s.epoch, static_cast<int>(i / 3));
    EXPECT_EQ(s.batch, batches[i % 3]);
    EXPECT_EQ(s.rows, rows[i % 3]);
    EXPECT_EQ(s.step, static_cast<int64_t>(i + 1));
    EXPECT_FLOAT_EQ(s.lr, i < 3 ? 0.05f : 0.025f);
    EXPECT_GT(s.grad_norm, 1e-3);
    EXPECT_TRUE(s.stepped);
    EXPECT_GT(s.loss, 0);
  }
  ASSERT_EQ(epochs.size(), 2u);
  for (int e = 0; e < 2; ++e) {
    double sum = 0;
    for (int i = 0; i < 3; ++i) sum += seen[3 * e + i].loss * seen[3 * e + i].rows;
    EXPECT_NEAR(sum / 120, epochs[e].train_loss, 1e-12 * epochs[e].train_loss);
  }
}

// --eval-every: an evaluation after every N optimizer steps, across epochs,
// on the validation rows floor(i n / R) (R = eval_batches x batch_size), its
// training loss the rows' mean since the previous evaluation (or the epoch's
// start); training is unchanged by it. References: the val loss as a double
// sum of one-row evaluations of those rows, the train loss from on_step.
TEST(Trainer, EvalEveryEvaluatesEvenlySpacedRowsWithoutChangingTraining) {
  const auto data = data::make_synthetic(640, 4);  // 128 test rows
  const TrainedRun plain = train_two_epochs(data, 0);
  for (const int64_t batches : {int64_t{2}, int64_t{0}}) {
    SCOPED_TRACE("eval_batches " + std::to_string(batches));
    TrainedRun r;
    r.model = models::make_model("mlp", data.train.sample_shape(), 10, 3);
    r.engine = std::make_unique<SingleDeviceEngine>(*r.model, Device::cpu(), *make_criterion({}), 3);
    r.opt = optim::make_optimizer(r.engine->model(), r.engine->primary_context(), testing::test_sgd());
    train::TrainerConfig tc;
    tc.epochs = 2;
    tc.batch_size = 16;  // 640 training rows: 40 steps an epoch
    tc.seed = 3;
    tc.schedule = optim::parse_lr_schedule("constant", 0.05f, 2, 0);
    tc.progress = train::Progress::Mode::Off;
    tc.summary_out = nullptr;
    tc.eval_every = 15;
    tc.eval_batches = batches;
    const std::string metrics_path = (std::filesystem::temp_directory_path() /
                                      ("fanout_eval_metrics_" + std::to_string(::getpid()) + ".jsonl"))
                                         .string();
    std::filesystem::remove(metrics_path);
    tc.metrics_path = metrics_path;
    train::Trainer t(tc, *r.engine, *r.opt, data);
    double since_sum = 0;
    int64_t since_rows = 0;
    int last_epoch = 0;
    t.on_step = [&](const train::StepInfo& s) {
      if (s.epoch != last_epoch) since_sum = 0, since_rows = 0, last_epoch = s.epoch;
      since_sum += s.loss * static_cast<double>(s.rows);
      since_rows += s.rows;
    };
    std::vector<train::EvalMetrics> evals;
    const int64_t n = data.test.size(), rows = batches > 0 ? batches * 16 : n;
    const Shape sample = data.test.sample_shape();
    Shape one;  // (1, sample...)
    one.ndim = sample.ndim + 1;
    one.d[0] = 1;
    for (int i = 0; i < sample.ndim; ++i) one.d[i + 1] = sample[i];
    Tensor x = Tensor::empty(one), y = Tensor::empty(Shape{1}, DType::I32);
    t.on_eval = [&](const train::EvalMetrics& e) {
      evals.push_back(e);
      double ref = 0;
      for (int64_t i = 0; i < rows; ++i) {
        data.test.get(i * n / rows, data::SampleDraw{}, x.raw(), y.raw());
        ref += r.engine->eval_step(x, y).loss_sum;
      }
      EXPECT_EQ(e.val_rows, rows);
      EXPECT_NEAR(e.val_loss, ref / static_cast<double>(rows), 1e-5 * std::abs(ref / rows)) << "step " << e.step;  // batches round differently from one row
      EXPECT_NEAR(e.train_loss, since_sum / static_cast<double>(since_rows), 1e-6 * e.train_loss) << "step " << e.step;
      EXPECT_GT(e.rows_per_second, 0);
      EXPECT_GT(e.elapsed_seconds, 0);
      EXPECT_EQ(e.lr, 0.05f);
      since_sum = 0, since_rows = 0;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));  // evaluation time the speeds leave out
    };
    r.last = t.run();
    ASSERT_EQ(evals.size(), 5u);  // steps 15, 30 | 45, 60, 75 of 80
    // Epoch 2 held three evaluations of at least 0.2 s each: its steady time (and so its speed) leaves them out.
    EXPECT_LE(r.last.steady_epoch_seconds, r.last.epoch_seconds - 0.6)
        << "steady " << r.last.steady_epoch_seconds << " s, epoch " << r.last.epoch_seconds << " s";
    for (size_t k = 0; k < evals.size(); ++k) {
      EXPECT_EQ(evals[k].step, static_cast<int64_t>(15 * (k + 1)));
      EXPECT_EQ(evals[k].epoch, k < 2 ? 1 : 2);
    }
    EXPECT_GT(evals.front().val_loss, evals.back().val_loss) << "the model learns";
    expect_same_training(plain, r, "evaluation inside epochs");
    EXPECT_EQ(r.last.test_loss, plain.last.test_loss);
    // The metrics file: five evaluation lines and two epoch lines, in order.
    std::ifstream in(metrics_path);
    std::vector<nlohmann::json> lines;
    for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
    ASSERT_EQ(lines.size(), 7u);
    for (size_t k : {0, 1, 3, 4, 5}) {
      EXPECT_TRUE(lines[k].value("eval", false));
      EXPECT_DOUBLE_EQ(lines[k]["val_loss"].get<double>(), evals[k < 2 ? k : k - 1].val_loss);
      EXPECT_EQ(lines[k]["val_rows"].get<int64_t>(), rows);
    }
    EXPECT_FALSE(lines[2].contains("eval"));
    EXPECT_EQ(lines[2]["epoch"], 1);
    EXPECT_EQ(lines[6]["epoch"], 2);
    // A resume at step 30 of epoch 1 (steps 1-40) keeps the evaluations up to step 30 and no epoch line.
    EXPECT_EQ(train::drop_metrics_after(metrics_path, 0, 30), 5);
    std::ifstream kept(metrics_path);
    std::vector<int64_t> steps;
    for (std::string line; std::getline(kept, line);) steps.push_back(nlohmann::json::parse(line)["step"].get<int64_t>());
    EXPECT_EQ(steps, (std::vector<int64_t>{15, 30}));
    std::filesystem::remove(metrics_path);
  }
}

// A stop that comes in an evaluation inside the epoch (--eval-every) drops
// it and stops the run after that step, at its position, with should_stop
// unset (the evaluation's poll alone decides). The position carries the
// dropped evaluation: the resumed run runs it first and reports what the
// run that was never stopped reports, evaluation for evaluation. Stops at
// step 10 (inside epoch 1), at step 40 (epoch 1's last batch: the position
// is the epoch after it, evaluated after the dropped one) and at step 50
// with --max-steps 50 (the run's last step).
TEST(Trainer, AStopInAnEvaluationInsideTheEpochIsRunFirstOnResume) {
  const auto data = data::make_synthetic(640, 4);  // 128 test rows
  struct Run {
    std::unique_ptr<Module> model;
    std::unique_ptr<SingleDeviceEngine> engine;
    std::unique_ptr<optim::Optimizer> opt;
    train::TrainerConfig tc;
    std::vector<std::tuple<int64_t, double, double, float>> evals;  // step, val loss, train loss, lr
    std::vector<int> epochs;                                        // epochs ended
    explicit Run(const data::TrainTest& data, int64_t max_steps) {
      model = models::make_model("mlp", data.train.sample_shape(), 10, 3);
      engine = std::make_unique<SingleDeviceEngine>(*model, Device::cpu(), *make_criterion({}), 3);
      optim::OptimizerOptions o = testing::test_sgd();
      o.lr = 0.01f;  // the schedule's peak (the trainer scales the optimizer's rate)
      opt = optim::make_optimizer(engine->model(), engine->primary_context(), o);
      tc.epochs = 2;
      tc.batch_size = 16;  // 40 steps an epoch
      tc.eval_batch_size = 16;
      tc.schedule = optim::parse_lr_schedule("warmup-cosine", o.lr, 2, 0);  // a rate per step
      optim::set_warmup_cosine(tc.schedule, 10, 80, 0.001f);
      tc.progress = train::Progress::Mode::Off;
      tc.summary_out = nullptr;
      tc.eval_every = 5;
      tc.max_steps = max_steps;
    }
    std::unique_ptr<train::Trainer> trainer(const data::TrainTest& data) {
      auto t = std::make_unique<train::Trainer>(tc, *engine, *opt, data);
      t->on_eval = [this](const train::EvalMetrics& e) { evals.emplace_back(e.step, e.val_loss, e.train_loss, e.lr); };
      t->on_epoch_end = [this](const train::EpochMetrics& m) { epochs.push_back(m.epoch); };
      return t;
    }
  };
  for (int64_t stop_at : {10, 40, 50}) {
    SCOPED_TRACE("stopped in step " + std::to_string(stop_at) + "'s evaluation");
    const int64_t max_steps = stop_at == 50 ? 50 : 0;
    Run whole(data, max_steps);
    whole.trainer(data)->run();
    ASSERT_EQ(whole.evals.size(), stop_at == 50 ? 10u : 16u);

    Run cut(data, max_steps);
    auto t = cut.trainer(data);
    t->should_stop_evaluating = [&] { return cut.opt->steps() >= stop_at; };
    std::vector<std::pair<int64_t, bool>> positions;
    t->on_mid_epoch = [&](int, const train::EpochPosition& pos, bool stopping) { positions.emplace_back(pos.batch, stopping); };
    t->run();
    ASSERT_TRUE(t->stopped());
    EXPECT_EQ(cut.opt->steps(), stop_at);
    const int64_t batch = stop_at % 40 == 0 ? 40 : stop_at % 40;  // step 40: the epoch after its last batch
    EXPECT_EQ(positions, (std::vector<std::pair<int64_t, bool>>{{batch, true}}));
    const train::EpochPosition at = t->stopped_at();
    EXPECT_EQ(at.batch, batch);
    EXPECT_EQ(train::epoch_done(at.totals), stop_at == 40);
    ASSERT_TRUE(at.totals.contains(train::kEvalPending));
    EXPECT_EQ(cut.evals.size(), static_cast<size_t>(stop_at / 5 - 1)) << "step " << stop_at << "'s evaluation was dropped";
    EXPECT_EQ(cut.epochs, (std::vector<int>(stop_at > 40 ? 1 : 0, 1)));

    // A second stop in the resumed evaluation keeps it pending at the same place, re-batched too
    // (--allow-batch-change: the position stays the checkpoint's, not batch 0 of the new size).
    if (stop_at == 10) {
      train::TrainerConfig other = cut.tc;
      other.batch_size = 32;
      train::Trainer rebatched(other, *cut.engine, *cut.opt, data);
      rebatched.should_stop_evaluating = [] { return true; };
      rebatched.run(t->stopped_epoch(), -1, at);
      ASSERT_TRUE(rebatched.stopped());
      EXPECT_EQ(rebatched.stopped_at().batch, at.batch);
      EXPECT_EQ(rebatched.stopped_at().totals, at.totals);
    }
    auto again = cut.trainer(data);
    again->should_stop_evaluating = [] { return true; };
    again->run(t->stopped_epoch(), -1, at);
    ASSERT_TRUE(again->stopped());
    EXPECT_EQ(again->stopped_at().batch, batch);
    EXPECT_TRUE(again->stopped_at().totals.contains(train::kEvalPending));
    EXPECT_EQ(cut.opt->steps(), stop_at);

    auto rest = cut.trainer(data);
    rest->run(t->stopped_epoch(), -1, again->stopped_at());
    EXPECT_FALSE(rest->stopped());
    EXPECT_EQ(cut.evals, whole.evals) << "the same evaluations, the dropped one included, in order";
    EXPECT_EQ(cut.epochs, whole.epochs);
    EXPECT_EQ(cut.opt->steps(), whole.opt->steps());
  }
}

// Steps the loss scaler skips are steps of the run, as nanoGPT's iter_num
// and the schedule count them: max_steps ends after that many optimizer
// calls, eval_every and save_every_steps fire once per multiple of their
// count, and an epoch whose every step was skipped reports its gradient
// norms as unmeasured (NaN; null in the metrics). A starting scale at
// float's limit and large weights make the first steps overflow.
TEST(Trainer, StepsTheLossScalerSkipsAreStepsOfTheRun) {
  const auto data = data::make_synthetic(32, 4);  // 2 steps an epoch
  auto model = models::make_model("mlp", data.train.sample_shape(), 10, 3);
  SingleDeviceEngine engine(*model, Device::cpu(), *make_criterion({}), 3);
  {  // weights 5x their initialization: the first steps' scaled gradients overflow (6 of them)
    Tensor& p = model->arenas().params;
    for (int64_t i = 0; i < p.numel(); ++i) p.f32()[i] *= 5;
  }
  auto opt = optim::make_optimizer(engine.model(), engine.primary_context(), testing::test_sgd());
  train::TrainerConfig tc;
  tc.epochs = 8;
  tc.batch_size = 16;
  tc.seed = 3;
  tc.max_steps = 10;
  tc.eval_every = 3;
  tc.eval_batches = 1;
  tc.save_every_steps = 3;
  tc.clip_grad_norm = 1e9;  // measures the norms, clips nothing
  tc.loss_scaling = optim::GradScalerOptions{.init_scale = std::numeric_limits<float>::max()};
  tc.schedule = optim::parse_lr_schedule("constant", 0.05f, tc.epochs, 0);
  tc.progress = train::Progress::Mode::Off;
  tc.summary_out = nullptr;
  train::Trainer t(tc, engine, *opt, data);
  std::vector<train::StepInfo> steps;
  std::vector<int64_t> evals, saves;
  std::vector<train::EpochMetrics> epochs;
  t.on_step = [&](const train::StepInfo& s) { steps.push_back(s); };
  t.on_eval = [&](const train::EvalMetrics& e) { evals.push_back(e.step); };
  t.on_mid_epoch = [&](int, const train::EpochPosition&, bool) { saves.push_back(t.steps()); };
  t.on_epoch_end = [&](const train::EpochMetrics& m) { epochs.push_back(m); };
  t.run();
  int64_t skipped = 0;
  for (const train::StepInfo& s : steps) skipped += s.stepped ? 0 : 1;
  ASSERT_GE(skipped, 2) << "the test needs the first epoch's two steps skipped";
  ASSERT_LT(skipped, 9);
  EXPECT_FALSE(steps[0].stepped || steps[1].stepped);
  ASSERT_EQ(steps.size(), 10u) << "max_steps counts skipped steps";
  for (size_t i = 0; i < steps.size(); ++i) EXPECT_EQ(steps[i].step, static_cast<int64_t>(i + 1));
  EXPECT_EQ(t.steps(), 10);
  EXPECT_EQ(opt->steps(), 10 - skipped);
  EXPECT_EQ(t.grad_scaler()->skipped(), skipped);
  EXPECT_EQ(evals, (std::vector<int64_t>{3, 6, 9}));
  EXPECT_EQ(saves, (std::vector<int64_t>{3, 9})) << "inside epochs only (step 6 ends epoch 3)";
  ASSERT_EQ(epochs.size(), 5u);
  EXPECT_TRUE(epochs[0].grad_norms);
  EXPECT_TRUE(std::isnan(epochs[0].grad_norm_mean) && std::isnan(epochs[0].grad_norm_max));
  const nlohmann::json j = train::metrics_json(epochs[0]);
  ASSERT_TRUE(j.contains("grad_norm_mean") && j.contains("grad_norm_max"));
  EXPECT_TRUE(j["grad_norm_mean"].is_null() && j["grad_norm_max"].is_null());
  EXPECT_EQ(epochs[0].skipped_steps, 2);
  EXPECT_TRUE(std::isfinite(epochs.back().grad_norm_mean) && epochs.back().grad_norm_mean > 0);
  EXPECT_TRUE(train::metrics_json(epochs.back())["grad_norm_max"].is_number());

  // Resumed with the scaler's state, the skips before count once.
  train::TrainerConfig more = tc;
  more.max_steps = 12;
  train::Trainer resumed(more, engine, *opt, data);
  resumed.grad_scaler()->load_state(t.grad_scaler()->state());
  resumed.set_steps_skipped_before(10 - opt->steps());
  EXPECT_EQ(resumed.steps(), 10);
  // Resumed without one (another precision), the checkpoint's count stands.
  train::TrainerConfig plain = more;
  plain.loss_scaling.reset();
  train::Trainer unscaled(plain, engine, *opt, data);
  unscaled.set_steps_skipped_before(10 - opt->steps());
  EXPECT_EQ(unscaled.steps(), 10);
}

// A row whose forward overflows (loss inf or NaN) under a loss scaler: its
// gradients are not finite, so the scaler skips the step and the run goes on
// (GradScaler's way; without a scaler it ends the run as diverged). The
// epoch's train loss is the other rows' mean. A forward that overflows on
// every step ends the run once the halving scale leaves float's range.
TEST(Trainer, ALossThatOverflowsIsAStepTheLossScalerSkips) {
  auto data = data::make_synthetic(32, 4);
  const int64_t per = data.train.images.numel() / data.train.size();
  auto with_spikes = [&](const std::vector<int64_t>& rows) {  // float32 images, these rows at 3e38
    data::ImageDataset d = data.train;
    d.images = Tensor::empty(data.train.images.shape(), DType::F32);
    for (int64_t i = 0; i < d.images.numel(); ++i) d.images.f32()[i] = data.train.images.data<uint8_t>()[i] / 255.0f;
    for (int64_t r : rows)
      for (int64_t k = 0; k < per; ++k) d.images.f32()[r * per + k] = 3e38f;
    d.mean.clear();
    d.std.clear();
    return d;
  };
  auto run = [&](const data::ImageDataset& train, float init_scale, std::vector<train::StepInfo>& steps,
                 std::vector<train::EpochMetrics>& epochs) {
    data::TrainTest tt{train, data.test, {}};
    auto model = models::make_model("mlp", data.train.sample_shape(), 10, 3);
    SingleDeviceEngine engine(*model, Device::cpu(), *make_criterion({}), 3);
    auto opt = optim::make_optimizer(engine.model(), engine.primary_context(), testing::test_sgd());
    train::TrainerConfig tc;
    tc.epochs = 2;
    tc.batch_size = 1;
    tc.seed = 3;
    tc.loss_scaling = optim::GradScalerOptions{.init_scale = init_scale};
    tc.schedule = optim::parse_lr_schedule("constant", 0.01f, tc.epochs, 0);
    tc.progress = train::Progress::Mode::Off;
    tc.summary_out = nullptr;
    train::Trainer t(tc, engine, *opt, tt);
    t.on_step = [&](const train::StepInfo& s) { steps.push_back(s); };
    t.on_epoch_end = [&](const train::EpochMetrics& m) { epochs.push_back(m); };
    t.run();
    return opt->steps();
  };
  std::vector<train::StepInfo> steps;
  std::vector<train::EpochMetrics> epochs;
  const int64_t stepped = run(with_spikes({5}), 1024.0f, steps, epochs);
  ASSERT_EQ(steps.size(), 64u);
  ASSERT_EQ(epochs.size(), 2u);
  EXPECT_EQ(stepped, 62) << "the spiked row's step, once an epoch, is skipped";
  for (int e = 0; e < 2; ++e) {
    double sum = 0;
    int n = 0;
    for (int i = 0; i < 32; ++i) {
      const train::StepInfo& s = steps[static_cast<size_t>(e * 32 + i)];
      EXPECT_EQ(std::isfinite(s.loss), s.stepped) << "step " << e * 32 + i + 1;
      if (s.stepped) sum += s.loss, ++n;
    }
    ASSERT_EQ(n, 31);
    EXPECT_NEAR(epochs[static_cast<size_t>(e)].train_loss, sum / 31, 1e-12 * std::abs(sum / 31))
        << "epoch " << e + 1 << ": the other rows' mean";
    EXPECT_EQ(epochs[static_cast<size_t>(e)].skipped_steps, e + 1);
  }
  std::vector<int64_t> all(32);
  std::iota(all.begin(), all.end(), 0);
  steps.clear();
  epochs.clear();
  testing::expect_user_error([&] { run(with_spikes(all), 1e-36f, steps, epochs); },
                             {"training diverged: the loss scaler skipped every step until its scale fell to",
                              "at epoch 1 step 7 "});
}

// warmup-cosine follows the run's step count (nanoGPT's iter_num), not the
// position in the epoch: a run cut by max_steps inside an epoch (which ends
// that epoch) and resumed with a larger max_steps, or resumed with another
// batch size, continues the schedule where it stood. Expected rates from
// nanoGPT's get_lr written out in float64.
TEST(Trainer, WarmupCosineContinuesTheRunsStepsOnResume) {
  const auto data = data::make_synthetic(128, 4);  // 8 steps an epoch at batch 16
  auto model = models::make_model("mlp", data.train.sample_shape(), 10, 3);
  SingleDeviceEngine engine(*model, Device::cpu(), *make_criterion({}), 3);
  auto opt = optim::make_optimizer(engine.model(), engine.primary_context(), testing::test_sgd());
  const auto get_lr = [](int64_t it) {  // nanoGPT: warmup 2, decay 20, lr 0.05, min 0.005
    if (it < 2) return 0.05 * (it + 1) / 3;
    if (it > 20) return 0.005;
    return 0.005 + 0.5 * (1 + std::cos(M_PI * (it - 2) / 18.0)) * (0.05 - 0.005);
  };
  std::vector<float> rates;
  const auto run = [&](int first_epoch, int64_t max_steps, int64_t batch) {
    train::TrainerConfig tc;
    tc.epochs = 4;
    tc.batch_size = batch;
    tc.seed = 3;
    tc.max_steps = max_steps;
    tc.schedule = optim::parse_lr_schedule("warmup-cosine", 0.05f, tc.epochs, 0);
    optim::set_warmup_cosine(tc.schedule, 2, 20, 0.005f);
    tc.progress = train::Progress::Mode::Off;
    tc.summary_out = nullptr;
    train::Trainer t(tc, engine, *opt, data);
    t.on_step = [&](const train::StepInfo& s) { rates.push_back(s.lr); };
    t.run(first_epoch);
  };
  run(0, 5, 16);   // steps 0-4, epoch 1 ends there
  run(1, 9, 16);   // resumed in epoch 2: steps 5-8
  run(2, 12, 32);  // epoch 3 at another batch size: steps 9-11
  ASSERT_EQ(rates.size(), 12u);
  for (size_t i = 0; i < rates.size(); ++i) EXPECT_NEAR(rates[i], get_lr(static_cast<int64_t>(i)), 1e-7) << "step " << i;
}

// A metrics file whose last write was cut short (a full disk) ends in a
// fragment without a newline: a resume removes it and, from an epoch's
// checkpoint, puts that epoch's line back, so each epoch appears once.
TEST(Trainer, AResumeRepairsAMetricsFileCutShort) {
  testing::TempDir dir;
  const std::string path = dir.path() + "/m.jsonl";
  const nlohmann::json e3 = {{"epoch", 3}, {"train_loss", 0.5}};
  std::ofstream(path) << R"({"epoch": 1, "train_loss": 0.9})" "\n" R"({"user": "note"})" "\n"
                      << R"({"epoch": 2, "train_loss": 0.7})" "\n" R"({"epoch": 3, "train_lo)";
  bool restored = false;
  EXPECT_EQ(train::drop_metrics_after(path, 3, -1, &e3, &restored), 1);
  EXPECT_TRUE(restored);
  std::ifstream in(path);
  std::vector<nlohmann::json> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[1]["user"], "note") << "lines of other kinds stay";
  EXPECT_EQ(lines[3], e3);
  // With the epoch's line present nothing changes; a checkpoint of another epoch restores nothing.
  EXPECT_EQ(train::drop_metrics_after(path, 3, -1, &e3, &restored), 0);
  EXPECT_FALSE(restored);
  const nlohmann::json e2 = {{"epoch", 2}, {"train_loss", 0.1}};
  EXPECT_EQ(train::drop_metrics_after(path, 2, -1, &e2, &restored), 1);  // epoch 3's line, trained again
  EXPECT_FALSE(restored);
  // A whole last line that lost only its newline gets it back (the next line would join it).
  std::ofstream(path) << R"({"epoch": 1, "train_loss": 0.9})";
  EXPECT_EQ(train::drop_metrics_after(path, 1), 0);
  std::ifstream again(path);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(again), {}), "{\"epoch\": 1, \"train_loss\": 0.9}\n");
  // A stream (--metrics /dev/stdout, a pipe) has no earlier lines: nothing is read from it (opening a FIFO
  // to read would wait for a writer, and /dev/stdout's pipe for this very process).
  const std::string fifo = dir.path() + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_EQ(train::drop_metrics_after(fifo, 1, -1, &e3, &restored), 0);
  EXPECT_FALSE(restored);
  EXPECT_EQ(train::drop_metrics_after("/dev/null", 1), 0);
}

// An empty test set is refused, not reported as a test loss and accuracy of 0.
TEST(Trainer, AnEmptyTestSetIsRefused) {
  const auto data = data::make_synthetic(64, 4);
  struct Empty : data::Dataset {
    const data::Dataset& inner;
    explicit Empty(const data::Dataset& d) : inner(d) {}
    int64_t size() const override { return 0; }
    Shape sample_shape() const override { return inner.sample_shape(); }
    data::TargetKind target_kind() const override { return inner.target_kind(); }
    Shape target_shape() const override { return inner.target_shape(); }
    void get(int64_t, const data::SampleDraw&, void*, void*) const override {}
  } empty(data.test);
  auto model = models::make_model("mlp", data.train.sample_shape(), 10, 3);
  SingleDeviceEngine engine(*model, Device::cpu(), *make_criterion({}), 3);
  auto opt = optim::make_optimizer(engine.model(), engine.primary_context(), testing::test_sgd());
  train::TrainerConfig tc;
  tc.batch_size = 16;
  testing::expect_user_error([&] { train::Trainer(tc, engine, *opt, data.train, empty); }, {"the test set is empty"});
}

TEST(Trainer, EvalSettingsMustBeNonNegative) {
  const auto data = data::make_synthetic(64, 4);
  auto model = models::make_model("mlp", data.train.sample_shape(), 10, 3);
  SingleDeviceEngine engine(*model, Device::cpu(), *make_criterion({}), 3);
  auto opt = optim::make_optimizer(engine.model(), engine.primary_context(), testing::test_sgd());
  train::TrainerConfig tc;
  tc.batch_size = 16;
  tc.eval_every = -1;
  testing::expect_user_error([&] { train::Trainer(tc, engine, *opt, data); }, {"--eval-every must be non-negative, got -1"});
  tc.eval_every = 5;
  tc.eval_batches = -2;
  testing::expect_user_error([&] { train::Trainer(tc, engine, *opt, data); }, {"--eval-steps must be non-negative, got -2"});
}

// warmup-cosine ends at --max-steps unless --lr-decay-steps says otherwise
// (nanoGPT's lr_decay_iters = max_iters); with neither it is refused before
// anything loads.
TEST(RunConfig, WarmupCosineEndsAtMaxStepsByDefault) {
  train::RunConfig c;
  c.lr_schedule = "warmup-cosine";
  c.warmup_steps = 5;
  testing::expect_user_error([&] { c.validate(); }, {"--lr-schedule warmup-cosine needs --lr-decay-steps N", "or --max-steps"});
  c.max_steps = 40;
  c.validate();
  EXPECT_EQ(c.trainer_config(false).schedule.lr_decay_steps, 40);
  c.lr_decay_steps = 30;
  EXPECT_EQ(c.trainer_config(false).schedule.lr_decay_steps, 30);
  c.warmup_steps = 30;
  testing::expect_user_error([&] { c.validate(); }, {"warmup-cosine needs 0 <= --warmup-steps < --lr-decay-steps, got 30 and 30"});
}

}  // namespace
}  // namespace fanout
