// Whole training steps on cuda:0 against the CPU: lenet, cnn, resnet18 and
// heatmap3d (MSE on dense targets) from the same initial parameters and batch
// agree after 1 and 3 SGD steps (TF32 off), and a warm training step
// allocates no device memory.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>

#include "cuda/cuda_test_util.h"
#include "models/zoo/zoo.h"
#include "runtime/core/memory.h"
#include "runtime/optim/clip.h"
#include "runtime/parallel/single_device.h"
#include "support/trained.h"

namespace fanout {
namespace {

using cudatest::close;
using cudatest::gpu;
using testing::random_labels;
using testing::random_tensor;

optim::OptimizerOptions sgd_hyper(float lr) {
  optim::OptimizerOptions h = testing::test_sgd();
  h.lr = lr;
  return h;
}

// Every parameter (and the float buffers: BatchNorm running statistics) of
// the CUDA model within rtol of the CPU model's.
void expect_close(const Tensor& got, const Tensor& want, double rtol, bool norm_only, const std::string& name) {
  if (!norm_only) {
    EXPECT_TRUE(close(got, want, rtol)) << name;
    return;
  }
  double d = 0;
  for (int64_t k = 0; k < want.numel(); ++k) d += std::pow(double(got.f32()[k]) - want.f32()[k], 2);
  EXPECT_LE(std::sqrt(d) / testing::l2_norm(want), rtol) << name;
}

// norm_only: each tensor compared by ||got - want|| / ||want|| instead of
// element by element.
void expect_same_state(Context& cuda_ctx, Module& cuda_model, Module& cpu_model, double rtol, int step,
                       bool norm_only = false) {
  SCOPED_TRACE(::testing::Message() << "after step " << step);
  // The engine moves the model and trains on its (non-blocking) compute
  // stream; plain copies run on the legacy stream, which does not wait for it.
  cuda_ctx.compute().synchronize();
  const Tensor got = cuda_model.arenas().params.to(Device::cpu());
  const Tensor want = cpu_model.arenas().params;
  auto gp = cuda_model.named_parameters();
  auto cp = cpu_model.named_parameters();
  ASSERT_EQ(gp.size(), cp.size());
  for (size_t i = 0; i < gp.size(); ++i) {
    ASSERT_EQ(gp[i].first, cp[i].first);
    const Parameter& p = *cp[i].second;
    const Tensor g = got.flat(p.offset, p.shape), w = want.flat(p.offset, p.shape);
    if (testing::l2_norm(w) == 0.0) {  // e.g. BatchNorm biases before the first step
      EXPECT_EQ(testing::l2_norm(g), 0.0) << cp[i].first;
      continue;
    }
    expect_close(g, w, rtol, norm_only, cp[i].first);
  }
  const Tensor gb = cuda_model.arenas().buffers.to(Device::cpu());
  const Tensor& cb = cpu_model.arenas().buffers;
  auto gbn = cuda_model.named_buffers();
  auto cbn = cpu_model.named_buffers();
  ASSERT_EQ(gbn.size(), cbn.size());
  for (size_t i = 0; i < cbn.size(); ++i) {
    const Buffer& b = *cbn[i].second;
    if (b.dtype != DType::F32) continue;
    const Tensor w = cb.flat(b.offset, b.shape);
    if (testing::l2_norm(w) == 0.0) continue;  // e.g. a running mean of exactly zero input
    expect_close(gb.flat(b.offset, b.shape), w, rtol, norm_only, cbn[i].first);
  }
}

// A batch of `batch` samples and its targets: class labels, or for a dense
// model (heatmap3d, 3 landmarks) heatmaps of the input's spatial shape.
struct TargetBatch {
  Tensor x, y;
  LossOptions loss;
  int classes = 10;
};
TargetBatch make_batch(const std::string& model, const Shape& sample, int64_t batch, std::mt19937_64& rng) {
  TargetBatch b;
  Shape xs = sample;
  xs.ndim = sample.ndim + 1;
  xs[0] = batch;
  for (int i = 0; i < sample.ndim; ++i) xs[i + 1] = sample[i];
  b.x = random_tensor(xs, rng);
  if (models::dense_output(model)) {
    b.classes = 3;
    b.loss.criterion = CriterionKind::Mse;
    Shape ys = xs;
    ys[1] = b.classes;
    b.y = testing::random_heatmaps(ys, rng);
  } else {
    b.y = random_labels(batch, b.classes, rng);
  }
  return b;
}

// After step 1 every element holds at 1e-3. BatchNorm over a batch of 2
// (resnet18 below: 8 values per channel in its last stage) amplifies float32
// rounding step by step, so `loose3` compares step 3 per tensor, by norm, at
// 5e-3.
// autocast BF16 or F16: both engines in that mixed mode, compared by norm
// at 8 u (u = the low type's unit roundoff): a sum the GPU adds in another
// order than the CPU may round to the neighbouring low-type value.
void check_training_matches_cpu(const std::string& model, const Shape& sample, int64_t batch, uint64_t seed,
                                bool loose3 = false, DType autocast = DType::F32) {
  SCOPED_TRACE(model);
  std::mt19937_64 rng(seed + 1);
  const TargetBatch b = make_batch(model, sample, batch, rng);
  const Tensor &x = b.x, &y = b.y;
  auto cpu_model = models::make_model(model, sample, b.classes, seed);
  auto cuda_model = models::make_model(model, sample, b.classes, seed);
  const float lr = 0.02f;
  MathOptions math;  // TF32 off, heuristics, any algorithm
  math.autocast = autocast;
  testing::Trained<SingleDeviceEngine> cpu_eng(*cpu_model, Device::cpu(), *make_criterion(b.loss), seed, math);
  cpu_eng.set_optimizer(sgd_hyper(lr));
  testing::Trained<SingleDeviceEngine> cuda_eng(*cuda_model, gpu(), *make_criterion(b.loss), seed, math);
  cuda_eng.set_optimizer(sgd_hyper(lr));
  expect_same_state(cuda_eng.primary_context(), *cuda_model, *cpu_model, 1e-6, 0);

  for (int step = 1; step <= 3; ++step) {
    const StepResult rc = cpu_eng.train_step(x, y, lr);
    const StepResult rg = cuda_eng.train_step(x, y, lr);
    EXPECT_NEAR(rg.loss_sum, rc.loss_sum, 1e-4 * std::max(1.0, std::abs(rc.loss_sum))) << "loss at step " << step;
    EXPECT_EQ(rg.count, rc.count);
    EXPECT_EQ(rg.sums[kPointsSum].value(), rc.sums[kPointsSum].value());  // planes with a target peak: the targets' alone
    const bool mixed = autocast != DType::F32;
    const double u = autocast == DType::F16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -9);
    if (mixed && (step == 1 || step == 3))
      expect_same_state(cuda_eng.primary_context(), *cuda_model, *cpu_model, 8 * u, step, true);
    else if (step == 1 || step == 3)
      expect_same_state(cuda_eng.primary_context(), *cuda_model, *cpu_model, step == 3 && loose3 ? 5e-3 : 1e-3, step,
                        step == 3 && loose3);  // 2.7e-3 by norm was seen on an H100
  }
  const StepResult ec = cpu_eng.eval_step(x, y), eg = cuda_eng.eval_step(x, y);
  EXPECT_NEAR(eg.loss_sum, ec.loss_sum, 1e-3 * std::max(1.0, std::abs(ec.loss_sum))) << "eval loss";
}

// One forward and backward from the same weights and batch, no update: the
// loss and each parameter's gradient on cuda:0 against the CPU's, by norm.
// Both sides sum in float32 in other orders; a healthy pair agrees to a few
// roundings times the net's conditioning (an input perturbed by 1e-7 moves
// these gradients by under 1e-5 on the CPU). Every tensor's difference is
// printed, so a miss shows the layer where the two part.
void check_gradients_match_cpu(const std::string& model, const Shape& sample, int64_t batch, uint64_t seed,
                               double rtol) {
  SCOPED_TRACE(model);
  std::mt19937_64 rng(seed + 1);
  const TargetBatch b = make_batch(model, sample, batch, rng);
  auto cpu_model = models::make_model(model, sample, b.classes, seed);
  auto cuda_model = models::make_model(model, sample, b.classes, seed);
  testing::Trained<SingleDeviceEngine> cpu_eng(*cpu_model, Device::cpu(), *make_criterion(b.loss), seed);
  testing::Trained<SingleDeviceEngine> cuda_eng(*cuda_model, gpu(), *make_criterion(b.loss), seed);
  const StepResult rc = cpu_eng.forward_backward_batch(b.x, b.y);
  const StepResult rg = cuda_eng.forward_backward_batch(b.x, b.y);
  cuda_eng.primary_context().compute().synchronize();
  EXPECT_NEAR(rg.loss_sum, rc.loss_sum, 1e-5 * std::max(1.0, std::abs(rc.loss_sum)));
  const Tensor gg = cuda_model->arenas().grads.to(Device::cpu()), gc = cpu_model->arenas().grads.to(Device::cpu());
  ASSERT_EQ(gg.dtype(), gc.dtype());
  for (const auto& [name, p] : cpu_model->named_parameters()) {
    const double rel = cudatest::slice_rel(gg, gc, p->offset, p->shape.numel());
    std::printf("%-10s grad %-28s |cuda - cpu| / |cpu| %.3g\n", model.c_str(), name.c_str(), rel);
    EXPECT_LE(rel, rtol) << name;
  }
}

// Relative difference by norm of each named slice of two host arenas;
// prints those above `print_above` and returns the largest.
template <class Named>
double worst_slice(const char* what, int step, const Named& named, const Tensor& got, const Tensor& want,
                   double print_above) {
  double worst = 0;
  for (const auto& [name, p] : named) {
    const double rel = cudatest::slice_rel(got, want, p->offset, p->shape.numel());
    if (rel > print_above) std::printf("step %d %-8s %-28s %.3g\n", step, what, name.c_str(), rel);
    worst = std::max(worst, rel);
  }
  return worst;
}

// Three SGD steps (momentum, weight decay) taken apart: before each update
// the gradients, after it the parameters, the momentum buffer and the
// BatchNorm statistics on cuda:0 against the CPU's, each by norm.
TEST(CudaTraining, EveryStepMatchesCpu) {
  FANOUT_SKIP_WITHOUT_GPU();
  for (const char* model : {"cnn", "lenet"}) {
    SCOPED_TRACE(model);
    std::mt19937_64 rng(14);
    const Shape sample{1, 28, 28};
    const TargetBatch b = make_batch(model, sample, 6, rng);
    auto mc = models::make_model(model, sample, b.classes, 13);
    auto mg = models::make_model(model, sample, b.classes, 13);
    testing::Trained<SingleDeviceEngine> ec(*mc, Device::cpu(), *make_criterion(b.loss), 13);
    testing::Trained<SingleDeviceEngine> eg(*mg, gpu(), *make_criterion(b.loss), 13);
    for (auto* e : {&ec, &eg}) e->set_optimizer(sgd_hyper(0.02f));
    for (int step = 1; step <= 3; ++step) {
      ec.forward_backward_batch(b.x, b.y);
      eg.forward_backward_batch(b.x, b.y);
      eg.primary_context().compute().synchronize();
      const auto np = mc->named_parameters();
      std::vector<std::pair<std::string, const Parameter*>> named(np.begin(), np.end());
      EXPECT_LE(worst_slice("grad", step, named, mg->arenas().grads.to(Device::cpu()), mc->arenas().grads, 1e-5),
                1e-4)
          << "gradients before update " << step;
      for (auto* e : {&ec, &eg}) {
        e->optimizer().set_lr(0.02f);
        e->optimizer().step();
      }
      eg.primary_context().compute().synchronize();
      EXPECT_LE(worst_slice("param", step, named, mg->arenas().params.to(Device::cpu()), mc->arenas().params, 1e-6),
                1e-5)
          << "parameters after update " << step;
      const auto sc = ec.optimizer().state(), sg = eg.optimizer().state();
      ASSERT_EQ(sc.size(), sg.size());
      for (size_t i = 0; i < sc.size(); ++i)
        EXPECT_LE(worst_slice(sc[i].first.c_str(), step, named, sg[i].second->to(Device::cpu()), *sc[i].second, 1e-5),
                  1e-4);
      const auto nb = mc->named_buffers();
      std::vector<std::pair<std::string, const Buffer*>> bufs;
      for (const auto& [n, bf] : nb)
        if (bf->dtype == DType::F32) bufs.emplace_back(n, bf);
      EXPECT_LE(worst_slice("buffer", step, bufs, mg->arenas().buffers.to(Device::cpu()), mc->arenas().buffers, 1e-6),
                1e-5);
      for (auto* e : {&ec, &eg}) e->optimizer().zero_grad();
    }
  }
}

TEST(CudaTraining, GradientsMatchCpu) {
  FANOUT_SKIP_WITHOUT_GPU();
  check_gradients_match_cpu("lenet", Shape{1, 28, 28}, 5, 11, 1e-4);
  check_gradients_match_cpu("cnn", Shape{1, 28, 28}, 6, 13, 1e-4);
  check_gradients_match_cpu("heatmap3d", Shape{1, 8, 12, 8}, 3, 14, 1e-4);
  check_gradients_match_cpu("resnet18", Shape{3, 16, 16}, 8, 12, 1e-4);
  // Resnet18StepsMatchCpu's batch: its first update missed by 1.5% on an H100.
  check_gradients_match_cpu("resnet18", Shape{3, 16, 16}, 2, 12, 1e-4);
}

TEST(CudaTraining, LenetStepsMatchCpu) {
  FANOUT_SKIP_WITHOUT_GPU();
  check_training_matches_cpu("lenet", Shape{1, 28, 28}, 5, 11);
}

TEST(CudaTraining, Resnet18StepsMatchCpu) {
  FANOUT_SKIP_WITHOUT_GPU();
  check_training_matches_cpu("resnet18", Shape{3, 16, 16}, 2, 12, true);
}

TEST(CudaTraining, CnnStepsMatchCpu) {
  FANOUT_SKIP_WITHOUT_GPU();
  check_training_matches_cpu("cnn", Shape{1, 28, 28}, 6, 13);
}

// Conv3d (cuDNN N-d), BatchNorm3d, MaxPool3d, Upsample3d and the MSE
// criterion with its heatmap metric, on volumes 8x12x8 with 3 landmarks.
TEST(CudaTraining, Heatmap3dStepsMatchCpu) {
  FANOUT_SKIP_WITHOUT_GPU();
  check_training_matches_cpu("heatmap3d", Shape{1, 8, 12, 8}, 3, 14, true);
}

// bf16-mixed: autocast's roundings (runtime/nn/autocast.h) on the GPU
// against the CPU's, for convolutions, BatchNorm, the residual add and the
// losses; 16-mixed on lenet.
TEST(CudaTraining, Resnet18Bf16MixedMatchesCpu) {
  FANOUT_SKIP_WITHOUT_GPU();
  check_training_matches_cpu("resnet18", Shape{3, 16, 16}, 4, 12, true, DType::BF16);
}

TEST(CudaTraining, Heatmap3dBf16MixedMatchesCpu) {
  FANOUT_SKIP_WITHOUT_GPU();
  check_training_matches_cpu("heatmap3d", Shape{1, 8, 12, 8}, 3, 14, true, DType::BF16);
}

TEST(CudaTraining, Lenet16MixedMatchesCpu) {
  FANOUT_SKIP_WITHOUT_GPU();
  check_training_matches_cpu("lenet", Shape{1, 28, 28}, 5, 11, false, DType::F16);
}

optim::OptimizerOptions adamw_amsgrad() { return testing::test_adamw(); }

// AdamW (amsgrad, two groups) with clipping by norm on cuda:0 against the
// CPU, from the same weights and batches: CUB's norm and the chunked update
// kernel against their CPU counterparts, 4 steps.
TEST(CudaTraining, AdamWWithClippingMatchesCpu) {
  FANOUT_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(21);
  const Shape sample{3, 16, 16};
  auto cpu_model = models::make_model("resnet18", sample, 10, 8);
  auto cuda_model = models::make_model("resnet18", sample, 10, 8);
  testing::Trained<SingleDeviceEngine> cpu_eng(*cpu_model, Device::cpu(), *make_criterion({}), 8);
  testing::Trained<SingleDeviceEngine> cuda_eng(*cuda_model, gpu(), *make_criterion({}), 8);
  cpu_eng.set_optimizer(adamw_amsgrad());
  cuda_eng.set_optimizer(adamw_amsgrad());
  for (int s = 0; s < 4; ++s) {
    const Tensor x = random_tensor(Shape{8, 3, 16, 16}, rng), y = random_labels(8, 10, rng);
    double norms[2];
    int k = 0;
    for (auto* e : {static_cast<Engine*>(&cpu_eng), static_cast<Engine*>(&cuda_eng)}) {
      optim::Optimizer& opt = e == &cpu_eng ? cpu_eng.optimizer() : cuda_eng.optimizer();
      e->forward_backward_batch(x, y);
      norms[k++] = optim::clip_grad_norm(opt, 0.5);
      opt.step();
      opt.zero_grad();
    }
    EXPECT_GT(norms[0], 0.5) << "clipping acts";
    EXPECT_NEAR(norms[1], norms[0], 1e-4 * norms[0]) << "step " << s;
  }
  const Tensor a = cpu_model->arenas().params.to(Device::cpu()), b = cuda_model->arenas().params.to(Device::cpu());
  EXPECT_LT(testing::max_rel_diff(b, a), 1e-3);
  const auto sa = cpu_eng.optimizer().state(), sb = cuda_eng.optimizer().state();
  ASSERT_EQ(sb.size(), 3u);
  for (size_t i = 0; i < sa.size(); ++i)
    EXPECT_LT(testing::max_rel_diff(sb[i].second->to(Device::cpu()), *sa[i].second), 1e-3) << sa[i].first;
}

// After warm-up, train and eval steps on cuda:0 allocate no device memory
// (workspace, cuDNN plans and layer outputs are all reused), with SGD and
// with AdamW plus clipping by norm (CUB's temporaries in the workspace).
void check_steady_state(const std::string& model, const Shape& sample, const MathOptions& math,
                        bool adamw = false) {
  SCOPED_TRACE(::testing::Message() << model << " benchmark " << math.cudnn_benchmark << " deterministic "
                                    << math.deterministic);
  std::mt19937_64 rng(6);
  const TargetBatch b = make_batch(model, sample, 4, rng);
  const Tensor &x = b.x, &y = b.y;
  auto m = models::make_model(model, sample, b.classes, 5);
  testing::Trained<SingleDeviceEngine> eng(*m, gpu(), *make_criterion(b.loss), 5, math);
  if (adamw) eng.set_optimizer(adamw_amsgrad());
  auto step = [&] {
    if (!adamw) return eng.train_step(x, y, 0.01f);
    StepResult r = eng.forward_backward_batch(x, y);
    optim::clip_grad_norm(eng.optimizer(), 0.5);
    eng.optimizer().step();
    eng.optimizer().zero_grad();
    return r;
  };
  for (int i = 0; i < 2; ++i) step();
  eng.eval_step(x, y);
  const AllocStats before = alloc_stats();
  for (int i = 0; i < 3; ++i) step();
  eng.eval_step(x, y);
  const AllocStats after = alloc_stats();
  EXPECT_EQ(after.device_allocs, before.device_allocs);
}

TEST(CudaTraining, SteadyStateAllocatesNothing) {
  FANOUT_SKIP_WITHOUT_GPU();
  MathOptions plain, bench, det;
  bench.cudnn_benchmark = true;
  det.deterministic = true;
  check_steady_state("resnet18", Shape{3, 16, 16}, plain);
  check_steady_state("resnet18", Shape{3, 16, 16}, bench);
  check_steady_state("lenet", Shape{1, 28, 28}, det);
  check_steady_state("heatmap3d", Shape{1, 8, 8, 8}, plain);
  check_steady_state("heatmap3d", Shape{1, 8, 8, 8}, bench);
  check_steady_state("resnet18", Shape{3, 16, 16}, plain, /*adamw=*/true);
}

}  // namespace
}  // namespace fanout
