// CUDA GEMM (cuBLAS) and fully connected layer against the CPU ops on fresh
// random inputs, sizes that are not multiples of 32, padded leading
// dimensions, poisoned outputs and accumulated (+=) gradients.
#include <gtest/gtest.h>

#include "cuda/cuda_test_util.h"
#include "kernels/gemm.h"
#include "kernels/linear.h"

namespace fanout {
namespace {

using cudatest::close;
using cudatest::gpu;
using cudatest::to_gpu;
using cudatest::to_host;
using testing::random_tensor;

struct GemmCase {
  bool ta, tb;
  int64_t m, n, k;
  float alpha, beta;
};

// Runs one GEMM on both devices with lda/ldb/ldc padded by 3 and checks C,
// including that the padding columns of C are left alone.
void check_gemm(const GemmCase& g, const MathOptions& math, double rtol, uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << "ta=" << g.ta << " tb=" << g.tb << " m=" << g.m << " n=" << g.n
                                    << " k=" << g.k << " alpha=" << g.alpha << " beta=" << g.beta);
  std::mt19937_64 rng(seed);
  const int64_t a_rows = g.ta ? g.k : g.m, a_cols = g.ta ? g.m : g.k;
  const int64_t b_rows = g.tb ? g.n : g.k, b_cols = g.tb ? g.k : g.n;
  const int64_t lda = a_cols + 3, ldb = b_cols + 3, ldc = g.n + 3;
  Tensor a = random_tensor(Shape{a_rows, lda}, rng);
  Tensor b = random_tensor(Shape{b_rows, ldb}, rng);
  Tensor c0 = random_tensor(Shape{g.m, ldc}, rng);
  if (g.beta == 0.0f) testing::poison(c0);  // beta == 0: C must not be read
  Tensor c_cpu = c0.to(Device::cpu());
  Context cctx(Device::cpu());
  kernels::gemm(cctx, g.ta, g.tb, g.m, g.n, g.k, g.alpha, a.f32(), lda, b.f32(), ldb, g.beta, c_cpu.f32(), ldc);

  Context ctx(gpu());
  ctx.math = math;
  Tensor ad = to_gpu(a), bd = to_gpu(b), cd = to_gpu(c0);
  kernels::gemm(ctx, g.ta, g.tb, g.m, g.n, g.k, g.alpha, ad.f32(), lda, bd.f32(), ldb, g.beta, cd.f32(), ldc);
  Tensor c_gpu = to_host(ctx, cd);

  // Compare the (m, n) block; the 3 padding columns must be untouched.
  Tensor got = Tensor::empty(Shape{g.m, g.n}), want = Tensor::empty(Shape{g.m, g.n});
  for (int64_t i = 0; i < g.m; ++i) {
    for (int64_t j = 0; j < g.n; ++j) {
      got.f32()[i * g.n + j] = c_gpu.f32()[i * ldc + j];
      want.f32()[i * g.n + j] = c_cpu.f32()[i * ldc + j];
    }
    for (int64_t j = g.n; j < ldc; ++j) {
      const float before = c0.f32()[i * ldc + j], after = c_gpu.f32()[i * ldc + j];
      EXPECT_TRUE((std::isnan(before) && std::isnan(after)) || before == after) << "padding of C written at " << i;
    }
  }
  EXPECT_TRUE(close(got, want, rtol));
}

TEST(CudaGemm, AllTransposesMatchCpu) {
  FANOUT_SKIP_WITHOUT_GPU();
  uint64_t seed = 1;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      check_gemm({ta, tb, 37, 29, 53, 0.7f, 0.0f}, {}, 1e-4, seed++);
      check_gemm({ta, tb, 5, 67, 3, 1.0f, 0.5f}, {}, 1e-4, seed++);
      check_gemm({ta, tb, 1, 1, 1, -2.0f, 1.0f}, {}, 1e-4, seed++);
    }
}

TEST(CudaGemm, LargeKMatchesCpu) {
  FANOUT_SKIP_WITHOUT_GPU();
  check_gemm({false, true, 65, 47, 4099, 1.0f, 0.0f}, {}, 1e-3, 11);
  check_gemm({true, false, 33, 130, 2051, 0.5f, 1.0f}, {}, 1e-3, 12);
}

TEST(CudaGemm, Tf32RunsWithinTf32Tolerance) {
  FANOUT_SKIP_WITHOUT_GPU();
  MathOptions m;
  m.allow_tf32 = true;
  // TF32 keeps 10 mantissa bits: ~1e-3 relative per product, growing with sqrt(K).
  check_gemm({false, false, 64, 64, 256, 1.0f, 0.0f}, m, 2e-2, 13);
}

TEST(CudaGemm, ZeroKOrAlphaScalesC) {
  FANOUT_SKIP_WITHOUT_GPU();
  // k == 0: C = beta * C; with beta == 0, zeros even over NaN (BLAS convention).
  std::mt19937_64 rng(14);
  const int64_t m = 7, n = 9;
  Context ctx(gpu());
  Tensor c0 = random_tensor(Shape{m, n}, rng);
  Tensor cd = to_gpu(c0);
  kernels::gemm(ctx, false, false, m, n, 0, 1.0f, nullptr, 1, nullptr, n, 0.25f, cd.f32(), n);
  Tensor got = to_host(ctx, cd);
  for (int64_t i = 0; i < m * n; ++i) EXPECT_FLOAT_EQ(got.f32()[i], 0.25f * c0.f32()[i]);
  Tensor pd = cudatest::poisoned_gpu(Shape{m, n});
  Tensor a = to_gpu(random_tensor(Shape{m, 3}, rng)), b = to_gpu(random_tensor(Shape{3, n}, rng));
  kernels::gemm(ctx, false, false, m, n, 3, 0.0f, a.f32(), 3, b.f32(), n, 0.0f, pd.f32(), n);
  got = to_host(ctx, pd);
  for (int64_t i = 0; i < m * n; ++i) EXPECT_EQ(got.f32()[i], 0.0f) << i;
}

// Linear forward (=) and backward (dx =, dw +=, db +=) on both devices.
void check_linear(int64_t batch, int64_t in, int64_t out, bool bias, bool want_dx, uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << "linear " << batch << "x" << in << " -> " << out << " bias=" << bias
                                    << " dx=" << want_dx);
  std::mt19937_64 rng(seed);
  Tensor x = random_tensor(Shape{batch, in}, rng), w = random_tensor(Shape{out, in}, rng);
  Tensor b = random_tensor(Shape{out}, rng), dy = random_tensor(Shape{batch, out}, rng);
  Tensor dw0 = random_tensor(Shape{out, in}, rng), db0 = random_tensor(Shape{out}, rng);
  Context cctx(Device::cpu());
  Tensor y_cpu = cudatest::poisoned_cpu(Shape{batch, out});
  kernels::linear_forward(cctx, x, w, bias ? &b : nullptr, y_cpu);
  Tensor dx_cpu = cudatest::poisoned_cpu(x.shape()), dw_cpu = dw0.to(Device::cpu()), db_cpu = db0.to(Device::cpu());
  kernels::linear_backward(cctx, x, w, dy, want_dx ? &dx_cpu : nullptr, dw_cpu, bias ? &db_cpu : nullptr);

  Context ctx(gpu());
  Tensor xd = to_gpu(x), wd = to_gpu(w), bd = to_gpu(b), dyd = to_gpu(dy);
  Tensor yd = cudatest::poisoned_gpu(Shape{batch, out});
  kernels::linear_forward(ctx, xd, wd, bias ? &bd : nullptr, yd);
  Tensor dxd = cudatest::poisoned_gpu(x.shape()), dwd = to_gpu(dw0), dbd = to_gpu(db0);
  kernels::linear_backward(ctx, xd, wd, dyd, want_dx ? &dxd : nullptr, dwd, bias ? &dbd : nullptr);

  EXPECT_TRUE(close(to_host(ctx, yd), y_cpu, 1e-4)) << "y";
  if (want_dx) {
    EXPECT_TRUE(close(to_host(ctx, dxd), dx_cpu, 1e-4)) << "dx";
  }
  EXPECT_TRUE(close(to_host(ctx, dwd), dw_cpu, 1e-4)) << "dw (+=)";
  if (bias) {
    EXPECT_TRUE(close(to_host(ctx, dbd), db_cpu, 1e-4)) << "db (+=)";
  }
}

TEST(CudaLinear, ForwardBackwardMatchCpu) {
  FANOUT_SKIP_WITHOUT_GPU();
  check_linear(3, 7, 5, true, true, 21);
  check_linear(37, 129, 10, true, true, 22);
  check_linear(13, 33, 65, false, true, 23);
  check_linear(5, 257, 3, true, false, 24);
}

}  // namespace
}  // namespace fanout
