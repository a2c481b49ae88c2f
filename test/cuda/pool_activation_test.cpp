// CUDA pooling (max with argmax, average, global average), ReLU and the
// elementwise ops against the CPU ones: odd sizes, several geometries, ties,
// outputs poisoned, aliasing where the API allows it, misaligned views (the
// scalar path of the float4 kernels).
#include <gtest/gtest.h>

#include <cmath>

#include "cuda/cuda_test_util.h"
#include "kernels/activation.h"
#include "kernels/elementwise.h"
#include "kernels/pool.h"

namespace fanout {
namespace {

using cudatest::close;
using cudatest::equal_i32;
using cudatest::gpu;
using cudatest::poisoned_cpu;
using cudatest::poisoned_gpu;
using cudatest::to_gpu;
using cudatest::to_host;
using testing::random_tensor;

// Inputs rounded to a few values, so windows hold ties (first maximum wins).
Tensor tied_tensor(const Shape& s, std::mt19937_64& rng) {
  Tensor t = random_tensor(s, rng);
  for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = std::round(t.f32()[i] * 2.0f) / 2.0f;
  return t;
}

void check_maxpool(const Shape& xs, const kernels::PoolGeometry& g, bool ties, bool deterministic, uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << "maxpool x " << xs.str() << " kernel " << g.kernel << " stride " << g.stride
                                    << " pad " << g.padding << " ties " << ties << " deterministic "
                                    << deterministic);
  std::mt19937_64 rng(seed);
  Tensor x = ties ? tied_tensor(xs, rng) : random_tensor(xs, rng);
  const Shape ys = kernels::pool2d_output_shape(xs, g);
  Tensor dy = random_tensor(ys, rng);
  Context cctx(Device::cpu());
  Tensor y = poisoned_cpu(ys), am = Tensor::empty(ys, DType::I32), dx = poisoned_cpu(xs);
  kernels::maxpool2d_forward(cctx, x, g, y, am);
  kernels::maxpool2d_backward(cctx, dy, am, dx);

  Context ctx(gpu());
  ctx.math.deterministic = deterministic;
  Tensor xd = to_gpu(x), yd = poisoned_gpu(ys), amd = poisoned_gpu(ys, DType::I32), dyd = to_gpu(dy);
  Tensor dxd = poisoned_gpu(xs);
  kernels::maxpool2d_forward(ctx, xd, g, yd, amd);
  kernels::maxpool2d_backward(ctx, dyd, amd, dxd);
  EXPECT_TRUE(close(to_host(ctx, yd), y, 1e-6)) << "y";
  EXPECT_TRUE(equal_i32(to_host(ctx, amd), am)) << "argmax";
  EXPECT_TRUE(close(to_host(ctx, dxd), dx, 1e-5)) << "dx";
}

TEST(CudaPool, MaxPoolMatchesCpu) {
  FANOUT_SKIP_WITHOUT_GPU();
  uint64_t seed = 1;
  const kernels::PoolGeometry geoms[] = {{2, 2, 0}, {3, 2, 1}, {3, 1, 1}, {2, 1, 0}, {5, 3, 2}};
  for (const auto& g : geoms)
    for (bool ties : {false, true})
      for (bool det : {false, true}) check_maxpool(Shape{3, 5, 7, 9}, g, ties, det, seed++);
  check_maxpool(Shape{4, 64, 32, 32}, {3, 2, 1}, false, false, seed++);
}

void check_avgpool(const Shape& xs, const kernels::PoolGeometry& g, uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << "avgpool x " << xs.str() << " kernel " << g.kernel << " stride " << g.stride
                                    << " pad " << g.padding);
  std::mt19937_64 rng(seed);
  Tensor x = random_tensor(xs, rng);
  const Shape ys = kernels::pool2d_output_shape(xs, g);
  Tensor dy = random_tensor(ys, rng);
  Context cctx(Device::cpu());
  Tensor y = poisoned_cpu(ys), dx = poisoned_cpu(xs);
  kernels::avgpool2d_forward(cctx, x, g, y);
  kernels::avgpool2d_backward(cctx, dy, g, dx);
  Context ctx(gpu());
  Tensor xd = to_gpu(x), yd = poisoned_gpu(ys), dyd = to_gpu(dy), dxd = poisoned_gpu(xs);
  kernels::avgpool2d_forward(ctx, xd, g, yd);
  kernels::avgpool2d_backward(ctx, dyd, g, dxd);
  EXPECT_TRUE(close(to_host(ctx, yd), y, 1e-5)) << "y";
  EXPECT_TRUE(close(to_host(ctx, dxd), dx, 1e-5)) << "dx";
}

TEST(CudaPool, AvgPoolMatchesCpu) {
  FANOUT_SKIP_WITHOUT_GPU();
  uint64_t seed = 50;
  const kernels::PoolGeometry geoms[] = {{2, 2, 0}, {3, 2, 1}, {3, 1, 1}, {2, 1, 0}, {5, 3, 2}, {4, 4, 2}};
  for (const auto& g : geoms) check_avgpool(Shape{3, 5, 7, 9}, g, seed++);
}

TEST(CudaPool, GlobalAvgPoolMatchesCpu) {
  FANOUT_SKIP_WITHOUT_GPU();
  uint64_t seed = 70;
  for (const Shape& xs : {Shape{3, 5, 7, 9}, Shape{2, 513, 1, 1}, Shape{2, 3, 45, 47}}) {
    SCOPED_TRACE(xs.str());
    std::mt19937_64 rng(seed++);
    Tensor x = random_tensor(xs, rng);
    const Shape ys{xs[0], xs[1], 1, 1};
    Tensor dy = random_tensor(ys, rng);
    Context cctx(Device::cpu());
    Tensor y = poisoned_cpu(ys), dx = poisoned_cpu(xs);
    kernels::global_avgpool_forward(cctx, x, y);
    kernels::global_avgpool_backward(cctx, dy, dx);
    Context ctx(gpu());
    Tensor xd = to_gpu(x), yd = poisoned_gpu(ys), dyd = to_gpu(dy), dxd = poisoned_gpu(xs);
    kernels::global_avgpool_forward(ctx, xd, yd);
    kernels::global_avgpool_backward(ctx, dyd, dxd);
    EXPECT_TRUE(close(to_host(ctx, yd), y, 1e-5)) << "y";
    EXPECT_TRUE(close(to_host(ctx, dxd), dx, 1e-6)) << "dx";
  }
}

TEST(CudaActivation, ReluMatchesCpu) {
  FANOUT_SKIP_WITHOUT_GPU();
  for (int64_t n : {int64_t{1}, int64_t{3}, int64_t{257}, int64_t{3 * 5 * 7 * 9}, int64_t{100003}}) {
    SCOPED_TRACE(n);
    std::mt19937_64 rng(static_cast<uint64_t>(n));
    Tensor x = random_tensor(Shape{n}, rng), dy = random_tensor(Shape{n}, rng);
    x.f32()[0] = 0.5f;  // at least one positive element, so norms are non-zero
    Context cctx(Device::cpu());
    Tensor y = poisoned_cpu(x.shape()), dx = poisoned_cpu(x.shape());
    kernels::relu_forward(cctx, x, y);
    kernels::relu_backward(cctx, y, dy, dx);
    Context ctx(gpu());
    Tensor xd = to_gpu(x), yd = poisoned_gpu(x.shape()), dyd = to_gpu(dy), dxd = poisoned_gpu(x.shape());
    kernels::relu_forward(ctx, xd, yd);
    kernels::relu_backward(ctx, yd, dyd, dxd);
    EXPECT_TRUE(close(to_host(ctx, yd), y, 0.0)) << "y";
    EXPECT_TRUE(close(to_host(ctx, dxd), dx, 0.0)) << "dx";
    // In place: y aliases x, dx aliases dy.
    kernels::relu_forward(ctx, xd, xd);
    kernels::relu_backward(ctx, xd, dyd, dyd);
    EXPECT_TRUE(close(to_host(ctx, xd), y, 0.0)) << "y in place";
    EXPECT_TRUE(close(to_host(ctx, dyd), dx, 0.0)) << "dx in place";
  }
}

TEST(CudaElementwise, AddAxpyScaleMatchCpu) {
  FANOUT_SKIP_WITHOUT_GPU();
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{1029}, int64_t{100003}}) {
    for (int64_t offset : {0, 1}) {  // offset 1: misaligned views take the scalar path
      SCOPED_TRACE(::testing::Message() << "n " << n << " offset " << offset);
      std::mt19937_64 rng(static_cast<uint64_t>(n * 2 + offset));
      Tensor a = random_tensor(Shape{n + offset}, rng), b = random_tensor(Shape{n + offset}, rng);
      Context cctx(Device::cpu());
      Context ctx(gpu());
      Tensor ac = a.flat(offset, Shape{n}), bc = b.flat(offset, Shape{n});
      Tensor ad_full = to_gpu(a), bd_full = to_gpu(b);
      Tensor ad = ad_full.flat(offset, Shape{n}), bd = bd_full.flat(offset, Shape{n});

      Tensor out = poisoned_cpu(Shape{n});
      kernels::add(cctx, ac, bc, out);
      Tensor outd_full = poisoned_gpu(Shape{n + offset});
      Tensor outd = outd_full.flat(offset, Shape{n});
      kernels::add(ctx, ad, bd, outd);
      EXPECT_TRUE(close(to_host(ctx, outd), out, 0.0)) << "add";

      Tensor y = bc.to(Device::cpu());
      kernels::axpy(cctx, -0.75f, ac, y);
      Tensor yd_full = to_gpu(b);
      Tensor yd = yd_full.flat(offset, Shape{n});
      kernels::axpy(ctx, -0.75f, ad, yd);
      EXPECT_TRUE(close(to_host(ctx, yd), y, 1e-6)) << "axpy";

      Tensor s = ac.to(Device::cpu());
      kernels::scale(cctx, 1.5f, s);
      kernels::scale(ctx, 1.5f, ad);
      EXPECT_TRUE(close(to_host(ctx, ad), s, 0.0)) << "scale";

      // add in place: out aliases a.
      Tensor ip = s.to(Device::cpu());
      kernels::add(cctx, ip, bc, ip);
      kernels::add(ctx, ad, bd, ad);
      EXPECT_TRUE(close(to_host(ctx, ad), ip, 0.0)) << "add in place";
    }
  }
}

}  // namespace
}  // namespace fanout
