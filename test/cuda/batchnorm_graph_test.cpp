// cuDNN's fused batch-norm graphs on cuda:0 (kernels/cuda/batchnorm_cudnn.cu):
// for the shapes and storage they are built for (4-D bfloat16 and float16
// channels-last, channels a multiple of 8) the graphs must actually run: the
// op tests pass on the split kernels' fallback too, so a graph refused on
// every shape would go unseen. Each case checks that nothing was refused
// (the one stderr line per refused shape), that the forward graph ran (it
// leaves the float64 `stats` unwritten, the split kernels write them) and
// kept the ReLU's bit mask, and that forward and backward (g over dy, as
// the layer calls it) agree with the split kernels on the same inputs (the
// backward's on the graph's y and statistics).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>

#include "cuda/cuda_test_util.h"
#include "kernels/batchnorm.h"
#include "kernels/storage_test_util.h"

namespace fanout {
namespace {

using cudatest::gpu;
using cudatest::to_gpu;
namespace ft = testing;

// One way's outputs on cuda:0, poisoned (the running statistics their start).
struct Outputs {
  Tensor stats, y, mean, invstd, rm, rv, gs, g, dx;
  Outputs(const Shape& s, DType t, const Tensor& rm0, const Tensor& rv0, const Tensor& dy) {
    const int64_t c = s[1];
    stats = to_gpu(cudatest::poisoned_host(Shape{3, c}, DType::F64));
    mean = cudatest::poisoned_gpu(Shape{2, c});
    invstd = cudatest::poisoned_gpu(Shape{c});
    rm = to_gpu(rm0);
    rv = to_gpu(rv0);
    y = to_gpu(testing::poisoned_stored(s, t, MemoryFormat::ChannelsLast));
    g = to_gpu(dy);  // the backward's g over dy
    gs = cudatest::poisoned_gpu(Shape{2, c});
    dx = to_gpu(testing::poisoned_stored(s, t, MemoryFormat::ChannelsLast));
  }
};

TEST(CudaBatchNormGraphs, RunOnTheShapesTheyAreBuiltFor) {
  FANOUT_SKIP_WITHOUT_GPU();
  Context ctx(gpu());
  std::mt19937_64 rng(91);
  // Shapes used by no other test in this process (plans and refusals are
  // cached per shape, and a refusal is logged once).
  for (DType t : {DType::BF16, DType::F16})
    for (int64_t c : {16, 24})
      for (bool with_z : {true, false}) {
        const Shape s{3, c, 6, 5};
        SCOPED_TRACE(std::string(dtype_name(t)) + " C=" + std::to_string(c) + (with_z ? " with z" : ""));
        const MemoryFormat cl = MemoryFormat::ChannelsLast;
        const Tensor x = to_gpu(ft::random_stored(s, t, cl, rng, -2.0f, 3.0f));
        const Tensor z = to_gpu(ft::random_stored(s, t, cl, rng));
        const Tensor dy_host = ft::random_stored(s, t, cl, rng);
        const Tensor gamma = to_gpu(ft::random_tensor(Shape{c}, rng)), beta = to_gpu(ft::random_tensor(Shape{c}, rng));
        const Tensor rm0 = ft::random_tensor(Shape{c}, rng);
        Tensor rv0 = ft::random_tensor(Shape{c}, rng);
        for (int64_t i = 0; i < c; ++i) rv0.f32()[i] = 0.5f + std::abs(rv0.f32()[i]);
        const float eps = 1e-5f, momentum = 0.1f;
        ASSERT_EQ(kernels::bn_relu_mask_bytes(ctx, x), (s.numel() + 7) / 8);

        // The fused pair, as models/layers/batchnorm.cpp calls it.
        Outputs f(s, t, rm0, rv0, dy_host);
        Tensor mask = Tensor::empty(Shape{(s.numel() + 7) / 8}, DType::U8, gpu());
        ::testing::internal::CaptureStderr();
        const bool mask_written = kernels::bn_train_add_relu(ctx, x, with_z ? &z : nullptr, gamma, beta, eps, momentum,
                                                             f.stats, f.mean, f.invstd, f.rm, f.rv, f.y, &mask, t);
        kernels::bn_backward_relu(ctx, x, f.y, f.g, f.mean, f.invstd, gamma, mask_written ? &mask : nullptr, f.gs,
                                  f.g, f.dx);
        ctx.compute().synchronize();
        const std::string log = ::testing::internal::GetCapturedStderr();
        EXPECT_EQ(log.find("refused"), std::string::npos) << log;
        EXPECT_TRUE(mask_written) << "the forward graph kept no ReLU mask";
        const Tensor stats_after = f.stats.to(Device::cpu());
        EXPECT_TRUE(std::isnan(stats_after.f64()[0])) << "the split kernels ran: they wrote the float64 statistics";

        // The split kernels on the same inputs.
        Outputs r(s, t, rm0, rv0, dy_host);
        kernels::bn_stats(ctx, x, r.stats);
        kernels::bn_finalize(ctx, r.stats, s.numel() / c, eps, momentum, r.mean, r.invstd, &r.rm, &r.rv);
        kernels::bn_apply_add_relu(ctx, x, r.mean, r.invstd, gamma, beta, with_z ? &z : nullptr, r.y, t);
        // The backward from the graph's own y and statistics: the same ReLU
        // mask (a y rounded the other way at 0 would move a whole dy).
        kernels::bn_backward_reduce_relu(ctx, x, f.y, r.g, f.mean, f.invstd, r.gs, r.g);
        kernels::bn_backward_apply(ctx, x, r.g, f.mean, f.invstd, gamma, r.gs, s.numel() / c, r.dx);
        ctx.compute().synchronize();

        // Float32 statistics against the split kernels' float64 ones; the
        // low-type outputs within a few of the type's roundings (the graph
        // does not round the sum before the ReLU).
        const double u = ft::unit_roundoff(t);
        EXPECT_TRUE(cudatest::close(f.mean.to(Device::cpu()), r.mean.to(Device::cpu()), 1e-5));
        EXPECT_TRUE(cudatest::close(f.invstd.to(Device::cpu()), r.invstd.to(Device::cpu()), 1e-5));
        EXPECT_TRUE(cudatest::close(f.rm.to(Device::cpu()), r.rm.to(Device::cpu()), 1e-5));
        EXPECT_TRUE(cudatest::close(f.rv.to(Device::cpu()), r.rv.to(Device::cpu()), 1e-5));
        EXPECT_TRUE(cudatest::close(f.y.to(Device::cpu()), r.y.to(Device::cpu()), 4 * u));
        EXPECT_TRUE(cudatest::close(f.g.to(Device::cpu()), r.g.to(Device::cpu()), 0.0));
        EXPECT_TRUE(cudatest::close(f.gs.to(Device::cpu()), r.gs.to(Device::cpu()), 16 * u));
        EXPECT_TRUE(cudatest::close(f.dx.to(Device::cpu()), r.dx.to(Device::cpu()), 16 * u));
      }
}

}  // namespace
}  // namespace fanout
