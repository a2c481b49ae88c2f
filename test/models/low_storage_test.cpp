// Low-type storage under autocast (runtime/nn/autocast.h) on every zoo
// model of images on CPU devices, bf16-mixed and 16-mixed: each top-level
// layer's output is stored where autocast says (convolutions and linear
// layers write the low type, channels-last with 4 or 5 dims; GroupNorm
// float32; every other layer its input's storage), the loss gradient goes
// back in the output's storage, DataParallel over cpu:2 gives one device's
// gradients within the low type's rounding, and a warm step allocates
// nothing. (The GPT's storage: test/models/gpt_test.cpp; each kernel's
// values against float64: the LowStorage tests in test/kernels.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <memory>
#include <string>

#include "cuda/target_batch.h"
#include "kernels/convert.h"
#include "models/layers/activation.h"
#include "models/layers/layernorm.h"
#include "models/zoo/zoo.h"
#include "runtime/core/half.h"
#include "runtime/core/memory.h"
#include "runtime/parallel/engine_factory.h"
#include "support/test_util.h"
#include "support/trained.h"

namespace fanout {
namespace {

using cudatest::ZooCase;
const auto& kZoo = cudatest::kImageZoo;

class ZooLowStorage : public ::testing::TestWithParam<DType> {};
FANOUT_LOW_TYPE_SUITE(ZooLowStorage);

// A zoo model (seed 3) and a batch of `rows` for it.
struct ZooRun {
  cudatest::TargetBatch b;
  std::unique_ptr<Module> m;
};
ZooRun zoo_run(const ZooCase& z, int64_t rows, uint64_t seed) {
  std::mt19937_64 rng(seed);
  ZooRun r{cudatest::make_batch(z.model, z.sample, rows, rng), nullptr};
  r.m = models::make_model(z.model, z.sample, r.b.classes, 3);
  return r;
}

// An engine on `devices` for r's model and loss under autocast to t.
std::unique_ptr<Engine> engine_for(ZooRun& r, DType t, const std::string& devices) {
  EngineSpec spec = testing::engine_on(devices, false);
  spec.loss = r.b.loss;
  spec.dp.math.autocast = t;
  spec.dp.sync_bn = true;  // BatchNorm's statistics over the whole batch, as on one device
  return make_engine(*r.m, std::move(spec));
}

std::string storage(const Tensor& t) {
  return std::string(dtype_name(t.dtype())) + " " + memory_format_name(t.format());
}

TEST_P(ZooLowStorage, LayersStoreWhereAutocastSays) {
  const DType t = GetParam();
  for (const ZooCase& z : kZoo) {
    SCOPED_TRACE(z.model);
    ZooRun run = zoo_run(z, 4, 5);
    const cudatest::TargetBatch& b = run.b;
    Context ctx(Device::cpu());
    ctx.math.autocast = t;
    Tensor x = b.x;
    int low_layers = 0;
    for (auto& [name, child] : run.m->named_modules()) {
      if (name.empty() || name.find('.') != std::string::npos) continue;  // the top-level layers, in order
      SCOPED_TRACE(name + " (" + child->type_name() + ")");
      const Tensor in = x;
      x = child->forward(in, ctx);
      const std::string type = child->type_name();
      if (type == "Conv2d" || type == "Conv3d" || type == "Linear") {
        const bool spatial = x.dim() == 4 || x.dim() == 5;
        EXPECT_EQ(storage(x), std::string(dtype_name(t)) + (spatial ? " channels-last" : " contiguous"));
        ++low_layers;
      } else if (type == "GroupNorm") {
        EXPECT_EQ(storage(x), "float32 contiguous") << "autocast's float32 list";
      } else if (type == "Flatten") {
        EXPECT_EQ(x.dtype(), in.dtype());
        EXPECT_FALSE(x.channels_last()) << "flattened in the logical order";
      } else {
        EXPECT_EQ(storage(x), storage(in)) << "the input's storage";
      }
    }
    EXPECT_GT(low_layers, 0);
    EXPECT_EQ(x.dtype(), t) << "the model's output";
    // The loss reads the low-type output and sends its gradient back in the same storage.
    auto c = make_criterion(b.loss);
    c->forward(ctx, x, b.y, /*train=*/true, 1.0f);
    EXPECT_EQ(storage(c->grad()), storage(x));
    const StepResult r = c->read(ctx);
    EXPECT_TRUE(std::isfinite(r.loss_sum));
  }
}

// One step's gradients on `devices` from the same model seed and batch.
Tensor step_grads(const ZooCase& z, DType t, const std::string& devices) {
  ZooRun r = zoo_run(z, 8, 6);
  engine_for(r, t, devices)->forward_backward_batch(r.b.x, r.b.y);
  return r.m->arenas().grads.to(Device::cpu());
}

// Splitting the batch (BatchNorm synchronized) moves what is rounded at each
// documented point (the outputs, dx and weight gradients of each replica) by
// about u a rounding (u the unit roundoff: 2^-8 bfloat16, 2^-11 float16):
// cpu:2 stays within 4 u (bfloat16) or 8 u (float16) of one device by norm
// (measured at most 1 u and 2 u), and the mixed gradients differ from
// float32's by more than u / 8 (the storage rounds).
TEST_P(ZooLowStorage, DataParallelGivesOneDevicesGradientsWithinTheRounding) {
  const DType t = GetParam();
  const double u = t == DType::BF16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);  // the unit roundoff
  for (const ZooCase& z : kZoo) {
    SCOPED_TRACE(z.model);
    const Tensor one = step_grads(z, t, "cpu"), two = step_grads(z, t, "cpu:2"), f32 = step_grads(z, DType::F32, "cpu");
    auto rel = [&](const Tensor& a) {
      double d = 0, n = 0;
      for (int64_t i = 0; i < one.numel(); ++i) {
        d += std::pow(double(a.f32()[i]) - one.f32()[i], 2);
        n += std::pow(double(one.f32()[i]), 2);
      }
      EXPECT_GT(n, 0.0);
      return std::sqrt(d / n);
    };
    const double split = rel(two), precision = rel(f32);
    std::printf("%-16s %s: cpu:2 against cpu %.3g u, float32 against it %.3g u\n", z.model, dtype_name(t),
                split / u, precision / u);
    EXPECT_LT(split, (t == DType::BF16 ? 4 : 8) * u);
    EXPECT_GT(precision, u / 8);
  }
}

TEST_P(ZooLowStorage, AWarmStepAllocatesNothing) {
  const DType t = GetParam();
  for (const ZooCase& z : kZoo) {
    SCOPED_TRACE(z.model);
    ZooRun r = zoo_run(z, 6, 7);
    testing::EngineRun e(engine_for(r, t, "cpu:2"));
    for (int s = 0; s < 2; ++s) e.train_step(r.b.x, r.b.y, 0.01f);
    const auto before = alloc_stats();
    for (int s = 0; s < 2; ++s) e.train_step(r.b.x, r.b.y, 0.01f);
    EXPECT_EQ(alloc_stats().host_allocs, before.host_allocs);
  }
}

// Layers outside the zoo's paths: a gradient that arrives in another
// storage than the activation it pairs with (float32 into a bfloat16
// channels-last ReLU) is moved into that storage; LayerNorm on a low-type
// input writes float32 (autocast's float32 list) and its dx in the input's
// storage.
TEST(LowStorageLayers, GradientsInAnotherStorageAndLayerNormOnALowInput) {
  Context ctx(Device::cpu());
  ctx.math.autocast = DType::BF16;
  std::mt19937_64 rng(9);
  const Shape s{2, 3, 4, 5};
  const Tensor x = testing::random_tensor(s, rng), dy = testing::random_tensor(s, rng);
  Tensor xl = Tensor::empty(s, DType::BF16, Device::cpu(), MemoryFormat::ChannelsLast);
  kernels::convert(ctx, x, xl);
  models::ReLU relu(/*inplace=*/false);
  relu.set_input_grad(true);
  const Tensor y = relu.forward(xl, ctx);
  const Tensor dx = testing::float32_values(relu.backward(dy, ctx));
  const Tensor xv = testing::float32_values(xl);
  for (int64_t i = 0; i < s.numel(); ++i) {
    const float want = xv.f32()[i] > 0 ? half::float_from_bf16(half::bf16_from_float(dy.f32()[i])) : 0.0f;
    ASSERT_EQ(dx.f32()[i], want) << i;
  }
  EXPECT_EQ(storage(y), "bfloat16 channels-last");

  models::LayerNorm ln(Shape{5});
  ln.init(1);
  ln.set_input_grad(true);
  Tensor xc = Tensor::empty(s, DType::BF16);  // contiguous: LayerNorm normalizes the last dim
  kernels::convert(ctx, x, xc);
  const Tensor ly = ln.forward(xc, ctx);
  EXPECT_EQ(storage(ly), "float32 contiguous");
  const Tensor ldx = ln.backward(dy, ctx);
  EXPECT_EQ(storage(ldx), "bfloat16 contiguous");
  // Each row of y has mean 0 and variance 1 (weight 1, bias 0) over the stored input's values.
  for (int64_t r = 0; r < s.numel() / 5; ++r) {
    double m = 0, v = 0;
    for (int k = 0; k < 5; ++k) m += ly.f32()[r * 5 + k] / 5.0;
    for (int k = 0; k < 5; ++k) v += std::pow(ly.f32()[r * 5 + k] - m, 2) / 5.0;
    EXPECT_NEAR(m, 0.0, 1e-5) << r;
    EXPECT_NEAR(v, 1.0, 1e-2) << r;  // v / (v + eps) with eps 1e-5
  }
}

}  // namespace
}  // namespace fanout
