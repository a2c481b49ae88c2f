// Checkpoints: training N epochs equals training some, saving, loading into a
// fresh model and training the rest (bit for bit on CPU, single device and
// DataParallel); bad checkpoints fail with one clear error; rotation keeps
// the newest K and the best.
#include <gtest/gtest.h>

#include <unistd.h>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include "models/zoo/zoo.h"
#include "runtime/core/error.h"
#include "runtime/core/file_lock.h"
#include "runtime/io/safetensors.h"
#include "runtime/parallel/data_parallel.h"
#include "runtime/parallel/single_device.h"
#include "runtime/train/checkpoint.h"
#include "runtime/train/resume.h"
#include "runtime/train/trainer.h"
#include "support/test_util.h"
#include "support/trained.h"

namespace fanout {
namespace {

namespace fs = std::filesystem;

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() /
           ("fanout_ckpt_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string operator/(const std::string& name) const { return (path / name).string(); }
};

struct TrainingRun {
  std::unique_ptr<Module> model;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<optim::Optimizer> opt;
  std::unique_ptr<train::Trainer> trainer;
};

FILE* devnull() {
  static FILE* f = std::fopen("/dev/null", "w");
  return f;
}

// A cosine run over `epochs` on the synthetic set; init_seed lets a resumed
// run start from different weights, to prove the checkpoint replaces them.
// With `adamw`: AdamW (amsgrad), no decay on biases and norm weights, and
// clipping by norm, tight enough to clip most steps.
TrainingRun make_run(const data::TrainTest& data, int devices, int epochs, uint64_t init_seed, bool adamw = false,
                     int64_t batch = 24, float lr = -1, const data::Dataset* test = nullptr, int64_t eval_batch = 50) {
  TrainingRun r;
  r.model = models::make_model("lenet", data.train.sample_shape(), 10, init_seed);
  if (devices == 0) {
    r.engine = std::make_unique<SingleDeviceEngine>(*r.model, Device::cpu(), *make_criterion({}), 7);
  } else {
    DataParallelOptions o;
    o.seed = 7;
    r.engine = std::make_unique<DataParallelEngine>(*r.model, parse_devices("cpu:" + std::to_string(devices)),
                                                    *make_criterion({}), o);
  }
  optim::OptimizerOptions oo = adamw ? testing::test_adamw() : testing::test_sgd();
  if (lr >= 0) oo.lr = lr;
  r.opt = optim::make_optimizer(r.engine->model(), r.engine->primary_context(), oo);
  train::TrainerConfig tc;
  tc.epochs = epochs;
  tc.batch_size = batch;  // 24: 96 samples are 4 batches an epoch
  tc.eval_batch_size = eval_batch;
  tc.seed = 7;
  tc.workers = 2;
  tc.augment = data::parse_augment("crop:2,flip");
  tc.schedule = optim::parse_lr_schedule("cosine", oo.lr, epochs, 0.5f);  // the rate is the optimizer's
  if (adamw) tc.clip_grad_norm = 0.5;
  tc.progress = train::Progress::Mode::Off;
  tc.summary_out = devnull();
  r.trainer = std::make_unique<train::Trainer>(tc, *r.engine, *r.opt, data.train, test ? *test : data.test);
  return r;
}

// make_run(data, 0, 1, 3) trained for its epoch, its checkpoint (with st) written to path.
TrainingRun trained_and_saved(const data::TrainTest& data, const std::string& path,
                              const train::CheckpointState& st = {}) {
  TrainingRun r = make_run(data, 0, 1, 3);
  r.trainer->run();
  train::save_checkpoint(path, *r.engine, r.opt.get(), st);
  return r;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  const Tensor ha = a.to(Device::cpu()), hb = b.to(Device::cpu());
  return ha.nbytes() == hb.nbytes() && std::memcmp(ha.raw(), hb.raw(), ha.nbytes()) == 0;
}

// Every state arena of the two optimizers, bit for bit.
bool same_state(optim::Optimizer& a, optim::Optimizer& b) {
  auto sa = a.state(), sb = b.state();
  if (sa.size() != sb.size() || sa.empty()) return false;
  for (size_t i = 0; i < sa.size(); ++i)
    if (sa[i].first != sb[i].first || !same_bits(*sa[i].second, *sb[i].second)) return false;
  return true;
}

void expect_exact_resume(int devices, bool adamw = false) {
  const auto data = data::make_synthetic(96, 5);
  TempDir dir;
  TrainingRun whole = make_run(data, devices, 4, 1, adamw);
  whole.trainer->run();

  TrainingRun first = make_run(data, devices, 4, 1, adamw);
  const train::EpochMetrics m2 = first.trainer->run(0, 2);
  train::CheckpointState st;
  st.epoch = 2;
  st.step = first.opt->steps();
  st.best_test_acc = m2.test_metric("acc");
  st.config = {{"model", "lenet"}, {"seed", 7}};
  st.metrics = train::metrics_json(m2);
  const std::string path = dir / "mid.safetensors";
  train::save_checkpoint(path, *first.engine, first.opt.get(), st);

  TrainingRun rest = make_run(data, devices, 4, 99, adamw);
  ASSERT_FALSE(same_bits(rest.model->arenas().params, first.model->arenas().params));
  const train::CheckpointState back = train::load_checkpoint(path, *rest.engine, *rest.opt);
  EXPECT_EQ(back.epoch, 2);
  EXPECT_EQ(back.step, 8);
  EXPECT_EQ(back.best_test_acc, m2.test_metric("acc"));
  EXPECT_EQ(back.config["model"], "lenet");
  EXPECT_EQ(back.metrics["test_acc"], m2.test_metric("acc"));
  EXPECT_EQ(rest.opt->steps(), 8);
  EXPECT_TRUE(same_bits(rest.model->arenas().params, first.model->arenas().params));
  EXPECT_TRUE(same_state(*rest.opt, *first.opt));
  rest.trainer->run(back.epoch);

  EXPECT_EQ(rest.opt->steps(), whole.opt->steps());
  EXPECT_TRUE(same_bits(rest.model->arenas().params, whole.model->arenas().params));
  EXPECT_TRUE(same_bits(rest.model->arenas().buffers, whole.model->arenas().buffers));
  EXPECT_TRUE(same_state(*rest.opt, *whole.opt));
  // And the continued run really moved away from the checkpoint.
  EXPECT_FALSE(same_bits(rest.model->arenas().params, first.model->arenas().params));
}

// Stopped mid-epoch after `stop_after_steps` optimizer steps (as a SIGTERM
// would), saved, loaded into fresh weights and continued: the same bits as
// the run that was not interrupted, metrics of the cut epoch included.
// in_evaluation: the stop comes between the evaluation batches after the
// epoch whose last step is `stop_after_steps`; the position is that epoch
// after its last batch, and the resumed run evaluates it first.
void expect_exact_mid_epoch_resume(int devices, int stop_after_steps, bool adamw = false, bool in_evaluation = false) {
  const auto data = data::make_synthetic(96, 5);
  const int64_t eval_batch = in_evaluation ? 4 : 50;  // the stop comes between evaluation batches
  TempDir dir;
  TrainingRun whole = make_run(data, devices, 3, 1, adamw, 24, -1, nullptr, eval_batch);
  const train::EpochMetrics whole_last = whole.trainer->run();

  TrainingRun first = make_run(data, devices, 3, 1, adamw, 24, -1, nullptr, eval_batch);
  (in_evaluation ? first.trainer->should_stop_evaluating : first.trainer->should_stop) = [&] {
    return first.opt->steps() >= stop_after_steps;
  };
  int epochs_ended = 0;
  first.trainer->on_epoch_end = [&](const train::EpochMetrics&) { ++epochs_ended; };
  train::CheckpointState st;
  std::string saved;
  first.trainer->on_mid_epoch = [&](int epoch, const train::EpochPosition& pos, bool stopping) {
    ASSERT_TRUE(stopping);
    st.epoch = epoch;
    st.batch = pos.batch;
    st.partial = pos.totals;
    st.step = first.opt->steps();
    st.config = {{"model", "lenet"}, {"seed", 7}};
    saved = dir / "mid.safetensors";
    train::save_checkpoint(saved, *first.engine, first.opt.get(), st);
  };
  first.trainer->run();
  ASSERT_TRUE(first.trainer->stopped());
  ASSERT_FALSE(saved.empty()) << "stopped without a mid-epoch position";
  EXPECT_EQ(first.opt->steps(), stop_after_steps);
  EXPECT_GT(st.batch, 0);
  if (in_evaluation) {
    EXPECT_EQ(st.batch, 4) << "the epoch after its last batch";
    EXPECT_EQ(epochs_ended, stop_after_steps / 4 - 1) << "the stopped epoch's end is not reported";
  }

  TrainingRun rest = make_run(data, devices, 3, 99, adamw, 24, -1, nullptr, eval_batch);
  const train::CheckpointState back = train::load_checkpoint(saved, *rest.engine, *rest.opt);
  EXPECT_EQ(back.batch, st.batch);
  EXPECT_EQ(back.partial, st.partial);
  const train::EpochMetrics rest_last = rest.trainer->run(back.epoch, -1, train::EpochPosition{back.batch, back.partial});
  EXPECT_FALSE(rest.trainer->stopped());
  EXPECT_EQ(rest.opt->steps(), whole.opt->steps());
  EXPECT_TRUE(same_bits(rest.model->arenas().params, whole.model->arenas().params));
  EXPECT_TRUE(same_bits(rest.model->arenas().buffers, whole.model->arenas().buffers));
  EXPECT_TRUE(same_state(*rest.opt, *whole.opt));
  EXPECT_EQ(rest_last.train_loss, whole_last.train_loss);
  EXPECT_EQ(rest_last.test_loss, whole_last.test_loss);
  EXPECT_EQ(rest_last.grad_norms, adamw);
  EXPECT_EQ(rest_last.grad_norm_mean, whole_last.grad_norm_mean);
  EXPECT_EQ(rest_last.grad_norm_max, whole_last.grad_norm_max);
}

// 4 batches an epoch: stop inside the first epoch and inside the second.
TEST(Checkpoint, MidEpochResumeIsBitExactSingleDevice) {
  expect_exact_mid_epoch_resume(0, 2);
  expect_exact_mid_epoch_resume(0, 7);
}
TEST(Checkpoint, MidEpochResumeIsBitExactDataParallel) { expect_exact_mid_epoch_resume(2, 5); }
// AdamW with amsgrad, groups and clipping: every state arena and the epoch's gradient norms carry over.
TEST(Checkpoint, MidEpochResumeIsBitExactAdamW) {
  expect_exact_mid_epoch_resume(0, 3, true);
  expect_exact_mid_epoch_resume(3, 6, true);
}

// A stop asked for at an epoch's last step ends that epoch (evaluated, and
// its checkpoint hook run) and stops before the next.
// Stopped after one batch of 24 and resumed with batches of 36 or 20: the
// remaining 72 samples come as 36 + 36 or 20 + 20 + 20 + 12 (re-batched, not
// skipped), and at lr 0 the epoch's accuracy and loss are the uninterrupted
// epoch's: every sample seen once (the loss within float32 rounding, as
// another batch size sums each row's products in another blocking).
TEST(Checkpoint, MidEpochResumeWithAnotherBatchSizeReBatchesTheRest) {
  const auto data = data::make_synthetic(96, 5);
  for (int devices : {0, 2}) {
    TrainingRun whole = make_run(data, devices, 1, 1, false, 24, 0.0f);
    const train::EpochMetrics want = whole.trainer->run();
    for (int64_t batch : {36, 20}) {
      SCOPED_TRACE(std::to_string(devices) + " devices, batches of " + std::to_string(batch));
      TrainingRun first = make_run(data, devices, 1, 1, false, 24, 0.0f);
      first.trainer->should_stop = [&] { return first.opt->steps() >= 1; };
      train::EpochPosition at;
      first.trainer->on_mid_epoch = [&](int, const train::EpochPosition& pos, bool) { at = pos; };
      first.trainer->run();
      ASSERT_TRUE(first.trainer->stopped());
      ASSERT_EQ(at.batch, 1);
      TrainingRun rest = make_run(data, devices, 1, 1, false, batch, 0.0f);
      std::vector<int64_t> rows;
      rest.trainer->on_step = [&](const train::StepInfo& s) { rows.push_back(s.rows); };
      const train::EpochMetrics got = rest.trainer->run(0, -1, at);
      EXPECT_EQ(rows, batch == 36 ? (std::vector<int64_t>{36, 36}) : (std::vector<int64_t>{20, 20, 20, 12}));
      EXPECT_EQ(got.train_metric("acc"), want.train_metric("acc"));
      EXPECT_NEAR(got.train_loss, want.train_loss, 1e-6 * want.train_loss);
      EXPECT_EQ(got.test_metric("acc"), want.test_metric("acc"));
    }
  }
}

// A stop while an epoch's end is evaluated (SIGTERM in a long evaluation)
// abandons the evaluation; the resumed run evaluates that epoch and ends as
// the run that was never stopped.
TEST(Checkpoint, StopInsideAnEvaluationResumesWithIt) {
  expect_exact_mid_epoch_resume(0, 4, false, /*in_evaluation=*/true);
  expect_exact_mid_epoch_resume(2, 8, true, /*in_evaluation=*/true);
}

// An evaluation that fails (a bad validation file) saves the epoch's
// training first, as the position after its last batch.
// resume_run compares the model the checkpoint's run named with this run's;
// a checkpoint saved with a default CheckpointState (a library's loop, as the
// README's example) names none, and its tensors decide.
TEST(Checkpoint, ResumeRunTakesACheckpointThatNamesNoModel) {
  const auto data = data::make_synthetic(96, 5);
  TempDir dir;
  train::CheckpointState st;
  st.epoch = 1;
  trained_and_saved(data, dir / "plain.safetensors", st);
  st.config = {{"model", "mlp"}};
  trained_and_saved(data, dir / "mlp.safetensors", st);
  TrainingRun r = make_run(data, 0, 3, 9);
  train::RunConfig c;
  c.model = "lenet";
  c.epochs = 3;
  c.batch_size = 24;
  c.resume = dir / "plain.safetensors";
  const train::ResumeOutcome got = train::resume_run(c, *r.engine, *r.opt, nlohmann::json::object());
  EXPECT_EQ(got.state.epoch, 1);
  EXPECT_EQ(r.opt->steps(), 4);
  c.resume = dir / "mlp.safetensors";
  testing::expect_user_error([&] { train::resume_run(c, *r.engine, *r.opt, nlohmann::json::object()); },
                             {"was trained with --model mlp, not lenet"});
}

TEST(Checkpoint, AFailedEvaluationSavesTheEpochFirst) {
  const auto data = data::make_synthetic(96, 5);
  struct Broken : data::Dataset {
    const data::Dataset& inner;
    explicit Broken(const data::Dataset& d) : inner(d) {}
    int64_t size() const override { return inner.size(); }
    Shape sample_shape() const override { return inner.sample_shape(); }
    data::TargetKind target_kind() const override { return inner.target_kind(); }
    Shape target_shape() const override { return inner.target_shape(); }
    void get(int64_t i, const data::SampleDraw& d, void* x, void* y) const override {
      FANOUT_USER_CHECK(i != 3) << "cannot decode sample 3";
      inner.get(i, d, x, y);
    }
  } broken(data.test);
  TrainingRun r = make_run(data, 0, 3, 1, false, 24, -1, &broken);
  std::vector<std::pair<int, int64_t>> saved;
  r.trainer->on_mid_epoch = [&](int epoch, const train::EpochPosition& pos, bool stopping) {
    EXPECT_FALSE(stopping);
    saved.emplace_back(epoch, pos.batch);
  };
  EXPECT_EQ(testing::error_of([&] { r.trainer->run(); }), "cannot decode sample 3");
  EXPECT_EQ(saved, (std::vector<std::pair<int, int64_t>>{{0, 4}}));
  EXPECT_EQ(r.opt->steps(), 4);
}

TEST(Checkpoint, StopAtTheEpochsEndStopsBetweenEpochs) {
  const auto data = data::make_synthetic(96, 5);
  TrainingRun r = make_run(data, 0, 3, 1);
  int epochs_ended = 0;
  r.trainer->on_epoch_end = [&](const train::EpochMetrics&) { ++epochs_ended; };
  r.trainer->on_mid_epoch = [&](int, const train::EpochPosition&, bool) { ADD_FAILURE() << "stopped mid-epoch"; };
  r.trainer->should_stop = [&] { return r.opt->steps() >= 4; };  // 4 steps: epoch 1's last
  r.trainer->run();
  EXPECT_TRUE(r.trainer->stopped());
  EXPECT_EQ(r.trainer->stopped_epoch(), 1);
  EXPECT_EQ(r.trainer->stopped_at().batch, 0);
  EXPECT_EQ(epochs_ended, 1);
  EXPECT_EQ(r.opt->steps(), 4);
}

TEST(Checkpoint, ResumeIsBitExactSingleDevice) { expect_exact_resume(0); }
TEST(Checkpoint, ResumeIsBitExactDataParallel) { expect_exact_resume(2); }
TEST(Checkpoint, ResumeIsBitExactAdamW) { expect_exact_resume(2, true); }

// The key set: the model's state_dict, then optimizer.<state>.<param> for
// every state and parameter (torch's state names); best.safetensors (the
// file people deploy) the model alone.
std::set<std::string> key_set(const std::string& path) {
  std::set<std::string> out;
  for (auto& [n, t] : io::load_safetensors(path).tensors) out.insert(n);
  return out;
}

TEST(Checkpoint, FileHoldsTorchvisionNamesAndOptimizerState) {
  const auto data = data::make_synthetic(48, 2);
  TempDir dir;
  for (bool adamw : {false, true}) {
    SCOPED_TRACE(adamw ? "adamw" : "sgd");
    TrainingRun r = make_run(data, 0, 1, 3, adamw);
    std::set<std::string> model_keys;
    for (auto& [n, t] : r.model->state_dict()) model_keys.insert(n);
    train::CheckpointState st;
    train::save_checkpoint(dir / "fresh.safetensors", *r.engine, r.opt.get(), st);
    EXPECT_EQ(key_set(dir / "fresh.safetensors"), model_keys) << "no state before the first step";
    r.trainer->run();
    st.epoch = 1;
    train::save_checkpoint(dir / "c.safetensors", *r.engine, r.opt.get(), st);
    std::set<std::string> want = model_keys;
    const std::vector<std::string> states =
        adamw ? std::vector<std::string>{"exp_avg", "exp_avg_sq", "max_exp_avg_sq"} : std::vector<std::string>{"momentum_buffer"};
    for (const std::string& s : states)
      for (auto& [n, p] : r.model->named_parameters()) want.insert("optimizer." + s + "." + n);
    EXPECT_EQ(key_set(dir / "c.safetensors"), want);
    const io::TensorFile f = io::load_safetensors(dir / "c.safetensors");
    const nlohmann::json opt = nlohmann::json::parse(f.metadata.at("optimizer"));
    EXPECT_EQ(opt["type"], adamw ? "AdamW" : "SGD");
    EXPECT_EQ(opt["steps"], 2);
    EXPECT_EQ(opt["groups"].size(), adamw ? 2u : 1u);
    // A damaged optimizer state (a NaN) is named when the checkpoint loads, not found later as a diverging loss.
    io::TensorFile damaged = io::load_safetensors(dir / "c.safetensors");
    const std::string poisoned = "optimizer." + states[0] + ".fc1.weight";
    for (auto& [n, t] : damaged.tensors)
      if (n == poisoned) t.f32()[5] = std::nanf("");
    io::save_safetensors(dir / "damaged.safetensors", damaged.tensors, damaged.metadata);
    TrainingRun again = make_run(data, 0, 1, 3, adamw);
    testing::expect_user_error([&] { train::load_checkpoint(dir / "damaged.safetensors", *again.engine, *again.opt); },
                               {"damaged.safetensors", "optimizer state " + states[0] + ".fc1.weight holds non-finite"});
    train::save_checkpoint(dir / "w.safetensors", *r.engine, nullptr, st);
    EXPECT_EQ(key_set(dir / "w.safetensors"), model_keys);
    EXPECT_EQ(io::load_safetensors(dir / "w.safetensors").metadata.at("format"), train::kWeightsFormat);
  }
  train::CheckpointState st;
  st.epoch = 1;
  trained_and_saved(data, dir / "c.safetensors", st);
  const io::TensorFile f = io::load_safetensors(dir / "c.safetensors");
  EXPECT_EQ(f.metadata.at("format"), train::kCheckpointFormat);
  EXPECT_EQ(f.metadata.at("epoch"), "1");
  for (const char* key : {"step", "best_test_acc", "optimizer", "rng", "sampler", "config", "metrics"})
    EXPECT_TRUE(f.metadata.count(key)) << key;
}

TEST(Checkpoint, RefusesWhatIsNotACheckpoint) {
  const auto data = data::make_synthetic(48, 2);
  TempDir dir;
  TrainingRun r = make_run(data, 0, 1, 3);
  // Weights only (what PyTorch exports): --init-from material, not --resume.
  io::save_safetensors(dir / "weights.safetensors", r.model->state_dict());
  testing::expect_user_error([&] { train::load_checkpoint(dir / "weights.safetensors", *r.engine, *r.opt); },
                             {"is not a fanout training checkpoint", "load its weights alone instead (load_weights)"});
  // A checkpoint of another architecture.
  auto mlp = models::make_model("mlp", data.train.sample_shape(), 10, 1);
  testing::Trained<SingleDeviceEngine> mlp_engine(*mlp, Device::cpu(), *make_criterion({}), 1);
  mlp_engine.set_optimizer({optim::OptimizerKind::AdamW});
  train::save_checkpoint(dir / "mlp.safetensors", mlp_engine, &mlp_engine.optimizer(), {});
  // The model's mismatch is reported, not the optimizer's.
  testing::expect_user_error([&] { train::load_checkpoint(dir / "mlp.safetensors", *r.engine, *r.opt); },
                             {"mlp.safetensors", "missing", "mismatched"});
  // best.safetensors (the model alone) is not a checkpoint to resume.
  train::save_checkpoint(dir / "best.safetensors", *r.engine, nullptr, {});
  testing::expect_user_error([&] { train::load_checkpoint(dir / "best.safetensors", *r.engine, *r.opt); },
                             {"is not a fanout training checkpoint", "load its weights alone instead (load_weights)"});
  // Callers tell it apart by type (dp-train adds that --init-from loads weights), not by the message.
  EXPECT_THROW(train::load_checkpoint(dir / "best.safetensors", *r.engine, *r.opt), train::NotATrainingCheckpoint);
  EXPECT_THROW(train::load_checkpoint(dir / "mlp.safetensors", *r.engine, *r.opt), Error);
  try {
    train::load_checkpoint(dir / "mlp.safetensors", *r.engine, *r.opt);
  } catch (const train::NotATrainingCheckpoint&) {
    ADD_FAILURE() << "another architecture's checkpoint is a training checkpoint";
  } catch (const Error&) {
  }
  // Momentum buffers into an optimizer without momentum.
  r.trainer->run();
  train::save_checkpoint(dir / "c.safetensors", *r.engine, r.opt.get(), {});
  auto plain = models::make_model("lenet", data.train.sample_shape(), 10, 1);
  optim::OptimizerOptions h = testing::test_sgd();
  h.momentum = 0;
  testing::Trained<SingleDeviceEngine> plain_engine(*plain, Device::cpu(), *make_criterion({}), 1);
  plain_engine.set_optimizer(h);
  const Tensor before = plain->arenas().params.to(Device::cpu());
  testing::expect_user_error(
      [&] { train::load_checkpoint(dir / "c.safetensors", plain_engine, plain_engine.optimizer()); },
      {"momentum_buffer", "does not have"});
  EXPECT_TRUE(same_bits(plain->arenas().params, before));  // nothing written on failure
  // Another optimizer: SGD's checkpoint into AdamW, and AdamW's into SGD.
  for (auto [kind, word] : {std::pair{optim::OptimizerKind::AdamW, "trained with SGD, this run's optimizer is AdamW"},
                            std::pair{optim::OptimizerKind::Adam, "trained with SGD, this run's optimizer is Adam"}}) {
    plain_engine.set_optimizer({kind});
    testing::expect_user_error(
        [&] { train::load_checkpoint(dir / "c.safetensors", plain_engine, plain_engine.optimizer()); }, {word});
  }
  EXPECT_TRUE(same_bits(plain->arenas().params, before));
  TrainingRun aw = make_run(data, 0, 1, 3, true);
  aw.trainer->run();
  train::save_checkpoint(dir / "aw.safetensors", *aw.engine, aw.opt.get(), {});
  testing::expect_user_error([&] { train::load_checkpoint(dir / "aw.safetensors", *r.engine, *r.opt); },
                             {"aw.safetensors", "trained with AdamW, this run's optimizer is SGD"});
  // Corrupt metadata.
  auto f = io::load_safetensors(dir / "c.safetensors");
  f.metadata["epoch"] = "two";
  io::save_safetensors(dir / "bad.safetensors", f.tensors, f.metadata);
  testing::expect_user_error([&] { train::load_checkpoint(dir / "bad.safetensors", *r.engine, *r.opt); },
                             {"'epoch'", "non-negative integer"});
  f.metadata["epoch"] = "2";
  f.metadata["best_test_acc"] = "nan";
  io::save_safetensors(dir / "bad.safetensors", f.tensors, f.metadata);
  testing::expect_user_error([&] { train::load_checkpoint(dir / "bad.safetensors", *r.engine, *r.opt); },
                             {"'best_test_acc'", "finite"});
  // A 16-mixed run's checkpoint that lost its loss scaler's state (its scale and skipped steps would start over).
  f.metadata["best_test_acc"] = "0.5";
  f.metadata["config"] = R"({"precision": "16-mixed"})";
  io::save_safetensors(dir / "bad.safetensors", f.tensors, f.metadata);
  testing::expect_user_error([&] { train::load_checkpoint(dir / "bad.safetensors", *r.engine, *r.opt); },
                             {"bad.safetensors", "16-mixed run's checkpoint without the loss scaler's state"});
  f.metadata["grad_scaler"] = R"({"scale": 1024.0, "growth_tracker": 3, "skipped": 2})";
  io::save_safetensors(dir / "bad.safetensors", f.tensors, f.metadata);
  EXPECT_EQ(train::load_checkpoint(dir / "bad.safetensors", *r.engine, *r.opt).grad_scaler["skipped"], 2);
}

// Checkpoints written before optimizers left the engines: SGD's metadata
// said whether the momentum buffer existed ("has_momentum_buffer") and had
// no groups. With the buffer they resume exactly; without it (a run with
// --momentum 0) into an optimizer with momentum, one line and nothing loaded.
TEST(Checkpoint, OlderSgdCheckpointsLoad) {
  const auto data = data::make_synthetic(48, 2);
  TempDir dir;
  TrainingRun r = trained_and_saved(data, dir / "new.safetensors");
  auto f = io::load_safetensors(dir / "new.safetensors");
  // The optimizer metadata as those versions wrote it.
  auto older = [](double momentum, bool has_buffer) {
    return nlohmann::json{{"type", "SGD"},       {"momentum", momentum},
                          {"dampening", 0.0},    {"weight_decay", 5e-4},
                          {"nesterov", false},   {"has_momentum_buffer", has_buffer},
                          {"steps", 2}}
        .dump();
  };
  f.metadata["optimizer"] = older(0.9, true);
  io::save_safetensors(dir / "old.safetensors", f.tensors, f.metadata);
  TrainingRun back = make_run(data, 0, 1, 9);
  train::load_checkpoint(dir / "old.safetensors", *back.engine, *back.opt);
  EXPECT_EQ(back.opt->steps(), 2);
  EXPECT_TRUE(same_state(*back.opt, *r.opt));
  EXPECT_TRUE(same_bits(back.model->arenas().params, r.model->arenas().params));

  // An older run without momentum: no buffer, steps taken.
  std::vector<std::pair<std::string, Tensor>> weights;
  for (auto& [n, t] : f.tensors)
    if (n.rfind("optimizer.", 0) != 0) weights.emplace_back(n, t);
  f.metadata["optimizer"] = older(0.0, false);
  io::save_safetensors(dir / "old0.safetensors", weights, f.metadata);
  TrainingRun fresh = make_run(data, 0, 1, 9);
  const Tensor before = testing::clone(fresh.model->arenas().params);
  testing::expect_user_error([&] { train::load_checkpoint(dir / "old0.safetensors", *fresh.engine, *fresh.opt); },
                             {"old0.safetensors", "no optimizer state 'momentum_buffer' after 2 steps"});
  EXPECT_TRUE(same_bits(fresh.model->arenas().params, before)) << "nothing loaded";
  optim::OptimizerOptions plain = testing::test_sgd();
  plain.momentum = 0;
  auto opt0 = optim::make_optimizer(fresh.engine->model(), fresh.engine->primary_context(), plain);
  EXPECT_EQ(train::load_checkpoint(dir / "old0.safetensors", *fresh.engine, *opt0).step, 0);
  EXPECT_EQ(opt0->steps(), 2);
  EXPECT_TRUE(same_bits(fresh.model->arenas().params, r.model->arenas().params));
  f.metadata["optimizer"] = nlohmann::json{{"type", "SGD"}, {"has_momentum_buffer", "yes"}, {"steps", 2}}.dump();
  io::save_safetensors(dir / "bad.safetensors", weights, f.metadata);
  testing::expect_user_error([&] { train::load_checkpoint(dir / "bad.safetensors", *fresh.engine, *opt0); },
                             {"'has_momentum_buffer' is not a boolean"});
}

TEST(Checkpoint, InitFromLoadsWeightsStrictOrNot) {
  const auto data = data::make_synthetic(48, 2);
  TempDir dir;
  TrainingRun src = trained_and_saved(data, dir / "c.safetensors");
  auto dst = models::make_model("lenet", data.train.sample_shape(), 10, 11);
  const io::LoadReport ok = train::load_weights(dir / "c.safetensors", *dst, true);
  EXPECT_TRUE(ok.ok()) << ok.summary();  // optimizer entries are not "unexpected"
  EXPECT_TRUE(same_bits(dst->arenas().params, src.model->arenas().params));

  auto other = models::make_model("lenet", data.train.sample_shape(), 7, 11);  // 7 classes: fc3 differs
  testing::expect_user_error([&] { train::load_weights(dir / "c.safetensors", *other, true); },
                             {"c.safetensors", "mismatched", "fc3.weight"});
  const io::LoadReport r = train::load_weights(dir / "c.safetensors", *other, false);
  EXPECT_EQ(r.mismatched.size(), 2u);
  EXPECT_TRUE(r.missing.empty());
  EXPECT_TRUE(same_bits(other->state_dict()[0].second, src.model->state_dict()[0].second));  // conv1.weight

  // Weights with a NaN (a diverged run's): refused by name, nothing loaded.
  io::TensorFile f = io::load_safetensors(dir / "c.safetensors");
  std::vector<std::pair<std::string, Tensor>> weights;
  Tensor fc1_bias;
  for (auto& [name, t] : f.tensors) {
    Tensor c = Tensor::empty(t.shape(), t.dtype());
    c.copy_from(t);
    if (name == "fc1.bias") fc1_bias = t;
    if (name == "fc1.bias") c.f32()[3] = std::nanf("");
    if (name == "fc3.bias") c.f32()[1] = -std::numeric_limits<float>::infinity();
    weights.emplace_back(name, c);
  }
  io::save_safetensors(dir / "nan.safetensors", weights, f.metadata);
  auto fresh = models::make_model("lenet", data.train.sample_shape(), 10, 11);
  Tensor before = Tensor::empty(fresh->arenas().params.shape());
  before.copy_from(fresh->arenas().params);
  testing::expect_user_error([&] { train::load_weights(dir / "nan.safetensors", *fresh, true); },
                             {"nan.safetensors", "fc1.bias holds non-finite values"});
  EXPECT_TRUE(same_bits(fresh->arenas().params, before));
  // Non-strict, a tensor the model does not take is not looked at: fc3 (the infinity) is skipped, fc1 is not.
  testing::expect_user_error([&] { train::load_weights(dir / "nan.safetensors", *other, false); },
                             {"fc1.bias holds non-finite values"});
  for (auto& [name, t] : weights)
    if (name == "fc1.bias") t.copy_from(fc1_bias);
  io::save_safetensors(dir / "inf.safetensors", weights, f.metadata);
  EXPECT_EQ(train::load_weights(dir / "inf.safetensors", *other, false).mismatched.size(), 2u);
}

TEST(Checkpoint, SaverKeepsNewestAndBest) {
  const auto data = data::make_synthetic(48, 2);
  TempDir dir;
  TrainingRun r = make_run(data, 0, 1, 3);
  train::CheckpointSaver saver(dir / "ck", /*every=*/2, /*keep_last=*/2);
  train::CheckpointState st;
  const double accs[] = {0.5, 0.7, 0.6, 0.8, 0.1, 0.2, 0.3};
  std::vector<std::vector<std::string>> written;
  for (int e = 1; e <= 7; ++e) {
    st.epoch = e;
    st.score = accs[e - 1];
    written.push_back(saver.on_epoch_end(*r.engine, *r.opt, st, 7));
  }
  EXPECT_EQ(written[0].size(), 1u);  // epoch 1: not a save epoch, but the best so far
  EXPECT_EQ(written[1].size(), 2u);  // epoch 2: saved and best
  EXPECT_EQ(written[2].size(), 0u);
  EXPECT_EQ(st.best_test_acc, 0.8);
  std::vector<std::string> files;
  for (auto& e : fs::directory_iterator(dir.path / "ck")) files.push_back(e.path().filename().string());
  std::sort(files.begin(), files.end());
  EXPECT_EQ(files, (std::vector<std::string>{".fanout.lock", "best.safetensors", "epoch-0006.safetensors",
                                             "epoch-0007.safetensors"}));  // the lock stays: it is the directory's
  EXPECT_EQ(io::load_safetensors(dir / "ck/best.safetensors").metadata.at("epoch"), "4");
  std::set<std::string> model_keys;
  for (auto& [n, t] : r.model->state_dict()) model_keys.insert(n);
  EXPECT_EQ(key_set(dir / "ck/best.safetensors"), model_keys);  // loads into torch with strict load_state_dict
  EXPECT_EQ(train::resolve_resume_path((dir.path / "ck").string()), dir / "ck/epoch-0007.safetensors");
  // A run resumed from epoch 2 that stops at 3 (not a multiple of every=2)
  // saves epoch 3 and keeps it, leaving the later epochs of the old run alone.
  st.epoch = 3;
  st.score = 0.0;
  EXPECT_EQ(saver.on_epoch_end(*r.engine, *r.opt, st, /*last_epoch=*/3).size(), 1u);
  EXPECT_TRUE(fs::exists(dir.path / "ck/epoch-0003.safetensors"));
  EXPECT_TRUE(fs::exists(dir.path / "ck/epoch-0007.safetensors"));
}

// best.safetensors and the epoch's checkpoint are written together or not at all: a checkpoint that records
// a best score whose file was not written would resume believing it was.
TEST(Checkpoint, EpochAndBestAreSavedTogetherOrNotAtAll) {
  const auto data = data::make_synthetic(48, 2);
  TempDir dir;
  TrainingRun r = make_run(data, 0, 1, 3);
  train::CheckpointSaver saver(dir / "ck", /*every=*/1, /*keep_last=*/5);
  train::CheckpointState st;
  st.epoch = 1;
  st.score = 0.5;
  ASSERT_EQ(saver.on_epoch_end(*r.engine, *r.opt, st, 3).size(), 2u);
  const std::string best = dir / "ck/best.safetensors", best_tmp = dir / "best-moved";
  fs::rename(best, best_tmp);
  fs::create_directory(best);  // best.safetensors cannot be replaced: the epoch's checkpoint must not be either
  st.epoch = 2;
  st.score = 0.7;
  EXPECT_THROW(saver.on_epoch_end(*r.engine, *r.opt, st, 3), Error);
  EXPECT_FALSE(fs::exists(dir.path / "ck/epoch-0002.safetensors"));
  EXPECT_EQ(st.best_test_acc, 0.5) << "the failed best is not recorded";
  std::vector<std::string> left;
  for (auto& e : fs::directory_iterator(dir.path / "ck")) left.push_back(e.path().filename().string());
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{".fanout.lock", "best.safetensors", "epoch-0001.safetensors"}))
      << "no temporaries";
  fs::remove(best);
  EXPECT_EQ(saver.on_epoch_end(*r.engine, *r.opt, st, 3).size(), 2u);
  EXPECT_EQ(st.best_test_acc, 0.7);
  EXPECT_EQ(io::load_safetensors(best).metadata.at("epoch"), "2");
}

// A resumed run whose best.safetensors is gone or cut short forgets the best score, so that the next
// evaluation writes the file again.
TEST(Checkpoint, AResumeWithoutAWholeBestForgetsItsScore) {
  const auto data = data::make_synthetic(48, 2);
  TempDir dir;
  TrainingRun r = make_run(data, 0, 1, 3);
  train::CheckpointSaver saver(dir / "ck", 1, 5);
  train::CheckpointState st;
  st.epoch = 1;
  st.score = 0.5;
  saver.on_epoch_end(*r.engine, *r.opt, st, 3);
  EXPECT_EQ(saver.forget_missing_best(st), "");
  EXPECT_EQ(st.best_test_acc, 0.5);
  const std::string best = dir / "ck/best.safetensors";
  fs::resize_file(best, fs::file_size(best) - 4);
  EXPECT_NE(saver.forget_missing_best(st).find(best + ": "), std::string::npos);
  EXPECT_EQ(st.best_test_acc, -1);
  fs::remove(best);
  st.best_test_acc = 0.5;
  EXPECT_EQ(saver.forget_missing_best(st), "no best.safetensors in " + (dir / "ck"));
  EXPECT_EQ(st.best_test_acc, -1);
  st.score = 0.1;  // any score now writes it
  EXPECT_EQ(saver.save_if_best(*r.engine, st), best);
}

// --overwrite's removal: every file or, naming the one that cannot go, none; one gone already counts as
// removed; the first save removes them when the caller has not.
TEST(Checkpoint, RemovingTheReplacedIsAllOrNothing) {
  const auto data = data::make_synthetic(48, 2);
  TempDir dir;
  TrainingRun r = make_run(data, 0, 1, 3);
  fs::create_directories(dir.path / "ck");
  std::vector<std::string> old;
  for (const char* name : {"epoch-0004.safetensors", "epoch-0005.safetensors", "best.safetensors"}) {
    old.push_back(dir / ("ck/" + std::string(name)));
    std::ofstream(old.back()) << "old run";
  }
  train::CheckpointSaver saver(dir / "ck", 1, 5);
  std::vector<std::string> with_bad = old;
  with_bad.insert(with_bad.begin() + 2, old[2] + "/x");  // under a file still there: cannot be renamed
  saver.replace(with_bad);  // the first two go aside, then come back
  EXPECT_EQ(testing::error_of([&] { saver.remove_replaced(); }),
            "cannot remove " + old[2] + "/x: Not a directory (nothing removed)");
  for (const std::string& f : old) EXPECT_TRUE(fs::exists(f)) << f;
  std::vector<std::string> with_gone = old;
  with_gone.push_back(dir / "ck/epoch-0009.safetensors");  // gone already: removed
  saver.replace(with_gone);
  EXPECT_EQ(saver.remove_replaced(), 3);
  for (const std::string& f : old) EXPECT_FALSE(fs::exists(f)) << f;
  const std::string other = dir / "ck/epoch-0007.safetensors";
  std::ofstream(other) << "old run";
  saver.replace({other});
  train::CheckpointState st;
  st.epoch = 1;
  st.score = 0.5;
  saver.on_epoch_end(*r.engine, *r.opt, st, 3);
  std::vector<std::string> left;
  for (auto& e : fs::directory_iterator(dir.path / "ck")) left.push_back(e.path().filename().string());
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{".fanout.lock", "best.safetensors", "epoch-0001.safetensors"}));
  // A folder by a checkpoint's name is the user's: never listed, so never replaced.
  fs::create_directories(dir.path / "ck/epoch-0003.safetensors");
  const auto listed = saver.checkpoints();
  EXPECT_EQ(std::count(listed.begin(), listed.end(), "epoch-0003.safetensors"), 0);
}

TEST(Checkpoint, ResumeDropsMetricsOfEpochsTrainedAgain) {
  TempDir dir;
  const std::string path = (dir.path / "m.jsonl").string();
  EXPECT_EQ(train::drop_metrics_after(path, 2), 0);  // no file yet
  EXPECT_FALSE(fs::exists(path));
  {
    std::ofstream f(path);
    f << "{\"epoch\": 1, \"test_acc\": 0.5}\n"
      << "not json\n"
      << "{\"epoch\": 2, \"test_acc\": 0.6}\n"
      << "{\"epoch\": 3, \"test_acc\": 0.7}\n"
      << "{\"epoch\": \"4\"}\n"  // not a metrics line: kept
      << "{\"epoch\": 4, \"test_acc\": 0.8}\n";
  }
  EXPECT_EQ(train::drop_metrics_after(path, 2), 2);
  std::ifstream f(path);
  std::stringstream got;
  got << f.rdbuf();
  EXPECT_EQ(got.str(), "{\"epoch\": 1, \"test_acc\": 0.5}\nnot json\n{\"epoch\": 2, \"test_acc\": 0.6}\n{\"epoch\": \"4\"}\n");
  EXPECT_EQ(train::drop_metrics_after(path, 2), 0);
}

TEST(Checkpoint, ResolveResumePathErrors) {
  TempDir dir;
  testing::expect_user_error([&] { train::resolve_resume_path(dir / "nope"); }, {"does not exist"});
  testing::expect_user_error([&] { train::resolve_resume_path(dir.path.string()); },
                             {"no epoch-NNNN.safetensors checkpoint"});
  std::ofstream(dir / "x.safetensors") << "x";
  EXPECT_EQ(train::resolve_resume_path(dir / "x.safetensors"), dir / "x.safetensors");
  testing::expect_user_error([&] { train::CheckpointSaver(dir / "x.safetensors", 1, 1); },
                             {"cannot create checkpoint directory"});
  testing::expect_user_error([&] { train::CheckpointSaver(dir / "d", 0, 1); }, {"checkpoints every N epochs need N of at least 1"});
  testing::expect_user_error([&] { train::CheckpointSaver(dir / "d", 1, 0); }, {"keeping the newest N checkpoints needs N of at least 1"});
}

// Only epoch-NNNN[-batch-BBBBBBB].safetensors names count as checkpoints, the
// newest by (epoch, batch); only NAME.tmp.DIGITS[.DIGITS] files are temporaries.
TEST(Checkpoint, FileNamesAreReadExactly) {
  TempDir dir;
  for (const char* name : {"epoch-0002.safetensors", "epoch-0002-batch-0000050.safetensors", "epoch-0001-batch-0000900.safetensors",
                           "epoch-0009.safetensors.tmp.123", "epoch-12x.safetensors", "epoch-0003-batch-.safetensors",
                           "epoch-0004.safetensorsx", "xepoch-0005.safetensors", "epoch-1234567890.safetensors",
                           "best.safetensors", "b.tmp.7x", "c.tmp.", "d.tmp.42", "e.tmp.42.977",
                           "f.tmp.42.", "g.tmp.42.9.9"})
    std::ofstream(dir / name) << "x";
  EXPECT_EQ(train::resolve_resume_path(dir.path.string()), dir / "epoch-0002-batch-0000050.safetensors");
  {
    train::SaveDirLock lock(dir.path.string());
    EXPECT_EQ(lock.removed_temporaries(), 3);
  }
  for (const char* gone : {"epoch-0009.safetensors.tmp.123", "d.tmp.42", "e.tmp.42.977"})
    EXPECT_FALSE(fs::exists(dir / gone)) << gone;
  for (const char* kept : {"b.tmp.7x", "c.tmp.", "epoch-12x.safetensors", "f.tmp.42.", "g.tmp.42.9.9"})
    EXPECT_TRUE(fs::exists(dir / kept)) << kept;
  std::ofstream(dir / "epoch-0002-batch-0000051.safetensors") << "x";
  EXPECT_EQ(train::resolve_resume_path(dir.path.string()), dir / "epoch-0002-batch-0000051.safetensors");
  std::ofstream(dir / "epoch-0003.safetensors") << "x";
  EXPECT_EQ(train::resolve_resume_path(dir.path.string()), dir / "epoch-0003.safetensors");
}

// A lock is one holder's: a second is refused with what the first wrote, and
// takes it once the first lets go; SaveDirLock says who holds a directory.
TEST(FileLock, RefusesASecondHolderAndNamesTheFirst) {
  TempDir dir;
  const std::string path = dir / "x.lock";
  FileLock first, second;
  ASSERT_EQ(first.take(path, "holder one\n"), 0);
  EXPECT_TRUE(first.held());
  std::string held_by;
  EXPECT_EQ(second.take(path, "holder two", &held_by), EWOULDBLOCK);
  EXPECT_EQ(held_by, "holder one");
  EXPECT_FALSE(second.held());
  first.release();
  EXPECT_EQ(second.take(path, "holder two"), 0);
  std::ifstream in(path);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), "holder two");
  EXPECT_EQ(first.take(dir / "missing/x.lock", "h"), ENOENT);

  train::SaveDirLock lock(dir.path.string());
  testing::expect_user_error([&] { train::SaveDirLock again(dir.path.string()); },
                             {"checkpoint directory", "is in use by another run (pid " + std::to_string(::getpid()) + ", since"});
}

}  // namespace
}  // namespace fanout
