// CUDA convolution (cuDNN) against the CPU im2col path: kernels 1/3/5,
// strides 1/2, paddings 0/1/2, odd sizes, with and without bias, under the
// default heuristics, the deterministic filter and the timed search.
// y and dx are poisoned (=); dw and db start from random values (+=).
#include <gtest/gtest.h>

#include "cuda/cuda_test_util.h"
#include "kernels/conv2d.h"

namespace fanout {
namespace {

using cudatest::close;
using cudatest::gpu;
using cudatest::to_gpu;
using cudatest::to_host;
using testing::random_tensor;

struct ConvCase {
  int64_t n, c, h, w, oc, k, stride, pad;
  bool bias;
};

void check_conv(const ConvCase& cc, const MathOptions& math, double rtol, uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << "x (" << cc.n << ", " << cc.c << ", " << cc.h << ", " << cc.w << "), oc "
                                    << cc.oc << ", kernel " << cc.k << ", stride " << cc.stride << ", pad " << cc.pad
                                    << ", bias " << cc.bias << ", deterministic " << math.deterministic
                                    << ", benchmark " << math.cudnn_benchmark);
  std::mt19937_64 rng(seed);
  const kernels::Conv2dGeometry g{cc.stride, cc.pad};
  Tensor x = random_tensor(Shape{cc.n, cc.c, cc.h, cc.w}, rng);
  Tensor w = random_tensor(Shape{cc.oc, cc.c, cc.k, cc.k}, rng);
  Tensor b = random_tensor(Shape{cc.oc}, rng);
  const Shape ys = kernels::conv2d_output_shape(x.shape(), w.shape(), g);
  Tensor dy = random_tensor(ys, rng);
  Tensor dw0 = random_tensor(w.shape(), rng), db0 = random_tensor(b.shape(), rng);
  const Tensor* bias = cc.bias ? &b : nullptr;

  Context cctx(Device::cpu());
  Tensor y_cpu = cudatest::poisoned_cpu(ys);
  kernels::conv2d_forward(cctx, x, w, bias, g, y_cpu);
  Tensor dx_cpu = cudatest::poisoned_cpu(x.shape()), dw_cpu = dw0.to(Device::cpu()), db_cpu = db0.to(Device::cpu());
  kernels::conv2d_backward(cctx, x, w, dy, g, &dx_cpu, dw_cpu, cc.bias ? &db_cpu : nullptr);

  Context ctx(gpu());
  ctx.math = math;
  Tensor xd = to_gpu(x), wd = to_gpu(w), bd = to_gpu(b), dyd = to_gpu(dy);
  Tensor yd = cudatest::poisoned_gpu(ys);
  kernels::conv2d_forward(ctx, xd, wd, cc.bias ? &bd : nullptr, g, yd);
  Tensor dxd = cudatest::poisoned_gpu(x.shape()), dwd = to_gpu(dw0), dbd = to_gpu(db0);
  kernels::conv2d_backward(ctx, xd, wd, dyd, g, &dxd, dwd, cc.bias ? &dbd : nullptr);
  EXPECT_TRUE(close(to_host(ctx, yd), y_cpu, rtol)) << "y";
  EXPECT_TRUE(close(to_host(ctx, dxd), dx_cpu, rtol)) << "dx";
  EXPECT_TRUE(close(to_host(ctx, dwd), dw_cpu, rtol)) << "dw (+=)";
  if (cc.bias) {
    EXPECT_TRUE(close(to_host(ctx, dbd), db_cpu, rtol)) << "db (+=)";
  }

  // Second call on the same shapes reuses the cached plan; dw accumulates again.
  Tensor dw_cpu2 = dw_cpu.to(Device::cpu());
  Tensor db_cpu2 = db_cpu.to(Device::cpu());
  kernels::conv2d_backward(cctx, x, w, dy, g, nullptr, dw_cpu2, cc.bias ? &db_cpu2 : nullptr);
  kernels::conv2d_backward(ctx, xd, wd, dyd, g, nullptr, dwd, cc.bias ? &dbd : nullptr);
  EXPECT_TRUE(close(to_host(ctx, dwd), dw_cpu2, rtol)) << "dw after a second backward without dx";
  if (cc.bias) {
    EXPECT_TRUE(close(to_host(ctx, dbd), db_cpu2, rtol)) << "db after a second backward";
  }
}

TEST(CudaConv2d, GeometriesMatchCpu) {
  FANOUT_SKIP_WITHOUT_GPU();
  uint64_t seed = 100;
  for (int64_t k : {1, 3, 5})
    for (int64_t stride : {1, 2})
      for (int64_t pad : {0, 1, 2}) {
        check_conv({3, 5, 7, 9, 4, k, stride, pad, true}, {}, 1e-4, seed++);
        check_conv({2, 3, 9, 7, 6, k, stride, pad, false}, {}, 1e-4, seed++);
      }
}

TEST(CudaConv2d, DeterministicAlgorithmsMatchCpu) {
  FANOUT_SKIP_WITHOUT_GPU();
  MathOptions m;
  m.deterministic = true;
  uint64_t seed = 200;
  for (int64_t k : {1, 3, 5}) check_conv({3, 5, 7, 9, 4, k, 2, 1, true}, m, 1e-4, seed++);
  check_conv({4, 16, 12, 12, 32, 3, 1, 1, false}, m, 1e-3, seed++);
}

TEST(CudaConv2d, BenchmarkSearchMatchesCpu) {
  FANOUT_SKIP_WITHOUT_GPU();
  MathOptions m;
  m.cudnn_benchmark = true;
  uint64_t seed = 300;
  for (int64_t k : {1, 3, 5}) check_conv({3, 5, 7, 9, 4, k, 1, 2, true}, m, 1e-4, seed++);
  m.deterministic = true;
  check_conv({3, 5, 7, 9, 4, 3, 2, 0, true}, m, 1e-4, seed++);
}

TEST(CudaConv2d, LargerLayerMatchesCpu) {
  FANOUT_SKIP_WITHOUT_GPU();
  // K = 64 * 3 * 3 = 576 per output, and N * OH * OW = 1152 per weight gradient.
  check_conv({8, 64, 13, 11, 96, 3, 1, 1, true}, {}, 1e-3, 400);
  check_conv({8, 64, 13, 11, 96, 3, 2, 1, false}, {}, 1e-3, 401);
}

TEST(CudaConv2d, Tf32RunsWithinTf32Tolerance) {
  FANOUT_SKIP_WITHOUT_GPU();
  MathOptions m;
  m.allow_tf32 = true;
  check_conv({4, 32, 10, 10, 48, 3, 1, 1, true}, m, 3e-2, 500);
}

}  // namespace
}  // namespace fanout
