// CUDA softmax cross-entropy (forward, backward, label smoothing, bad
// labels), accuracy counting (ties, NaN) and the fused SGD step against the
// CPU ops.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "cuda/cuda_test_util.h"
#include "kernels/loss.h"
#include "kernels/sgd.h"

namespace fanout {
namespace {

using cudatest::close;
using cudatest::gpu;
using cudatest::poisoned_cpu;
using cudatest::poisoned_gpu;
using cudatest::to_gpu;
using cudatest::to_host;
using testing::random_labels;
using testing::random_tensor;

void check_xent(int64_t n, int k, float smoothing, uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << "n " << n << " k " << k << " smoothing " << smoothing);
  std::mt19937_64 rng(seed);
  Tensor logits = random_tensor(Shape{n, k}, rng, -4.0f, 4.0f);
  Tensor labels = random_labels(n, k, rng);
  const float scale = 1.0f / static_cast<float>(n);
  Context cctx(Device::cpu());
  Tensor probs = poisoned_cpu(logits.shape()), loss = poisoned_cpu(Shape{1}), dl = poisoned_cpu(logits.shape());
  kernels::softmax_xent_forward(cctx, logits, labels, smoothing, probs, loss);
  kernels::softmax_xent_backward(cctx, probs, labels, smoothing, scale, dl);

  Context ctx(gpu());
  Tensor ld = to_gpu(logits), yd = to_gpu(labels);
  Tensor pd = poisoned_gpu(logits.shape()), lossd = poisoned_gpu(Shape{1}), dld = poisoned_gpu(logits.shape());
  kernels::softmax_xent_forward(ctx, ld, yd, smoothing, pd, lossd);
  kernels::softmax_xent_backward(ctx, pd, yd, smoothing, scale, dld);
  EXPECT_TRUE(close(to_host(ctx, pd), probs, 1e-5)) << "probs";
  EXPECT_TRUE(close(to_host(ctx, lossd), loss, 1e-5)) << "loss";
  EXPECT_TRUE(close(to_host(ctx, dld), dl, 1e-5)) << "dlogits";
  // dlogits may alias probs.
  kernels::softmax_xent_backward(ctx, pd, yd, smoothing, scale, pd);
  EXPECT_TRUE(close(to_host(ctx, pd), dl, 1e-5)) << "dlogits in place";
}

TEST(CudaLoss, SoftmaxCrossEntropyMatchesCpu) {
  FANOUT_SKIP_WITHOUT_GPU();
  uint64_t seed = 1;
  for (float s : {0.0f, 0.1f}) {
    check_xent(37, 10, s, seed++);
    check_xent(3, 2, s, seed++);
    check_xent(5, 1000, s, seed++);  // more classes than a warp has lanes
    check_xent(1029, 33, s, seed++);
  }
}

TEST(CudaLoss, LabelOutOfRangeGivesNanLoss) {
  FANOUT_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(20);
  const int64_t n = 9;
  const int k = 10;
  Tensor labels = random_labels(n, k, rng);
  for (int32_t bad : {-1, k, 1000}) {
    SCOPED_TRACE(bad);
    labels.data<int32_t>()[4] = bad;
    Context ctx(gpu());
    Tensor ld = to_gpu(random_tensor(Shape{n, k}, rng)), yd = to_gpu(labels);
    Tensor pd = poisoned_gpu(Shape{n, k}), lossd = to_gpu(Tensor::zeros(Shape{1}));
    kernels::softmax_xent_forward(ctx, ld, yd, 0.0f, pd, lossd);
    EXPECT_TRUE(std::isnan(to_host(ctx, lossd).f32()[0]));
    Tensor probs = to_host(ctx, pd);
    for (int64_t i = 0; i < n * k; ++i) EXPECT_FALSE(std::isnan(probs.f32()[i])) << "probs do not need the label";
    Tensor dld = to_gpu(Tensor::zeros(Shape{n, k}));
    kernels::softmax_xent_backward(ctx, pd, yd, 0.0f, 1.0f, dld);
    Tensor dl = to_host(ctx, dld);
    EXPECT_TRUE(std::isnan(dl.f32()[4 * k])) << "the bad row's gradient is NaN";
    EXPECT_FALSE(std::isnan(dl.f32()[0])) << "other rows are finite";
  }
}

TEST(CudaLoss, CountCorrectMatchesCpuWithTiesAndNan) {
  FANOUT_SKIP_WITHOUT_GPU();
  for (int k : {1, 3, 10, 77}) {
    SCOPED_TRACE(k);
    std::mt19937_64 rng(30 + static_cast<uint64_t>(k));
    const int64_t n = 1031;
    Tensor logits = random_tensor(Shape{n, k}, rng);
    // Few distinct values: many ties (first maximum wins); some NaN rows.
    for (int64_t i = 0; i < logits.numel(); ++i) logits.f32()[i] = std::round(logits.f32()[i] * 1.5f);
    for (int64_t r = 0; r < n; r += 17) logits.f32()[r * k + (r % k)] = std::numeric_limits<float>::quiet_NaN();
    Tensor labels = random_labels(n, k, rng);
    Context cctx(Device::cpu());
    Tensor c = Tensor::empty(Shape{1}, DType::I32);
    kernels::count_correct(cctx, logits, labels, c);
    Context ctx(gpu());
    Tensor cd = poisoned_gpu(Shape{1}, DType::I32), ld = to_gpu(logits), yd = to_gpu(labels);
    kernels::count_correct(ctx, ld, yd, cd);
    EXPECT_EQ(to_host(ctx, cd).data<int32_t>()[0], c.data<int32_t>()[0]);
    EXPECT_GT(c.data<int32_t>()[0], 0);
  }
}

void check_sgd(const kernels::SgdHyper& h, int64_t n, int64_t offset, uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << "lr " << h.lr << " momentum " << h.momentum << " dampening " << h.dampening
                                    << " wd " << h.weight_decay << " nesterov " << h.nesterov << " n " << n
                                    << " offset " << offset);
  std::mt19937_64 rng(seed);
  Tensor p0 = random_tensor(Shape{n + offset}, rng), g0 = random_tensor(Shape{n + offset}, rng);
  Tensor b0 = random_tensor(Shape{n + offset}, rng);
  Context cctx(Device::cpu());
  Context ctx(gpu());
  Tensor pc_full = p0.to(Device::cpu()), bc_full = b0.to(Device::cpu());
  Tensor pc = pc_full.flat(offset, Shape{n}), gc = g0.flat(offset, Shape{n}), bc = bc_full.flat(offset, Shape{n});
  Tensor pd_full = to_gpu(p0), gd_full = to_gpu(g0), bd_full = to_gpu(b0);
  Tensor pd = pd_full.flat(offset, Shape{n}), gd = gd_full.flat(offset, Shape{n}), bd = bd_full.flat(offset, Shape{n});
  // Three steps: the first creates the momentum buffer, the next two use it.
  for (int step = 0; step < 3; ++step) {
    kernels::sgd_step(cctx, pc, gc, bc, h, step == 0);
    kernels::sgd_step(ctx, pd, gd, bd, h, step == 0);
  }
  EXPECT_TRUE(close(to_host(ctx, pd), pc, 1e-5)) << "params";
  if (h.momentum != 0.0f) {
    EXPECT_TRUE(close(to_host(ctx, bd), bc, 1e-5)) << "momentum buffer";
  }
}

TEST(CudaSgd, FusedStepMatchesCpu) {
  FANOUT_SKIP_WITHOUT_GPU();
  uint64_t seed = 40;
  const kernels::SgdHyper cases[] = {
      {0.1f, 0.0f, 0.0f, 0.0f, false},  {0.1f, 0.0f, 0.0f, 5e-4f, false}, {0.05f, 0.9f, 0.0f, 0.0f, false},
      {0.05f, 0.9f, 0.1f, 1e-4f, false}, {0.05f, 0.9f, 0.0f, 5e-4f, true},
  };
  for (const auto& h : cases)
    for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{1031}, int64_t{65537}})
      for (int64_t offset : {0, 1}) check_sgd(h, n, offset, seed++);
}

}  // namespace
}  // namespace fanout
