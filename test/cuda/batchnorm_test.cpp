// CUDA batch-norm steps against the CPU ones: statistics, finalize (with
// running statistics), apply, eval, backward reduce and backward apply, on
// (N, C, H, W) and (N, C) inputs of odd sizes, with outputs poisoned. Each
// step gets the same inputs on both devices (the CPU's results of the
// previous step), so a mismatch points at one kernel.
#include <gtest/gtest.h>

#include "cuda/cuda_test_util.h"
#include "kernels/batchnorm.h"
#include "models/layers/batchnorm2d.h"

namespace fanout {
namespace {

using cudatest::close;
using cudatest::gpu;
using cudatest::poisoned_cpu;
using cudatest::poisoned_gpu;
using cudatest::to_gpu;
using cudatest::to_host;
using testing::random_tensor;

void check_batchnorm(const Shape& xs, float x_lo, float x_hi, uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << "x " << xs.str() << " in [" << x_lo << ", " << x_hi << ")");
  std::mt19937_64 rng(seed);
  const int64_t c = xs[1];
  const int64_t count = xs.numel() / c;
  const float eps = 1e-5f, momentum = 0.1f;
  Tensor x = random_tensor(xs, rng, x_lo, x_hi);
  Tensor dy = random_tensor(xs, rng);
  Tensor gamma = random_tensor(Shape{c}, rng, 0.5f, 1.5f), beta = random_tensor(Shape{c}, rng);
  Tensor rm0 = random_tensor(Shape{c}, rng), rv0 = random_tensor(Shape{c}, rng, 0.5f, 2.0f);
  Context cctx(Device::cpu());
  Context ctx(gpu());

  // bn_stats
  Tensor stats = poisoned_cpu(Shape{3, c}, DType::F64);
  kernels::bn_stats(cctx, x, stats);
  Tensor xd = to_gpu(x), statsd = poisoned_gpu(Shape{3, c}, DType::F64);
  kernels::bn_stats(ctx, xd, statsd);
  EXPECT_TRUE(cudatest::close64(to_host(ctx, statsd), stats, 1e-12)) << "bn_stats";

  // bn_finalize, from the CPU's statistics
  Tensor mean = poisoned_cpu(Shape{2, c}), invstd = poisoned_cpu(Shape{c});
  Tensor rm = rm0.to(Device::cpu()), rv = rv0.to(Device::cpu());
  kernels::bn_finalize(cctx, stats, count, eps, momentum, mean, invstd, &rm, &rv);
  Tensor meand = poisoned_gpu(Shape{2, c}), invstdd = poisoned_gpu(Shape{c});
  Tensor rmd = to_gpu(rm0), rvd = to_gpu(rv0), stats_in = to_gpu(stats);
  kernels::bn_finalize(ctx, stats_in, count, eps, momentum, meand, invstdd, &rmd, &rvd);
  EXPECT_TRUE(close(to_host(ctx, meand).slice(0, 1), mean.slice(0, 1), 1e-6)) << "mean (hi)";
  {
    const Tensor h = to_host(ctx, meand);
    for (int64_t ch = 0; ch < c; ++ch)  // hi + lo: the float64 mean
      EXPECT_NEAR(static_cast<double>(h.f32()[ch]) + h.f32()[c + ch],
                  static_cast<double>(mean.f32()[ch]) + mean.f32()[c + ch], 1e-12 * (1 + std::abs(mean.f32()[ch])))
          << "mean (hi + lo), channel " << ch;
  }
  EXPECT_TRUE(close(to_host(ctx, invstdd), invstd, 1e-5)) << "invstd";
  EXPECT_TRUE(close(to_host(ctx, rmd), rm, 1e-5)) << "running_mean";
  EXPECT_TRUE(close(to_host(ctx, rvd), rv, 1e-5)) << "running_var";
  // Without running statistics.
  Tensor mean2 = poisoned_gpu(Shape{2, c}), invstd2 = poisoned_gpu(Shape{c});
  kernels::bn_finalize(ctx, stats_in, count, eps, momentum, mean2, invstd2, nullptr, nullptr);
  EXPECT_TRUE(close(to_host(ctx, invstd2), invstd, 1e-5)) << "invstd without running stats";

  // bn_apply, from the CPU's mean and invstd
  Tensor mean_in = to_gpu(mean), invstd_in = to_gpu(invstd), gammad = to_gpu(gamma), betad = to_gpu(beta);
  Tensor y = poisoned_cpu(xs);
  kernels::bn_apply(cctx, x, mean, invstd, gamma, beta, y);
  Tensor yd = poisoned_gpu(xs);
  kernels::bn_apply(ctx, xd, mean_in, invstd_in, gammad, betad, yd);
  EXPECT_TRUE(close(to_host(ctx, yd), y, 1e-4)) << "bn_apply";

  // bn_forward_eval
  Tensor ye = poisoned_cpu(xs);
  kernels::bn_forward_eval(cctx, x, rm0, rv0, gamma, beta, eps, ye);
  Tensor rm0d = to_gpu(rm0), rv0d = to_gpu(rv0), yed = poisoned_gpu(xs);
  kernels::bn_forward_eval(ctx, xd, rm0d, rv0d, gammad, betad, eps, yed);
  EXPECT_TRUE(close(to_host(ctx, yed), ye, 1e-4)) << "bn_forward_eval";

  // bn_backward_reduce
  Tensor gs = poisoned_cpu(Shape{2, c});
  kernels::bn_backward_reduce(cctx, x, dy, mean, invstd, gs);
  Tensor dyd = to_gpu(dy), gsd = poisoned_gpu(Shape{2, c});
  kernels::bn_backward_reduce(ctx, xd, dyd, mean_in, invstd_in, gsd);
  EXPECT_TRUE(close(to_host(ctx, gsd), gs, 1e-4)) << "bn_backward_reduce";

  // bn_backward_apply, from the CPU's grad_stats
  Tensor dx = poisoned_cpu(xs);
  kernels::bn_backward_apply(cctx, x, dy, mean, invstd, gamma, gs, count, dx);
  Tensor gs_in = to_gpu(gs), dxd = poisoned_gpu(xs);
  kernels::bn_backward_apply(ctx, xd, dyd, mean_in, invstd_in, gammad, gs_in, count, dxd);
  EXPECT_TRUE(close(to_host(ctx, dxd), dx, 1e-4)) << "bn_backward_apply";
}

TEST(CudaBatchNorm, StepsMatchCpu4d) {
  FANOUT_SKIP_WITHOUT_GPU();
  check_batchnorm(Shape{3, 5, 7, 9}, -1.0f, 1.0f, 1);
  check_batchnorm(Shape{2, 3, 1, 1}, -1.0f, 1.0f, 2);
  check_batchnorm(Shape{5, 7, 3, 3}, 2.0f, 4.0f, 3);  // mean far from zero
}

TEST(CudaBatchNorm, StepsMatchCpu2d) {
  FANOUT_SKIP_WITHOUT_GPU();
  check_batchnorm(Shape{13, 6}, -1.0f, 1.0f, 4);
  check_batchnorm(Shape{257, 33}, -1.0f, 1.0f, 5);
}

TEST(CudaBatchNorm, LargePlanesMatchCpu) {
  FANOUT_SKIP_WITHOUT_GPU();
  // Many partial blocks per channel (N*H*W = 64*33*31) and few channels.
  check_batchnorm(Shape{64, 3, 33, 31}, -1.0f, 1.0f, 6);
}

TEST(CudaBatchNorm, StatsAreDeterministic) {
  FANOUT_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(7);
  Tensor xd = to_gpu(random_tensor(Shape{32, 4, 17, 19}, rng));
  Context ctx(gpu());
  Tensor s1 = poisoned_gpu(Shape{3, 4}, DType::F64), s2 = poisoned_gpu(Shape{3, 4}, DType::F64);
  kernels::bn_stats(ctx, xd, s1);
  kernels::bn_stats(ctx, xd, s2);
  Tensor a = to_host(ctx, s1), b = to_host(ctx, s2);
  for (int i = 0; i < 12; ++i) EXPECT_EQ(a.f64()[i], b.f64()[i]) << i;
}

// Channels whose mean is 1e2, 1e3 and 1e4 times their spread: the BatchNorm
// layer on the GPU within 1e-5 of the float64 reference, running variance
// included (as test/models/batchnorm_stability_test.cpp on the CPU).
TEST(CudaBatchNorm, LargeChannelMeansMatchFloat64) {
  FANOUT_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(8);
  for (const Shape& s : {Shape{8, 6, 5, 7}, Shape{64, 3}, Shape{32, 3, 33, 31}}) {
    for (double spread : {1.0, 37.0}) {
      SCOPED_TRACE(::testing::Message() << s.str() << " spread " << spread);
      const Tensor x = testing::offset_channels(s, {1e2, 1e3, 1e4}, spread, rng);
      models::BatchNorm2d host(s[1], 1e-5f, 1.0f);
      host.init(0);
      auto bn = host.clone(gpu());
      Context ctx(gpu());
      const Tensor y = to_host(ctx, bn->forward(to_gpu(x), ctx));
      const auto ref = testing::bn_reference(x, 1e-5, 1.0);
      EXPECT_LT(testing::max_rel_diff(y, ref.y), 1e-5);
      auto buffers = bn->named_buffers();
      for (auto& [name, b] : buffers) {
        if (name == "running_var") EXPECT_LT(testing::max_rel_diff(b->value.to(Device::cpu()), ref.running_var), 1e-5);
        if (name == "running_mean")
          EXPECT_LT(testing::max_rel_diff(b->value.to(Device::cpu()), ref.running_mean), 1e-6);
      }
    }
  }
}

}  // namespace
}  // namespace fanout
