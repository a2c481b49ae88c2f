// CUDA graphs of training steps (runtime/parallel/step_graph.h) on cuda:0:
// steps replayed from a graph give the bits that plain launches give (the
// same kernels on the same buffers; deterministic cuDNN algorithms), for
// CNNs with BatchNorm (its running statistics and num_batches_tracked, a
// host effect) and a GPT, in float32 and bf16-mixed; a smaller last batch
// runs plain and the next equal steps capture again; a model with dropout
// is not captured and says why; a warm replayed step allocates nothing;
// DataParallel over 0,0 replays each replica's step (its buckets reduced
// after the replay) with the bits of plain launches.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>

#include "cuda/cuda_test_util.h"
#include "cuda/target_batch.h"
#include "models/zoo/gpt.h"
#include "models/zoo/zoo.h"
#include "runtime/core/memory.h"
#include "runtime/parallel/engine_factory.h"
#include "runtime/parallel/single_device.h"
#include "support/trained.h"

namespace fanout {
namespace {

using cudatest::gpu;

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// Parameters, gradients' arena and buffers (BatchNorm's running statistics)
// of two models on cuda:0, bit for bit, and every host buffer (num_batches_tracked).
void expect_same_state(Engine& a, Engine& b, const std::string& when) {
  SCOPED_TRACE(when);
  a.primary_context().compute().synchronize();
  b.primary_context().compute().synchronize();
  Module &ma = a.model(), &mb = b.model();
  EXPECT_TRUE(same_bits(ma.arenas().params.to(Device::cpu()), mb.arenas().params.to(Device::cpu()))) << "parameters";
  if (ma.arenas().buffers.numel() > 0)
    EXPECT_TRUE(same_bits(ma.arenas().buffers.to(Device::cpu()), mb.arenas().buffers.to(Device::cpu())))
        << "buffers";
  auto na = ma.named_buffers(), nb = mb.named_buffers();
  ASSERT_EQ(na.size(), nb.size());
  for (size_t i = 0; i < na.size(); ++i)
    if (na[i].second->dtype == DType::I64)
      EXPECT_EQ(na[i].second->value.data<int64_t>()[0], nb[i].second->value.data<int64_t>()[0]) << na[i].first;
}

using Run = testing::Trained<SingleDeviceEngine>;

// Steps of (x, y) on both engines: the losses bit for bit.
void steps(Run& graphs, Run& plain, const Tensor& x, const Tensor& y, int n, const std::string& what) {
  for (int i = 0; i < n; ++i) {
    const StepResult rg = graphs.train_step(x, y, 0.02f), rp = plain.train_step(x, y, 0.02f);
    EXPECT_EQ(rg.loss_sum, rp.loss_sum) << what << " step " << i;
    EXPECT_EQ(rg.count, rp.count);
  }
}

void check_replays(const std::string& model, const Shape& sample, int64_t batch, DType autocast) {
  SCOPED_TRACE(model + (autocast == DType::F32 ? " float32" : " mixed"));
  std::mt19937_64 rng(11);
  const cudatest::TargetBatch b = cudatest::make_batch(model, sample, batch, rng);
  auto mg = models::make_model(model, sample, b.classes, 4), mp = models::make_model(model, sample, b.classes, 4);
  MathOptions math;
  math.deterministic = true;  // cuDNN algorithms that give the same bits each run
  math.autocast = autocast;
  Run g(*mg, gpu(), *make_criterion(b.loss), 4, math, CudaGraphs::Auto);
  Run p(*mp, gpu(), *make_criterion(b.loss), 4, math, CudaGraphs::Off);
  steps(g, p, b.x, b.y, 5, "full batch");
  GraphStats s = g.graph_stats();
  EXPECT_TRUE(s.on) << s.off_reason;
  EXPECT_EQ(s.captures, 1);
  EXPECT_EQ(s.replays, 3);
  EXPECT_EQ(s.plain, 1);
  EXPECT_FALSE(p.graph_stats().on);
  EXPECT_EQ(p.graph_stats().off_reason, "--cuda-graphs off");
  expect_same_state(g, p, "after five full steps");
  // The last, smaller batch: plain; then the full batches capture again.
  const Tensor xs = b.x.slice(0, batch - 1), ys = b.y.slice(0, batch - 1);
  steps(g, p, xs, ys, 1, "smaller batch");
  steps(g, p, b.x, b.y, 4, "full batch again");
  s = g.graph_stats();
  EXPECT_EQ(s.captures, 2);
  EXPECT_EQ(s.replays, 5);
  EXPECT_EQ(s.plain, 3);
  expect_same_state(g, p, "after ten steps");
  // An evaluation in between drops the graph; training resumes plain.
  EXPECT_EQ(g.eval_step(b.x, b.y).loss_sum, p.eval_step(b.x, b.y).loss_sum);
  steps(g, p, b.x, b.y, 3, "after an evaluation");
  EXPECT_EQ(g.graph_stats().captures, 3);
  expect_same_state(g, p, "at the end");
  // A warm replayed step allocates nothing on the device.
  const uint64_t before = alloc_stats().device_allocs;
  steps(g, p, b.x, b.y, 2, "warm");
  EXPECT_EQ(alloc_stats().device_allocs, before);
}

TEST(CudaGraphs, ReplayedCnnStepsAreThePlainOnes) {
  FANOUT_SKIP_WITHOUT_GPU();
  check_replays("lenet", Shape{1, 28, 28}, 16, DType::F32);
  check_replays("cnn", Shape{1, 28, 28}, 16, DType::F32);
  check_replays("resnet18", Shape{3, 16, 16}, 8, DType::F32);
}

TEST(CudaGraphs, ReplayedMixedPrecisionStepsAreThePlainOnes) {
  FANOUT_SKIP_WITHOUT_GPU();
  check_replays("cnn", Shape{1, 28, 28}, 16, DType::BF16);
  check_replays("resnet18", Shape{3, 16, 16}, 8, DType::BF16);
}

Tensor ids(int64_t b, int64_t t, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Tensor x = Tensor::empty(Shape{b, t}, DType::I32);
  for (int64_t i = 0; i < x.numel(); ++i) x.data<int32_t>()[i] = static_cast<int32_t>(rng() % 50);
  return x;
}

// A GPT (embedding, LayerNorm, attention, GELU, the tied head, the token
// loss): replayed without dropout; with dropout it is never captured.
void check_gpt(float dropout, DType autocast) {
  SCOPED_TRACE("dropout " + std::to_string(dropout));
  const models::GPTConfig c{.block_size = 32, .vocab_size = 50, .n_layer = 2, .n_head = 4, .n_embd = 64,
                            .dropout = dropout};
  auto mg = models::gpt(c, 3), mp = models::gpt(c, 3);
  LossOptions loss;
  loss.criterion = CriterionKind::TokenCrossEntropy;
  MathOptions math;
  math.deterministic = true;
  math.autocast = autocast;
  Run g(*mg, gpu(), *make_criterion(loss), 4, math, CudaGraphs::Auto);
  Run p(*mp, gpu(), *make_criterion(loss), 4, math, CudaGraphs::Off);
  g.set_optimizer(testing::test_adamw());
  p.set_optimizer(testing::test_adamw());
  const Tensor x = ids(4, 32, 5), y = ids(4, 32, 6);
  steps(g, p, x, y, 5, "gpt");
  expect_same_state(g, p, "gpt after five steps");
  const GraphStats s = g.graph_stats();
  if (dropout == 0.0f) {
    EXPECT_TRUE(s.on) << s.off_reason;
    EXPECT_EQ(s.captures, 1);
    EXPECT_EQ(s.replays, 3);
  } else {
    EXPECT_FALSE(s.on);
    EXPECT_EQ(s.captures, 0);
    EXPECT_EQ(s.plain, 5);
    EXPECT_NE(s.off_reason.find("Dropout"), std::string::npos) << s.off_reason;
  }
}

TEST(CudaGraphs, ReplayedGptStepsAreThePlainOnes) {
  FANOUT_SKIP_WITHOUT_GPU();
  check_gpt(0.0f, DType::F32);
  check_gpt(0.0f, DType::BF16);
}

TEST(CudaGraphs, AModelWithDropoutRunsPlainLaunches) {
  FANOUT_SKIP_WITHOUT_GPU();
  check_gpt(0.1f, DType::F32);
}

// DataParallel over one GPU twice: each replica captures and replays its
// own step; the reductions follow each replay. Bit for bit the plain run.
void check_data_parallel(const std::string& model, const Shape& sample, DType autocast) {
  SCOPED_TRACE(model + " on 0,0");
  std::mt19937_64 rng(12);
  const cudatest::TargetBatch b = cudatest::make_batch(model, sample, 16, rng);
  auto make = [&](CudaGraphs g, std::unique_ptr<Module>& m) {
    m = models::make_model(model, sample, b.classes, 4);
    EngineSpec spec;
    spec.devices = parse_devices("0,0");
    spec.loss = b.loss;
    spec.dp.math.deterministic = true;
    spec.dp.math.autocast = autocast;
    spec.cuda_graphs = g;
    return testing::EngineRun(make_engine(*m, std::move(spec)));
  };
  std::unique_ptr<Module> mg, mp;
  testing::EngineRun g = make(CudaGraphs::Auto, mg), p = make(CudaGraphs::Off, mp);
  for (int i = 0; i < 6; ++i)
    EXPECT_EQ(g.train_step(b.x, b.y, 0.02f).loss_sum, p.train_step(b.x, b.y, 0.02f).loss_sum) << "step " << i;
  const GraphStats s = g->graph_stats();
  EXPECT_TRUE(s.on) << s.off_reason;
  EXPECT_EQ(s.captures, 1);
  EXPECT_EQ(s.replays, 4);
  expect_same_state(*g.engine, *p.engine, "DataParallel after six steps");
}

TEST(CudaGraphs, ReplayedDataParallelStepsAreThePlainOnes) {
  FANOUT_SKIP_WITHOUT_GPU();
  check_data_parallel("cnn", Shape{1, 28, 28}, DType::F32);
  check_data_parallel("resnet18", Shape{3, 16, 16}, DType::BF16);
}

}  // namespace
}  // namespace fanout
