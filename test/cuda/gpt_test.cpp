// A GPT on CUDA (TF32 off): one training step's logits, loss and gradients
// on cuda:0 against the CPU's from the same weights and batch (float32
// kernels on both sides: within 1e-4 of each tensor's largest value); five
// AdamW steps on DataParallel over 0,0 against one GPU; bf16-mixed logits
// within bfloat16's rounding of float32's (cuDNN's fused attention, or its
// fallback); a warm step that allocates nothing on the GPU; and activation
// checkpointing's step bit for bit the plain one's (dropout 0.1); decoding
// with the key-value cache against the full forward, and generation with
// and without it drawing the same tokens.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "cuda/cuda_test_util.h"
#include "models/zoo/gpt.h"
#include "runtime/core/memory.h"
#include "runtime/parallel/engine_factory.h"
#include "support/test_util.h"
#include "support/trained.h"

namespace fanout {
namespace {

using cudatest::gpu;

models::GPTConfig config() {
  return {.block_size = 32, .vocab_size = 50, .n_layer = 2, .n_head = 4, .n_embd = 64, .dropout = 0.0f};
}

Tensor ids(int64_t b, int64_t t, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Tensor x = Tensor::empty(Shape{b, t}, DType::I32);
  for (int64_t i = 0; i < x.numel(); ++i) x.data<int32_t>()[i] = static_cast<int32_t>(rng() % 50);
  return x;
}

// max |a - b| / max |b|; infinite where an element is not finite.
double rel(const Tensor& a, const Tensor& b) {
  double d = 0, s = 0;
  for (int64_t i = 0; i < b.numel(); ++i) {
    const double e = std::abs(double(a.f32()[i]) - b.f32()[i]);
    d = std::isfinite(e) ? std::max(d, e) : std::numeric_limits<double>::infinity();
    s = std::max(s, std::abs(double(b.f32()[i])));
  }
  EXPECT_GT(s, 0.0);
  return d / s;
}

struct Step {
  Tensor logits, grads;
  double loss;
};

Step one_step(Device d, DType autocast = DType::F32, bool checkpoint = false, float dropout = 0.0f) {
  models::GPTConfig c = config();
  c.dropout = dropout;
  auto m = models::gpt(c, 3, checkpoint);
  EngineSpec spec;
  spec.devices = {d};
  spec.loss.criterion = CriterionKind::TokenCrossEntropy;
  spec.dp.math.autocast = autocast;
  auto e = make_engine(*m, std::move(spec));
  const Tensor x = ids(4, 32, 5), y = ids(4, 32, 6);
  const StepResult r = e->forward_backward_batch(x, y);
  e->primary_context().compute().synchronize();
  Step s;
  s.grads = m->arenas().grads.to(Device::cpu());
  s.loss = r.loss_sum;
  Context ctx(d);
  ctx.math.autocast = autocast;
  m->eval();
  s.logits = m->forward(d.is_cpu() ? x : x.to(d), ctx).to(Device::cpu(), &ctx.compute());
  ctx.compute().synchronize();
  s.logits = testing::float32_values(s.logits);  // bfloat16 logits under autocast
  return s;
}

TEST(CudaGpt, StepMatchesTheCpu) {
  FANOUT_SKIP_WITHOUT_GPU();
  const Step cpu = one_step(Device::cpu()), cuda = one_step(gpu());
  EXPECT_LT(rel(cuda.logits, cpu.logits), 1e-4) << "logits";
  EXPECT_NEAR(cuda.loss, cpu.loss, 1e-4 * std::abs(cpu.loss));
  EXPECT_LT(rel(cuda.grads, cpu.grads), 1e-4) << "gradients";
}

TEST(CudaGpt, CheckpointedStepIsThePlainStepBitForBit) {
  FANOUT_SKIP_WITHOUT_GPU();
  const Step plain = one_step(gpu(), DType::F32, false, 0.1f), ckpt = one_step(gpu(), DType::F32, true, 0.1f);
  EXPECT_TRUE(testing::same_bits(ckpt.grads, plain.grads));
  EXPECT_EQ(ckpt.loss, plain.loss);
  EXPECT_TRUE(testing::same_bits(ckpt.logits, plain.logits));
}

TEST(CudaGpt, DecodeWithTheCacheMatchesTheFullForward) {
  FANOUT_SKIP_WITHOUT_GPU();
  const int64_t b = 2, t = 32, v = 50;
  const Tensor x = ids(b, t, 7);
  for (DType autocast : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(autocast));
    auto m = models::gpt(config(), 3);
    Context ctx(gpu());
    ctx.math.autocast = autocast;
    ctx.math.allow_tf32 = false;
    ctx.training = false;
    m->to(gpu(), &ctx.compute());
    m->eval();
    const Tensor full = testing::float32_values(m->forward(x.to(gpu()), ctx).to(Device::cpu(), &ctx.compute()));
    m->start_sequence(b);
    int64_t n = 0;
    for (int64_t piece : {5, 1, 1, 9, 16}) {
      Tensor xp = Tensor::empty(Shape{b, piece}, DType::I32);
      for (int64_t r = 0; r < b; ++r)
        std::copy(x.data<int32_t>() + r * t + n, x.data<int32_t>() + r * t + n + piece, xp.data<int32_t>() + r * piece);
      Tensor got = m->decode(xp.to(gpu()), ctx).to(Device::cpu(), &ctx.compute());
      ctx.compute().synchronize();
      got = testing::float32_values(got);
      n += piece;
      for (int64_t r = 0; r < b; ++r) {
        Tensor want = Tensor::empty(Shape{v}), row = Tensor::empty(Shape{v});
        std::copy(full.f32() + (r * t + n - 1) * v, full.f32() + (r * t + n) * v, want.f32());
        std::copy(got.f32() + r * v, got.f32() + (r + 1) * v, row.f32());
        EXPECT_LT(rel(row, want), autocast == DType::F32 ? 1e-4 : 0.03) << "row " << r << " after " << n;
      }
    }
    m->end_sequence();
  }
  auto m = models::gpt(config(), 4);
  Context ctx(gpu());
  ctx.math.allow_tf32 = false;
  m->to(gpu(), &ctx.compute());
  models::SampleOptions o;
  o.max_new_tokens = 40;  // past block_size 32
  o.temperature = 1.0;
  o.seed = 3;
  const auto cached = models::generate(*m, ctx, {1, 2, 3}, o);
  o.kv_cache = false;
  EXPECT_EQ(cached, models::generate(*m, ctx, {1, 2, 3}, o));
}

TEST(CudaGpt, Bf16MixedLogitsWithinItsRounding) {
  FANOUT_SKIP_WITHOUT_GPU();
  const Step f32 = one_step(gpu()), bf16 = one_step(gpu(), DType::BF16);
  const double r = rel(bf16.logits, f32.logits);
  EXPECT_GT(r, 0.0) << "autocast changed nothing";
  EXPECT_LT(r, 0.03);
  EXPECT_LT(rel(bf16.grads, f32.grads), 0.1) << "gradients";
}

TEST(CudaGpt, DataParallelOnOneGpuMatchesOneDeviceAndAllocatesNothingWarm) {
  FANOUT_SKIP_WITHOUT_GPU();
  auto run = [&](const std::vector<Device>& devices, bool count_allocs) {
    auto m = models::gpt(config(), 4);
    EngineSpec spec;
    spec.devices = devices;
    spec.force_data_parallel = devices.size() > 1;
    spec.loss.criterion = CriterionKind::TokenCrossEntropy;
    testing::EngineRun e(make_engine(*m, std::move(spec)), testing::test_adamw(1e-3f));
    const Tensor x = ids(8, 32, 7), y = ids(8, 32, 8);
    for (int s = 0; s < 2; ++s) e.train_step(x, y, 1e-3f);
    const auto before = alloc_stats();
    for (int s = 0; s < 3; ++s) e.train_step(x, y, 1e-3f);
    if (count_allocs) {
      EXPECT_EQ(alloc_stats().device_allocs, before.device_allocs);
      EXPECT_EQ(alloc_stats().host_allocs, before.host_allocs);
    }
    e->primary_context().compute().synchronize();
    return m->arenas().params.to(Device::cpu());
  };
  const Tensor init = models::gpt(config(), 4)->arenas().params;
  const Tensor one = run({gpu()}, true), two = run({gpu(), gpu()}, true);
  Tensor d1 = testing::clone(one), d2 = testing::clone(two);
  for (int64_t i = 0; i < d1.numel(); ++i) d1.f32()[i] -= init.f32()[i], d2.f32()[i] -= init.f32()[i];
  EXPECT_LT(rel(d2, d1), 1e-3) << "five AdamW steps' updates";
}

}  // namespace
}  // namespace fanout
