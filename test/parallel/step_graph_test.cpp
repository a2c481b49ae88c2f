// CUDA graphs of training steps (runtime/parallel/step_graph.h): the
// policy's decisions over step keys, --cuda-graphs parsing, the host effects
// a captured step defers (BatchNorm's num_batches_tracked), the random draws
// that keep a model from being captured, and what the engines report on CPU
// devices. Replays themselves run on a GPU: test/cuda/graph_test.cpp.
#include <gtest/gtest.h>

#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cuda/target_batch.h"
#include "models/layers/batchnorm.h"
#include "models/layers/dropout.h"
#include "models/zoo/gpt.h"
#include "models/zoo/zoo.h"
#include "runtime/core/memory.h"
#include "runtime/core/error.h"
#include "runtime/core/graph.h"
#include "runtime/parallel/engine_factory.h"
#include "runtime/parallel/single_device.h"
#include "runtime/parallel/step_graph.h"
#include "support/test_util.h"
#include "support/trained.h"

namespace fanout {
namespace {

using Action = StepGraphPolicy::Action;

TEST(StepGraphPolicy, WarmsUpCapturesThenReplaysOneKey) {
  StepGraphPolicy p(true, "");
  bool drop = true;
  EXPECT_EQ(p.train_step("A", &drop), Action::Plain);  // the warm-up step
  EXPECT_FALSE(drop);
  EXPECT_FALSE(p.has_graph());
  EXPECT_EQ(p.train_step("A", &drop), Action::Capture);
  p.captured(true, "");
  EXPECT_TRUE(p.has_graph());
  for (int i = 0; i < 3; ++i) EXPECT_EQ(p.train_step("A", &drop), Action::Replay);
  EXPECT_FALSE(drop);
  const GraphStats& s = p.stats();
  EXPECT_TRUE(s.on);
  EXPECT_EQ(s.captures, 1);
  EXPECT_EQ(s.replays, 3);
  EXPECT_EQ(s.plain, 1);
  EXPECT_TRUE(s.off_reason.empty());
}

TEST(StepGraphPolicy, AnotherKeyRunsPlainDropsTheGraphAndWarmsUpAgain) {
  StepGraphPolicy p(true, "");
  bool drop = false;
  p.train_step("full", &drop);
  ASSERT_EQ(p.train_step("full", &drop), Action::Capture);
  p.captured(true, "");
  // The last smaller batch of an epoch: plain, and the graph goes (its buffers may move).
  EXPECT_EQ(p.train_step("last", &drop), Action::Plain);
  EXPECT_TRUE(drop);
  EXPECT_FALSE(p.has_graph());
  // The next epoch's full batches warm up and capture again.
  EXPECT_EQ(p.train_step("full", &drop), Action::Plain);
  EXPECT_FALSE(drop);
  EXPECT_EQ(p.train_step("full", &drop), Action::Capture);
  p.captured(true, "");
  EXPECT_EQ(p.train_step("full", &drop), Action::Replay);
  EXPECT_EQ(p.stats().captures, 2);
  EXPECT_EQ(p.stats().replays, 1);
  EXPECT_EQ(p.stats().plain, 3);
}

TEST(StepGraphPolicy, KeysThatAlternateNeverCapture) {
  StepGraphPolicy p(true, "");
  bool drop = false;
  for (int i = 0; i < 6; ++i) EXPECT_EQ(p.train_step(i % 2 ? "A" : "B", &drop), Action::Plain);
  EXPECT_EQ(p.stats().captures, 0);
  EXPECT_EQ(p.stats().plain, 6);
}

TEST(StepGraphPolicy, AnEvaluationDropsTheGraphAndTheWarmUp) {
  StepGraphPolicy p(true, "");
  bool drop = false;
  p.train_step("A", &drop);
  EXPECT_FALSE(p.other_pass());  // nothing captured yet, but the warm-up is gone
  EXPECT_EQ(p.train_step("A", &drop), Action::Plain);
  EXPECT_EQ(p.train_step("A", &drop), Action::Capture);
  p.captured(true, "");
  EXPECT_TRUE(p.other_pass());
  EXPECT_FALSE(p.has_graph());
  EXPECT_EQ(p.train_step("A", &drop), Action::Plain);
  EXPECT_FALSE(drop);  // other_pass dropped it already
}

TEST(StepGraphPolicy, AFailedCaptureTurnsGraphsOffForGood) {
  StepGraphPolicy p(true, "");
  bool drop = false;
  p.train_step("A", &drop);
  ASSERT_EQ(p.train_step("A", &drop), Action::Capture);
  p.captured(false, "cudaErrorStreamCaptureUnsupported");
  EXPECT_FALSE(p.has_graph());
  EXPECT_FALSE(p.stats().on);
  EXPECT_EQ(p.stats().off_reason, "cudaErrorStreamCaptureUnsupported");
  for (int i = 0; i < 4; ++i) EXPECT_EQ(p.train_step("A", &drop), Action::Plain);
  EXPECT_EQ(p.stats().captures, 0);
  EXPECT_EQ(p.stats().plain, 6);  // the warm-up, the failed capture's plain rerun, four more
}

TEST(StepGraphPolicy, OffFromTheStartOrTurnedOff) {
  StepGraphPolicy off(false, "--cuda-graphs off");
  bool drop = false;
  for (int i = 0; i < 3; ++i) EXPECT_EQ(off.train_step("A", &drop), Action::Plain);
  EXPECT_FALSE(off.stats().on);
  EXPECT_EQ(off.stats().off_reason, "--cuda-graphs off");
  StepGraphPolicy p(true, "");
  p.train_step("A", &drop);
  p.turn_off("dropout");
  EXPECT_EQ(p.train_step("A", &drop), Action::Plain);
  EXPECT_EQ(p.stats().off_reason, "dropout");
}

TEST(CudaGraphsOption, ParsesAutoOffAndCheck) {
  EXPECT_EQ(parse_cuda_graphs("auto"), CudaGraphs::Auto);
  EXPECT_EQ(parse_cuda_graphs("off"), CudaGraphs::Off);
  EXPECT_EQ(parse_cuda_graphs("check"), CudaGraphs::Check);
  EXPECT_STREQ(cuda_graphs_name(CudaGraphs::Auto), "auto");
  for (const char* bad : {"on", "", "Auto", "true"}) {
    try {
      parse_cuda_graphs(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--cuda-graphs takes auto, off or check"), std::string::npos) << e.what();
    }
  }
}

TEST(StepGraphKey, NamesShapesTypesTheScaleAndTheArenas) {
  Tensor x = Tensor::zeros(Shape{4, 3}), y = Tensor::zeros(Shape{4}, DType::I32);
  int a = 0, b = 0;
  const std::string k = step_graph_key(x, y, 0.25f, {&a});
  EXPECT_EQ(k, step_graph_key(x, y, 0.25f, {&a}));
  EXPECT_NE(k, step_graph_key(Tensor::zeros(Shape{3, 3}), y, 0.25f, {&a}));
  EXPECT_NE(k, step_graph_key(x, Tensor::zeros(Shape{4}), 0.25f, {&a}));
  EXPECT_NE(k, step_graph_key(x, y, 0.5f, {&a}));  // 16-mixed's loss scale changed
  EXPECT_NE(k, step_graph_key(x, y, 0.25f, {&b}));  // an arena replaced
}

TEST(StreamGraph, CpuStreamsHaveNoGraphs) {
  Stream s(Device::cpu());
  StreamGraph g;
  EXPECT_THROW(g.begin(s), Error);
  EXPECT_FALSE(g.capturing());
  EXPECT_FALSE(g.ready());
}

TEST(HostEffects, RunAtOnceOrAfterTheCapturedStep) {
  Context ctx(Device::cpu());
  int n = 0;
  ctx.host_effect([&] { ++n; });
  EXPECT_EQ(n, 1);
  std::vector<std::function<void()>> kept;
  ctx.captured_effects = &kept;
  ctx.host_effect([&] { n += 10; });
  EXPECT_EQ(n, 1);
  ASSERT_EQ(kept.size(), 1u);
  kept[0]();
  EXPECT_EQ(n, 11);
}

// BatchNorm counts its training batches on the host: inside a capture the
// count moves only when the kept effect runs (once per launch of the graph).
TEST(HostEffects, BatchNormCountsBatchesThroughThem) {
  Context ctx(Device::cpu());
  models::BatchNorm2d bn(3);
  bn.materialize(Device::cpu());
  bn.init(5);
  std::mt19937_64 rng(5);
  bn.train(true);
  const Tensor x = testing::random_tensor(Shape{4, 3, 2, 2}, rng);
  bn.forward(x, ctx);
  EXPECT_EQ(bn.num_batches_tracked(), 1);
  std::vector<std::function<void()>> kept;
  ctx.captured_effects = &kept;
  bn.forward(x, ctx);
  ctx.captured_effects = nullptr;
  EXPECT_EQ(bn.num_batches_tracked(), 1);
  ASSERT_EQ(kept.size(), 1u);
  for (int replay = 0; replay < 3; ++replay)
    for (auto& fn : kept) fn();
  EXPECT_EQ(bn.num_batches_tracked(), 4);
  bn.train(false);
  bn.forward(x, ctx);  // evaluation counts nothing
  EXPECT_EQ(bn.num_batches_tracked(), 4);
}

TEST(RandomDraws, DropoutCountsTheKeysItDraws) {
  Context ctx(Device::cpu());
  std::mt19937_64 rng(6);
  const Tensor x = testing::random_tensor(Shape{4, 8}, rng);
  models::Dropout off(0.0f), on(0.3f);
  off.materialize(Device::cpu());
  on.materialize(Device::cpu());
  ctx.training = true;
  off.train(true);
  on.train(true);
  off.forward(x, ctx);
  EXPECT_EQ(ctx.random_draws, 0u);
  on.forward(x, ctx);
  EXPECT_EQ(ctx.random_draws, 1u);
  on.train(false);
  ctx.training = false;
  on.forward(x, ctx);
  EXPECT_EQ(ctx.random_draws, 1u);
}

// On CPU devices the plain engine and DataParallel train as before and say
// graphs are off and why.
TEST(EngineGraphStats, CpuEnginesRunPlainLaunchesAndSayWhy) {
  std::mt19937_64 rng(7);
  auto model = models::make_model("mlp", Shape{1, 4, 4}, 5, 3);
  EngineSpec spec;
  spec.devices = {Device::cpu()};
  auto engine = make_engine(*model, std::move(spec));
  const Tensor x = testing::random_tensor(Shape{6, 1, 4, 4}, rng);
  const Tensor y = testing::random_labels(6, 5, rng);
  for (int i = 0; i < 3; ++i) engine->forward_backward_batch(x, y);
  const GraphStats g = engine->graph_stats();
  EXPECT_FALSE(g.on);
  EXPECT_EQ(g.captures, 0);
  EXPECT_EQ(g.replays, 0);
  EXPECT_EQ(g.plain, 3);
  EXPECT_EQ(g.off_reason, "CPU devices have no CUDA graphs");

  auto dp_model = models::make_model("mlp", Shape{1, 4, 4}, 5, 3);
  EngineSpec dp;
  dp.devices = parse_devices("cpu:2");
  auto dp_engine = make_engine(*dp_model, std::move(dp));
  dp_engine->forward_backward_batch(x, y);
  EXPECT_FALSE(dp_engine->graph_stats().on);
  EXPECT_EQ(dp_engine->graph_stats().off_reason, "CPU devices have no CUDA graphs");
}

// --cuda-graphs check on CPU devices: the plain engine and DataParallel run
// the steps a GPU would capture and replay under the capture check, with a
// graph's bookkeeping (BatchNorm's count after the step, DataParallel's
// gradient notices after the whole backward), and train bit for bit as
// with graphs off, through a smaller batch and an evaluation.
void check_mode_matches_off(const std::string& devices, const std::string& model, const Shape& sample) {
  SCOPED_TRACE(model + " on " + devices);
  std::mt19937_64 rng(21);
  const cudatest::TargetBatch b = cudatest::make_batch(model, sample, 8, rng);
  auto run = [&](CudaGraphs g) {
    EngineSpec spec;
    spec.devices = parse_devices(devices);
    spec.loss = b.loss;
    spec.cuda_graphs = g;
    auto m = models::make_model(model, sample, b.classes, 5);
    auto* raw = m.release();
    return std::make_pair(std::unique_ptr<Module>(raw), testing::EngineRun(make_engine(*raw, std::move(spec))));
  };
  auto [mc, check] = run(CudaGraphs::Check);
  auto [mo, off] = run(CudaGraphs::Off);
  const Tensor xs = b.x.slice(0, 7), ys = b.y.slice(0, 7);
  auto steps = [&](const Tensor& x, const Tensor& y, int n) {
    for (int i = 0; i < n; ++i) EXPECT_EQ(check.train_step(x, y, 0.02f).loss_sum, off.train_step(x, y, 0.02f).loss_sum);
  };
  steps(b.x, b.y, 5);
  GraphStats s = check->graph_stats();
  EXPECT_TRUE(s.on) << s.off_reason;
  EXPECT_EQ(s.captures, 1);
  EXPECT_EQ(s.replays, 3);
  steps(xs, ys, 1);
  steps(b.x, b.y, 3);
  // An evaluation on a batch of its own, which training must leave alone
  // (a replica's chunk may be a view of it).
  const cudatest::TargetBatch e = cudatest::make_batch(model, sample, 8, rng);
  const Tensor e_before = e.x.to(Device::cpu());
  EXPECT_EQ(check->eval_step(e.x, e.y).loss_sum, off->eval_step(e.x, e.y).loss_sum);
  steps(b.x, b.y, 3);
  EXPECT_TRUE(testing::same_bits(e.x, e_before)) << "training wrote into the evaluation batch";
  EXPECT_EQ(check->eval_step(e.x, e.y).loss_sum, off->eval_step(e.x, e.y).loss_sum);
  s = check->graph_stats();
  EXPECT_EQ(s.captures, 3);
  EXPECT_EQ(s.replays, 5);
  EXPECT_FALSE(off->graph_stats().on);
  EXPECT_TRUE(testing::same_bits(mc->arenas().params, mo->arenas().params));
  EXPECT_TRUE(testing::same_bits(mc->arenas().buffers, mo->arenas().buffers));
  auto bc = mc->named_buffers(), bo = mo->named_buffers();
  for (size_t i = 0; i < bc.size(); ++i)
    if (bc[i].second->dtype == DType::I64)
      EXPECT_EQ(bc[i].second->value.data<int64_t>()[0], bo[i].second->value.data<int64_t>()[0]) << bc[i].first;
}

TEST(CudaGraphsCheck, EnginesTrainAsWithGraphsOff) {
  check_mode_matches_off("cpu", "cnn", Shape{3, 16, 16});
  check_mode_matches_off("cpu:2", "cnn", Shape{3, 16, 16});
  check_mode_matches_off("cpu:2", "resnet18", Shape{3, 16, 16});
  check_mode_matches_off("cpu:2", "heatmap3d", Shape{1, 8, 8, 8});
}

// Scratch that a context grows on another thread (a sharded optimizer's norm
// runs on the main thread with each replica's context) moves what a captured
// step points at: the next step warms up and captures again, never replays.
TEST(CudaGraphsCheck, ScratchGrownOnAnotherThreadWarmsUpAgain) {
  Context ctx(Device::cpu());
  StepGraphs graphs(CudaGraphs::Check, ctx.device(), "");
  int runs = 0;
  const std::function<void()> work = [&] { ++runs; };
  for (int i = 0; i < 4; ++i) graphs.train_step(ctx, "A", work);  // warm-up, capture, two replays
  EXPECT_EQ(graphs.stats().captures, 1);
  std::thread([&] { ctx.workspace(size_t{1} << 20); }).join();
  graphs.train_step(ctx, "A", work);  // warm-up again
  graphs.train_step(ctx, "A", work);  // a new capture
  EXPECT_EQ(graphs.stats().captures, 2);
  EXPECT_TRUE(graphs.stats().on);
}

// A step that frees memory while it is captured is not captured: the pool
// would hand the memory out again while the graph still writes it.
TEST(CudaGraphsCheck, AStepThatFreesMemoryIsNotCaptured) {
  Context ctx(Device::cpu());
  StepGraphs graphs(CudaGraphs::Check, ctx.device(), "");
  std::vector<Tensor> held;
  const std::function<void()> work = [&] { held.clear(); };
  for (int i = 0; i < 3; ++i) {
    held.push_back(Tensor::empty(Shape{16}));
    graphs.train_step(ctx, "A", work);
  }
  EXPECT_EQ(graphs.stats().captures, 0);
  EXPECT_FALSE(graphs.stats().on);
  EXPECT_NE(graphs.stats().off_reason.find("freed memory while it was captured"), std::string::npos)
      << graphs.stats().off_reason;
}

// A model with dropout is never captured, in check mode too, and says why.
TEST(CudaGraphsCheck, DropoutKeepsStepsPlain) {
  const models::GPTConfig c{.block_size = 8, .vocab_size = 20, .n_layer = 1, .n_head = 2, .n_embd = 8,
                            .dropout = 0.2f};
  auto m = models::gpt(c, 3);
  EngineSpec spec;
  spec.devices = parse_devices("cpu:2");
  spec.loss.criterion = CriterionKind::TokenCrossEntropy;
  spec.cuda_graphs = CudaGraphs::Check;
  testing::EngineRun e(make_engine(*m, std::move(spec)));
  Tensor x = Tensor::zeros(Shape{4, 8}, DType::I32), y = Tensor::zeros(Shape{4, 8}, DType::I32);
  for (int64_t i = 0; i < x.numel(); ++i) {
    x.data<int32_t>()[i] = static_cast<int32_t>((7 * i) % 20);
    y.data<int32_t>()[i] = static_cast<int32_t>((3 * i + 1) % 20);
  }
  for (int i = 0; i < 3; ++i) e.train_step(x, y, 0.02f);
  const GraphStats s = e->graph_stats();
  EXPECT_FALSE(s.on);
  EXPECT_EQ(s.captures, 0);
  EXPECT_NE(s.off_reason.find("Dropout"), std::string::npos) << s.off_reason;
}

// SyncBatchNorm all-reduces inside the forward: DataParallel keeps such steps plain.
TEST(CudaGraphsCheck, SyncBatchNormKeepsStepsPlain) {
  auto m = models::make_model("cnn", Shape{3, 16, 16}, 10, 5);
  EngineSpec spec;
  spec.devices = parse_devices("cpu:2");
  spec.dp.sync_bn = true;
  spec.cuda_graphs = CudaGraphs::Check;
  auto e = make_engine(*m, std::move(spec));
  EXPECT_FALSE(e->graph_stats().on);
  EXPECT_NE(e->graph_stats().off_reason.find("SyncBatchNorm"), std::string::npos);
}

TEST(CaptureCheck, HostSynchronizationsAndAllocationsThrowInside) {
  Stream s(Device::cpu());
  Event e(Device::cpu());
  s.synchronize();  // outside: fine
  {
    CaptureCheck check;
    EXPECT_TRUE(capture_checked());
    try {
      s.synchronize();
      ADD_FAILURE() << "a synchronization passed";
    } catch (const Error& err) {
      EXPECT_NE(std::string(err.what()).find("a stream synchronization inside a captured training step"),
                std::string::npos)
          << err.what();
    }
    EXPECT_THROW(e.synchronize(), Error);
    EXPECT_THROW(Tensor::empty(Shape{4}), Error);
    EXPECT_THROW(Tensor::empty_pinned(Shape{4}, DType::F32), Error);
  }
  EXPECT_FALSE(capture_checked());
  EXPECT_EQ(Tensor::empty(Shape{4}).numel(), 4);
}

// The step the plain engine captures (model forward, loss, backward; the
// inputs staged before it) of every zoo model and a GPT, warm, run under
// CaptureCheck on the CPU: no layer synchronizes or allocates inside it, so
// on a GPU the capture cannot break for those reasons. The checked step's
// loss and gradients are the plain step's, bit for bit.
void check_capturable(Module& model, const Tensor& x, const Tensor& y, const Criterion& proto, DType autocast) {
  Context ctx(Device::cpu(), 3);
  ctx.math.autocast = autocast;
  ctx.math.cpu_threads = 1;
  auto crit = proto.clone();
  model.train(true);
  ctx.training = true;
  auto step = [&] {
    Tensor out = model.forward(x, ctx);
    crit->forward(ctx, out, y, true, 0.125f);
    Module::backward_of(model, "model", crit->grad(), ctx);
  };
  {
    CaptureCheck cold;  // a cold step sizes its buffers: the check sees that
    EXPECT_THROW(step(), Error);
  }
  for (int warm = 0; warm < 2; ++warm) step();
  model.zero_grad();
  step();
  const Tensor plain_grads = model.arenas().grads.to(Device::cpu());
  const double plain_loss = crit->read(ctx).loss_sum;
  model.zero_grad();
  const uint64_t allocs = alloc_stats().host_allocs;
  {
    CaptureCheck check;
    step();
  }
  EXPECT_EQ(alloc_stats().host_allocs, allocs);
  EXPECT_EQ(crit->read(ctx).loss_sum, plain_loss);
  EXPECT_TRUE(testing::same_bits(model.arenas().grads, plain_grads));
}

TEST(CaptureCheck, EveryZooModelAndAGptStepIsCapturable) {
  for (DType autocast : {DType::F32, DType::BF16}) {
    for (const auto& z : cudatest::kImageZoo) {
      SCOPED_TRACE(std::string(z.model) + " " + dtype_name(autocast));
      std::mt19937_64 rng(9);
      const cudatest::TargetBatch b = cudatest::make_batch(z.model, z.sample, 4, rng);
      auto m = models::make_model(z.model, z.sample, b.classes, 2);
      check_capturable(*m, b.x, b.y, *make_criterion(b.loss), autocast);
    }
    for (bool ckpt : {false, true}) {
      SCOPED_TRACE(std::string("gpt") + (ckpt ? " checkpointed " : " ") + dtype_name(autocast));
      const models::GPTConfig c{.block_size = 16, .vocab_size = 40, .n_layer = 2, .n_head = 2, .n_embd = 16,
                                .dropout = 0.0f};
      auto m = models::gpt(c, 3, ckpt);
      std::mt19937_64 rng(10);
      Tensor x = Tensor::empty(Shape{2, 16}, DType::I32), y = Tensor::empty(Shape{2, 16}, DType::I32);
      for (int64_t i = 0; i < x.numel(); ++i) {
        x.data<int32_t>()[i] = static_cast<int32_t>(rng() % 40);
        y.data<int32_t>()[i] = static_cast<int32_t>(rng() % 40);
      }
      LossOptions loss;
      loss.criterion = CriterionKind::TokenCrossEntropy;
      check_capturable(*m, x, y, *make_criterion(loss), autocast);
    }
  }
}

}  // namespace
}  // namespace fanout
