// Single-device engine: a training step lowers the loss, matches the manual
// forward / backward / SGD sequence, and allocates nothing once warm.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "kernels/cpu/plan_count.h"
#include "models/zoo/zoo.h"
#include "runtime/core/error.h"
#include "runtime/data/loader.h"
#include "runtime/parallel/single_device.h"
#include "runtime/optim/clip.h"
#include "runtime/optim/sgd.h"
#include "support/test_util.h"
#include "support/trained.h"

namespace fanout {
namespace {

TEST(SingleDeviceEngine, LossFallsOnAFixedBatch) {
  auto model = models::make_model("mlp", Shape{3, 8, 8}, 10, 1);
  testing::Trained<SingleDeviceEngine> eng(*model, Device::cpu(), *make_criterion({}), 1);
  std::mt19937_64 rng(2);
  Tensor x = testing::random_tensor(Shape{16, 3, 8, 8}, rng);
  Tensor y = testing::random_labels(16, 10, rng);
  const double first = eng.train_step(x, y, 0.05f).loss_sum / 16;
  double last = first;
  for (int i = 0; i < 40; ++i) last = eng.train_step(x, y, 0.05f).loss_sum / 16;
  EXPECT_LT(last, 0.2 * first);
  EXPECT_EQ(eng.eval_step(x, y).sums[kCorrectSum].value(), 16);
}

// With every optimizer, parameter groups and clipping by norm.
class SteadyState : public ::testing::TestWithParam<const char*> {};
INSTANTIATE_TEST_SUITE_P(Optimizers, SteadyState, ::testing::Values("sgd", "adam", "adamw"));

TEST_P(SteadyState, TrainingStepAllocatesNothing) {
  auto data = data::make_synthetic(64, 3);
  auto model = models::make_model("cnn", data.train.sample_shape(), 10, 3);
  testing::Trained<SingleDeviceEngine> eng(*model, Device::cpu(), *make_criterion({}), 3);
  optim::OptimizerOptions o = testing::test_sgd();
  o.kind = optim::parse_optimizer(GetParam());
  if (o.kind != optim::OptimizerKind::SGD) o.momentum = 0;
  o.amsgrad = o.kind == optim::OptimizerKind::AdamW;
  o.no_decay_norm_bias = true;
  eng.set_optimizer(o);
  auto step = [&](const Tensor& bx, const Tensor& by) {
    eng.forward_backward_batch(bx, by);
    EXPECT_GT(optim::clip_grad_norm(eng.optimizer(), 0.5), 0.0);
    eng.optimizer().step();
    eng.optimizer().zero_grad();
  };
  data::LoaderOptions lo;
  lo.batch_size = 24;  // 24, 24, 16: a smaller last batch
  data::DataLoader loader(data.train, std::make_unique<data::RandomSampler>(data.train.size(), 3), lo);
  loader.start_epoch(0);
  Tensor x, y;
  std::vector<std::pair<Tensor, Tensor>> batches;
  while (loader.next(x, y)) batches.emplace_back(x.to(Device::cpu()), y.to(Device::cpu()));
  for (auto& [bx, by] : batches) step(bx, by);  // warm-up: every batch size seen
  const auto before = alloc_stats();
  const uint64_t plans = kernels::cpu::onednn_plans_made();
  for (int rep = 0; rep < 2; ++rep)
    for (auto& [bx, by] : batches) step(bx, by);
  const auto after = alloc_stats();
  EXPECT_EQ(after.host_allocs, before.host_allocs);
  EXPECT_EQ(after.device_allocs, before.device_allocs);
  EXPECT_EQ(kernels::cpu::onednn_plans_made(), plans) << "oneDNN primitives made after warm-up";
}

// Kernel threads: each replica's share of every core, or of OMP_NUM_THREADS
// when set; an explicit count wins; split-invariant math uses one.
TEST(CpuThreadsPerReplica, ShareTheCoresOrOmpNumThreads) {
  const char* saved = std::getenv("OMP_NUM_THREADS");
  const std::string keep = saved ? saved : "";
  const int cores = host_cores();
  ::unsetenv("OMP_NUM_THREADS");
  EXPECT_EQ(cpu_threads_per_replica(1, {}), cores);
  EXPECT_EQ(cpu_threads_per_replica(2, {}, 2), std::max(1, cores / 4));
  ::setenv("OMP_NUM_THREADS", "1", 1);
  EXPECT_EQ(kernel_thread_budget(), 1);
  EXPECT_EQ(cpu_threads_per_replica(1, {}), 1);
  ::setenv("OMP_NUM_THREADS", "100000", 1);
  EXPECT_EQ(kernel_thread_budget(), cores);  // at most the cores
  ::setenv("OMP_NUM_THREADS", "not a number", 1);
  EXPECT_EQ(kernel_thread_budget(), cores);
  MathOptions m;
  m.cpu_threads = 3;
  EXPECT_EQ(cpu_threads_per_replica(4, m), 3);
  MathOptions si;
  si.split_invariant = true;
  EXPECT_EQ(cpu_threads_per_replica(1, si), 1);
  if (saved) ::setenv("OMP_NUM_THREADS", keep.c_str(), 1);
  else ::unsetenv("OMP_NUM_THREADS");
}

TEST(SingleDeviceEngine, SplitInvariantSteadyStateAllocatesNothing) {
  auto model = models::make_model("lenet", Shape{1, 28, 28}, 10, 4);
  MathOptions math;
  math.split_invariant = true;
  testing::Trained<SingleDeviceEngine> eng(*model, Device::cpu(), *make_criterion({}), 4, math);
  EXPECT_EQ(model->grad_dtype(), DType::F64);
  std::mt19937_64 rng(5);
  Tensor x = testing::random_tensor(Shape{8, 1, 28, 28}, rng);
  Tensor y = testing::random_labels(8, 10, rng);
  eng.train_step(x, y, 0.01f);
  const auto before = alloc_stats();
  const uint64_t plans = kernels::cpu::onednn_plans_made();
  for (int i = 0; i < 3; ++i) eng.train_step(x, y, 0.01f);
  EXPECT_EQ(alloc_stats().host_allocs, before.host_allocs);
  EXPECT_EQ(kernels::cpu::onednn_plans_made(), plans);
}

// float64 gradients: parameters keep float views of the new arena, clones
// keep the dtype, and SGD steps with the gradients rounded to float once.
TEST(GradDtype, Float64GradientsCloneAndStepLikeTheirRoundedValues) {
  auto a = models::make_model("mlp", Shape{1, 4, 4}, 3, 6);
  auto b = a->clone(Device::cpu());
  a->set_grad_dtype(DType::F64);
  EXPECT_EQ(a->grad_dtype(), DType::F64);
  EXPECT_EQ(b->grad_dtype(), DType::F32);
  for (auto& [name, p] : a->named_parameters()) {
    EXPECT_EQ(p->grad.dtype(), DType::F64) << name;
    EXPECT_EQ(p->grad.data<double>(), a->arenas().grads.f64() + p->offset) << name;
  }
  EXPECT_EQ(a->clone(Device::cpu())->grad_dtype(), DType::F64);

  std::mt19937_64 rng(7);
  std::normal_distribution<double> nd;
  Tensor& g64 = a->arenas().grads;
  Tensor& g32 = b->arenas().grads;
  for (int64_t i = 0; i < g64.numel(); ++i) {
    g64.f64()[i] = nd(rng) * 1e-3;
    g32.f32()[i] = static_cast<float>(g64.f64()[i]);
  }
  optim::OptimizerOptions h;
  h.lr = 0.1f;
  h.momentum = 0.9f;
  h.weight_decay = 1e-3f;
  Context ctx(Device::cpu());
  optim::SGD sa(*a, ctx, h), sb(*b, ctx, h);
  for (int step = 0; step < 2; ++step) {
    sa.step();
    sb.step();
  }
  EXPECT_TRUE(testing::same_bits(a->arenas().params, b->arenas().params));
  EXPECT_FALSE(testing::same_bits(a->arenas().params, models::make_model("mlp", Shape{1, 4, 4}, 3, 6)->arenas().params));
  sa.zero_grad();
  for (int64_t i = 0; i < g64.numel(); ++i) ASSERT_EQ(g64.f64()[i], 0.0);
  EXPECT_THROW(a->set_grad_dtype(DType::I32), Error);
}

}  // namespace
}  // namespace fanout
