// Whole training steps on cuda:0 against the CPU: lenet, cnn, resnet18 and
// heatmap3d (MSE on dense targets) from the same initial parameters and batch
// agree after 1 and 3 SGD steps (TF32 off), and a warm training step
// allocates no device memory.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>

#include "cuda/cuda_test_util.h"
#include "cuda/target_batch.h"
#include "models/layers/conv.h"
#include "models/layers/conv_transpose.h"
#include "models/layers/sequential.h"
#include "models/zoo/zoo.h"
#include "runtime/core/half.h"
#include "runtime/core/memory.h"
#include "runtime/optim/clip.h"
#include "runtime/parallel/single_device.h"
#include "support/trained.h"

namespace fanout {
namespace {

using cudatest::close;
using cudatest::gpu;
using cudatest::make_batch;
using cudatest::TargetBatch;
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

// Whole-network comparisons need cases far from ReLU's and max-pool's kinks:
// a decision within float32 rounding of its kink may go either way on either
// device and moves every gradient below it by percent (test/cuda/margins.py
// says why and finds such cases). Each case below has every margin of every
// compared pass at least 1e-5 in float64, as margins.py measured it:
//   margins.py batch_tool MODEL SHAPE BATCH MODEL_SEED DATA_SEED 3 --same-batch
// After step 1 every element holds at 1e-3; `loose3` compares step 3 per
// tensor, by norm, at 5e-3 (BatchNorm over few values per channel amplifies
// float32 rounding step by step).
// autocast BF16 or F16: both engines in that mixed mode. Every rounding to
// the low type is a step a sum added in another order may land on either
// side of, so after the first step the trajectories part as a perturbed
// CPU run parts from the CPU (resnet18 in bf16: 8-ulp weight perturbations
// move three steps' updates by 46-77% on the CPU alone): the state after
// step 1 is compared by norm at 8 u (u = the low type's unit roundoff), the
// losses of every step at 8 u.
// `verified`: how many of the three passes keep their margins. A later pass
// may cross a kink (resnet18: no data seed of 140 kept three passes' margins
// at 3x8x8), so neither the state after it nor the loss of the step after it
// is compared (resnet18 at batch 2 on the CPU alone: weights 8 ulps apart
// move the third loss by up to 8e-4, the updates by up to 2.4%).
void check_training_matches_cpu(const std::string& model, const Shape& sample, int64_t batch, uint64_t seed,
                                uint64_t data_seed, bool loose3 = false, DType autocast = DType::F32,
                                int verified = 3) {
  SCOPED_TRACE(model);
  std::mt19937_64 rng(data_seed);
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
    const bool mixed = autocast != DType::F32;
    const double u = autocast == DType::F16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -9);
    const int compared = mixed ? 1 : verified;  // passes whose results are compared
    if (step > compared + 1) continue;            // a step's loss comes before its own pass's decisions
    EXPECT_NEAR(rg.loss_sum, rc.loss_sum, (mixed ? 8 * u : 1e-4) * std::max(1.0, std::abs(rc.loss_sum)))
        << "loss at step " << step;
    EXPECT_EQ(rg.count, rc.count);
    EXPECT_EQ(rg.sums[kPointsSum].value(), rc.sums[kPointsSum].value());  // planes with a target peak: the targets' alone
    if (mixed && step == 1)
      expect_same_state(cuda_eng.primary_context(), *cuda_model, *cpu_model, 8 * u, step, true);
    else if (mixed || step > compared)
      continue;
    else if (step == 1 || step == 3)
      expect_same_state(cuda_eng.primary_context(), *cuda_model, *cpu_model, step == 3 && loose3 ? 5e-3 : 1e-3, step,
                        step == 3 && loose3);  // 2.7e-3 by norm was seen on an H100
  }
  if (autocast != DType::F32 || verified < 3) return;  // the running statistics of three steps
  const StepResult ec = cpu_eng.eval_step(x, y), eg = cuda_eng.eval_step(x, y);
  EXPECT_NEAR(eg.loss_sum, ec.loss_sum, 1e-3 * std::max(1.0, std::abs(ec.loss_sum))) << "eval loss";
}

// One forward and backward from the same weights and batch, no update: the
// loss and each parameter's gradient on cuda:0 against the CPU's, by norm.
// Both sides sum in float32 in other orders; a healthy pair agrees to a few
// roundings times the net's conditioning, on a case whose first pass keeps
// every margin (margins.py, 1 pass) at least 1e-5. Every tensor's difference
// is printed, so a miss shows the layer where the two part.
void check_gradients_match_cpu(const std::string& model, const Shape& sample, int64_t batch, uint64_t seed,
                               uint64_t data_seed, double rtol) {
  SCOPED_TRACE(model);
  std::mt19937_64 rng(data_seed);
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
// BatchNorm statistics on cuda:0 against the CPU's, each by norm. The data
// seeds keep every margin of the three passes at least 1e-5 (margins.py
// batch_tool MODEL 1x28x28 6 13 SEED 3 --same-batch; with seed 14 the cnn's
// second pass put two values of a pool2 window 1.6e-6 apart, and the GPU
// routed their gradient to the other one: conv1..conv2 1.4% off).
TEST(CudaTraining, EveryStepMatchesCpu) {
  FANOUT_SKIP_WITHOUT_GPU();
  for (const auto& [model, data_seed] : {std::pair<const char*, uint64_t>{"cnn", 27}, {"lenet", 30}}) {
    SCOPED_TRACE(model);
    std::mt19937_64 rng(data_seed);
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
  check_gradients_match_cpu("lenet", Shape{1, 28, 28}, 5, 11, 12, 1e-4);
  check_gradients_match_cpu("cnn", Shape{1, 28, 28}, 6, 13, 14, 1e-4);
  check_gradients_match_cpu("heatmap3d", Shape{1, 8, 12, 8}, 3, 14, 15, 1e-4);
  // Data seed 13 put one of layer2.0.bn1's outputs 1.9e-6 from ReLU's kink:
  // the GPU's rounding put it on the other side and every gradient below
  // moved by 1-3%, as flipping that one value in float64 does.
  check_gradients_match_cpu("resnet18", Shape{3, 16, 16}, 2, 12, 19, 1e-4);
}

Module& module_named(Module& m, const std::string& name) {
  for (auto& [n, p] : m.named_modules())
    if (n == name) return *p;
  throw std::runtime_error("no module " + name);
}

// Runs `units` of the two models in order, each alone on both devices from
// the CPU's own input, then backward in reverse from a random output
// gradient, each from the CPU's own output gradient; prints and returns the
// worst difference by norm of each unit's output, input gradient and
// parameter gradients (grads zeroed before each unit's backward).
double units_alone(Context& cc, Context& gc, Module& mc, Module& mg, const std::vector<std::string>& units, Tensor x,
                   std::mt19937_64& rng, double rtol) {
  double worst = 0;
  auto report = [&](const char* what, const std::string& unit, const Tensor& got, const Tensor& want) {
    const double rel = cudatest::slice_rel(got, want, 0, want.numel());
    std::printf("resnet18 alone %-8s %-24s %.3g\n", what, unit.c_str(), rel);
    EXPECT_LE(rel, rtol) << what << " " << unit;
    worst = std::max(worst, rel);
  };
  for (const std::string& u : units) {
    Tensor yc = module_named(mc, u).forward(testing::clone(x), cc);
    Tensor yg = module_named(mg, u).forward(cudatest::to_gpu(x), gc);
    report("forward", u, cudatest::to_host(gc, yg), yc);
    x = testing::clone(yc);
  }
  Tensor dy = random_tensor(x.shape(), rng);
  const auto params = mc.named_parameters();
  for (auto it = units.rbegin(); it != units.rend(); ++it) {
    gc.compute().synchronize();
    mc.zero_grad();
    mg.zero_grad(&gc.compute());
    Tensor dyg = cudatest::to_gpu(dy);
    gc.compute().synchronize();
    Tensor dxc = module_named(mc, *it).backward(testing::clone(dy), cc);
    Tensor dxg = module_named(mg, *it).backward(dyg, gc);
    if (dxc.defined()) report("dx", *it, cudatest::to_host(gc, dxg), dxc);
    const Tensor gg = cudatest::to_host(gc, mg.arenas().grads), gcpu = mc.arenas().grads;
    for (const auto& [name, p] : params)
      if (name.rfind(*it + ".", 0) == 0) {
        const double rel = cudatest::slice_rel(gg, gcpu, p->offset, p->shape.numel());
        std::printf("resnet18 alone grad    %-24s %.3g\n", name.c_str(), rel);
        EXPECT_LE(rel, rtol) << name;
        worst = std::max(worst, rel);
      }
    if (dxc.defined()) dy = testing::clone(dxc);
  }
  return worst;
}

// resnet18 at batch 2 taken apart: each top-level unit (a BasicBlock being
// one) and each block's main path (conv1, bn1, relu, conv2, bn2) and
// shortcut run alone on cuda:0 from the CPU's own inputs, so a unit's miss
// is the unit's and no difference upstream can carry a value across a kink.
// (With data seed 13 every unit agreed here while the whole net missed by
// 1-3%: the kink in layer2.0.bn1's output GradientsMatchCpu describes.)
// whole_blocks: each BasicBlock is also a unit (and the head after them);
// otherwise only the stem and each block's layers are.
void resnet18_units_alone(DType autocast, double rtol, bool whole_blocks) {
  const Shape sample{3, 16, 16};
  std::mt19937_64 rng(19);
  const TargetBatch b = make_batch("resnet18", sample, 2, rng);
  auto mc = models::make_model("resnet18", sample, b.classes, 12);
  auto mg = models::make_model("resnet18", sample, b.classes, 12);
  MathOptions math;
  math.autocast = autocast;
  testing::Trained<SingleDeviceEngine> ec(*mc, Device::cpu(), *make_criterion(b.loss), 12, math);
  testing::Trained<SingleDeviceEngine> eg(*mg, gpu(), *make_criterion(b.loss), 12, math);
  Context &cc = ec.primary_context(), &gc = eg.primary_context();
  std::vector<std::string> top = {"conv1", "bn1", "relu"};
  for (int l = 1; l <= 4; ++l)
    for (int k = 0; k < 2; ++k) top.push_back("layer" + std::to_string(l) + "." + std::to_string(k));
  for (const char* u : {"avgpool", "flatten", "fc"}) top.push_back(u);
  units_alone(cc, gc, *mc, *mg, whole_blocks ? top : std::vector<std::string>{"conv1", "bn1", "relu"}, b.x, rng, rtol);
  // Each block's inside, from the block's input in the CPU's forward.
  Tensor x = b.x;
  for (const std::string& u : top) {
    if (u.rfind("layer", 0) == 0) {
      std::vector<std::string> inner;
      for (const char* v : {"conv1", "bn1", "relu", "conv2", "bn2"}) inner.push_back(u + "." + v);
      units_alone(cc, gc, *mc, *mg, inner, x, rng, rtol);
      bool has_shortcut = false;
      for (auto& [n, m] : mc->named_modules()) has_shortcut |= n == u + ".downsample";
      if (has_shortcut) units_alone(cc, gc, *mc, *mg, {u + ".downsample"}, x, rng, rtol);
    }
    x = testing::clone(module_named(*mc, u).forward(testing::clone(x), cc));
  }
}

TEST(CudaTraining, Resnet18UnitsAloneMatchCpu) {
  FANOUT_SKIP_WITHOUT_GPU();
  resnet18_units_alone(DType::F32, 1e-4, true);
}

// bf16-mixed resnet18 (autocast's roundings around convolutions and
// BatchNorm) layer by layer, by norm at 8 u (u = 2^-9). Larger units are no
// test of that: on the CPU alone, inputs 8 ulps apart move a whole
// BasicBlock's results by up to 10% in bf16 (its layers alone: 3.3e-4), and
// weights 8 ulps apart move the whole net's first update by 24-36% (float32:
// 6e-5), as they move PyTorch's under torch.autocast bf16 by 31-34%; an H100
// missed the CPU's by as much (conv1.weight 6%, bn1.bias 27%).
TEST(CudaTraining, Resnet18Bf16UnitsAloneMatchCpu) {
  FANOUT_SKIP_WITHOUT_GPU();
  resnet18_units_alone(DType::BF16, 8 * std::ldexp(1.0, -9), false);
}

TEST(CudaTraining, LenetStepsMatchCpu) {
  FANOUT_SKIP_WITHOUT_GPU();
  check_training_matches_cpu("lenet", Shape{1, 28, 28}, 6, 13, 30);
}

// The state after the first step (the pass whose margins data seed 19
// keeps), the losses of three.
TEST(CudaTraining, Resnet18StepsMatchCpu) {
  FANOUT_SKIP_WITHOUT_GPU();
  check_training_matches_cpu("resnet18", Shape{3, 16, 16}, 2, 12, 19, false, DType::F32, 1);
}

TEST(CudaTraining, CnnStepsMatchCpu) {
  FANOUT_SKIP_WITHOUT_GPU();
  check_training_matches_cpu("cnn", Shape{1, 28, 28}, 6, 13, 27);
}

// Conv3d (cuDNN N-d), BatchNorm3d, MaxPool3d, Upsample3d and the MSE
// criterion with its heatmap metric, on volumes 8x12x8 with 3 landmarks.
TEST(CudaTraining, Heatmap3dStepsMatchCpu) {
  FANOUT_SKIP_WITHOUT_GPU();
  check_training_matches_cpu("heatmap3d", Shape{1, 8, 12, 8}, 3, 14, 15, true);
}

// bf16-mixed: autocast's roundings (runtime/nn/autocast.h) on the GPU
// against the CPU's, for 3-D convolutions, BatchNorm, pooling and the MSE
// loss (resnet18's: Resnet18Bf16UnitsAloneMatchCpu); 16-mixed on lenet.
TEST(CudaTraining, Heatmap3dBf16MixedMatchesCpu) {
  FANOUT_SKIP_WITHOUT_GPU();
  check_training_matches_cpu("heatmap3d", Shape{1, 8, 12, 8}, 3, 14, 15, true, DType::BF16);
}

TEST(CudaTraining, Lenet16MixedMatchesCpu) {
  FANOUT_SKIP_WITHOUT_GPU();
  check_training_matches_cpu("lenet", Shape{1, 28, 28}, 6, 13, 30, false, DType::F16);
}

optim::OptimizerOptions adamw_amsgrad() { return testing::test_adamw(); }

// AdamW (amsgrad, two groups) with clipping by norm on cuda:0 against the
// CPU, from the same weights and batches: CUB's norm and the chunked update
// kernel against their CPU counterparts, 4 steps of lenet on batches whose
// every margin stays at least 1e-5 along the float64 run (margins.py
// batch_tool lenet 1x28x28 8 8 66 4 --optimizer adamw; its gradient norms
// 0.4-0.6 are clipped to 0.1). Compared by norm:
// the parameters' change and the optimizer's state.
TEST(CudaTraining, AdamWWithClippingMatchesCpu) {
  FANOUT_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(66);
  const Shape sample{1, 28, 28};
  auto cpu_model = models::make_model("lenet", sample, 10, 8);
  auto cuda_model = models::make_model("lenet", sample, 10, 8);
  const Tensor init = cpu_model->arenas().params.to(Device::cpu());
  testing::Trained<SingleDeviceEngine> cpu_eng(*cpu_model, Device::cpu(), *make_criterion({}), 8);
  testing::Trained<SingleDeviceEngine> cuda_eng(*cuda_model, gpu(), *make_criterion({}), 8);
  cpu_eng.set_optimizer(adamw_amsgrad());
  cuda_eng.set_optimizer(adamw_amsgrad());
  for (int s = 0; s < 4; ++s) {
    const TargetBatch b = make_batch("lenet", sample, 8, rng);
    double norms[2];
    int k = 0;
    for (auto* e : {static_cast<Engine*>(&cpu_eng), static_cast<Engine*>(&cuda_eng)}) {
      optim::Optimizer& opt = e == &cpu_eng ? cpu_eng.optimizer() : cuda_eng.optimizer();
      e->forward_backward_batch(b.x, b.y);
      norms[k++] = optim::clip_grad_norm(opt, 0.1);
      opt.step();
      opt.zero_grad();
    }
    EXPECT_GT(norms[0], 0.1) << "clipping acts";
    EXPECT_NEAR(norms[1], norms[0], 1e-4 * norms[0]) << "step " << s;
  }
  cuda_eng.primary_context().compute().synchronize();
  Tensor a = testing::clone(cpu_model->arenas().params), b = cuda_model->arenas().params.to(Device::cpu());
  for (int64_t i = 0; i < a.numel(); ++i) {
    a.f32()[i] -= init.f32()[i];
    b.f32()[i] -= init.f32()[i];
  }
  EXPECT_LT(cudatest::slice_rel(b, a, 0, a.numel()), 1e-4) << "parameter change";
  const auto sa = cpu_eng.optimizer().state(), sb = cuda_eng.optimizer().state();
  ASSERT_EQ(sb.size(), 3u);
  for (size_t i = 0; i < sa.size(); ++i)
    EXPECT_LT(cudatest::slice_rel(sb[i].second->to(Device::cpu()), *sa[i].second, 0, sa[i].second->numel()), 1e-4)
        << sa[i].first;
}

// Under bf16-mixed the CUDA convolutions round as they read and write
// (kernels::conv_rounds_in_low_type), so their layers hand them x, w and dy
// unrounded and skip their own rounding passes. Fed float32 values that are
// not bfloat16 ones: y, dx, dW and db must be bit for bit what the same GPU
// layer gives on x and dy rounded beforehand (db from the rounded dy, too),
// bfloat16 values (dW and db summed into zeroed gradients), and within one
// bfloat16 ulp of the CPU layer, which rounds each of them explicitly (4 u
// of max(|value|, rms): cuDNN's accumulation, ConvOnBackend.LowPrecision...;
// y 8 u, for the bias the GPU adds after its rounding).
TEST(CudaTraining, ConvLayersRoundOnceInTheLowType) {
  FANOUT_SKIP_WITHOUT_GPU();
  const double u = std::ldexp(1.0, -9);
  auto rounded = [](Tensor t) {
    for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = half::float_from_bf16(half::bf16_from_float(t.f32()[i]));
    return t;
  };
  auto not_bf16 = [&](const Tensor& t) {  // how many elements are not bfloat16 values
    const Tensor r = rounded(testing::clone(t));
    int64_t off = 0;
    for (int64_t i = 0; i < t.numel(); ++i) off += r.f32()[i] != t.f32()[i];
    return off;
  };
  struct Case {
    const char* name;
    std::function<std::unique_ptr<Module>()> make;
    Shape x;
  };
  const std::vector<Case> cases = {
      {"Conv2d, no bias", [] { return std::make_unique<models::Conv2d>(6, 8, 3, 1, 1, false); }, Shape{3, 6, 9, 9}},
      {"Conv2d, bias, stride 2", [] { return std::make_unique<models::Conv2d>(6, 8, 3, 2, 1, true); },
       Shape{3, 6, 9, 9}},
      {"Conv3d", [] { return std::make_unique<models::Conv3d>(4, 6, 3, 1, 1, false); }, Shape{2, 4, 5, 6, 7}},
      {"ConvTranspose2d, bias", [] { return std::make_unique<models::ConvTranspose>(2, 6, 4, 3, 2, 1, 1, true); },
       Shape{3, 6, 5, 5}},
      {"ConvTranspose2d, no bias",
       [] { return std::make_unique<models::ConvTranspose>(2, 6, 4, 3, 2, 1, 1, false); }, Shape{3, 6, 5, 5}}};
  std::mt19937_64 rng(41);
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    models::Sequential mc, mg, mr;  // CPU; GPU on raw inputs; GPU on rounded ones
    for (models::Sequential* m : {&mc, &mg, &mr}) {
      m->add(c.make());
      m->set_input_grad(true);
      m->init(5);
    }
    Context cc(Device::cpu()), gc(gpu()), rc(gpu());
    for (Context* ctx : {&cc, &gc, &rc}) {
      ctx->math.autocast = DType::BF16;
      ctx->math.deterministic = true;  // the same cuDNN algorithms, the same sums, on both GPU runs
    }
    mg.to(gpu(), &gc.compute());
    mr.to(gpu(), &rc.compute());
    const Tensor x = random_tensor(c.x, rng);
    ASSERT_GT(not_bf16(x), x.numel() / 2) << "the input must not be bfloat16 values already";
    const Tensor yc = testing::clone(mc.forward(testing::clone(x), cc));
    const Tensor yg = cudatest::to_host(gc, mg.forward(cudatest::to_gpu(x), gc));
    const Tensor yr = cudatest::to_host(rc, mr.forward(cudatest::to_gpu(rounded(testing::clone(x))), rc));
    const Tensor dy = random_tensor(yc.shape(), rng);
    mc.zero_grad();
    mg.zero_grad(&gc.compute());
    mr.zero_grad(&rc.compute());
    const Tensor dxc = mc.backward(testing::clone(dy), cc);
    const Tensor dxg = cudatest::to_host(gc, mg.backward(cudatest::to_gpu(dy), gc));
    const Tensor dxr = cudatest::to_host(rc, mr.backward(cudatest::to_gpu(rounded(testing::clone(dy))), rc));
    const Tensor gg = cudatest::to_host(gc, mg.arenas().grads), gr = cudatest::to_host(rc, mr.arenas().grads);
    EXPECT_TRUE(testing::same_bits(yg, yr)) << "y";
    EXPECT_TRUE(testing::same_bits(dxg, dxr)) << "dx";
    EXPECT_TRUE(testing::same_bits(gg, gr)) << "parameter gradients";
    EXPECT_EQ(not_bf16(yg), 0) << "y";
    EXPECT_EQ(not_bf16(dxg), 0) << "dx";
    EXPECT_TRUE(cudatest::close(yg, yc, 8 * u)) << "y";  // with a bias the GPU rounds once more (autocast.h)
    EXPECT_TRUE(cudatest::close(dxg, dxc, 4 * u)) << "dx";
    for (const auto& [name, p] : mc.named_parameters()) {
      Tensor got = Tensor::empty(p->shape), want = Tensor::empty(p->shape);
      std::copy_n(gg.f32() + p->offset, p->shape.numel(), got.f32());
      std::copy_n(mc.arenas().grads.f32() + p->offset, p->shape.numel(), want.f32());
      EXPECT_EQ(not_bf16(got), 0) << name;
      EXPECT_TRUE(cudatest::close(got, want, 4 * u)) << name;
    }
  }
}

// After warm-up, train and eval steps on cuda:0 allocate no device memory
// (workspace, cuDNN plans and layer outputs are all reused), with SGD and
// with AdamW plus clipping by norm (CUB's temporaries in the workspace).
void check_steady_state(const std::string& model, const Shape& sample, const MathOptions& math,
                        bool adamw = false) {
  SCOPED_TRACE(::testing::Message() << model << " benchmark " << math.cudnn_benchmark << " deterministic "
                                    << math.deterministic << " autocast " << dtype_name(math.autocast));
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
  MathOptions plain, bench, det, bf16;
  bench.cudnn_benchmark = true;
  det.deterministic = true;
  bf16.autocast = DType::BF16;  // cuDNN and cuBLAS in bfloat16 through the context's low-type buffers
  check_steady_state("resnet18", Shape{3, 16, 16}, plain);
  check_steady_state("resnet18", Shape{3, 16, 16}, bench);
  check_steady_state("lenet", Shape{1, 28, 28}, det);
  check_steady_state("heatmap3d", Shape{1, 8, 8, 8}, plain);
  check_steady_state("heatmap3d", Shape{1, 8, 8, 8}, bench);
  check_steady_state("resnet18", Shape{3, 16, 16}, plain, /*adamw=*/true);
  check_steady_state("resnet18", Shape{3, 16, 16}, bf16);
  check_steady_state("lenet", Shape{1, 28, 28}, bf16);
}

}  // namespace
}  // namespace fanout
