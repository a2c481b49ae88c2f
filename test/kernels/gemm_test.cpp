// GEMM (OpenBLAS row-major) against a naive double reference, all transposes,
// padded leading dimensions, alpha/beta, k == 0, and argument errors.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "kernels/gemm.h"
#include "runtime/core/error.h"
#include "support/test_util.h"

namespace fanout {
namespace {

namespace ft = fanout::testing;

// C = alpha * op(A) op(B) + beta * C0 in double.
std::vector<double> naive_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const float* a,
                               int64_t lda, const float* b, int64_t ldb, double beta, const float* c0, int64_t ldc) {
  std::vector<double> c(m * n);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t p = 0; p < k; ++p) {
        const double av = ta ? a[p * lda + i] : a[i * lda + p];
        const double bv = tb ? b[j * ldb + p] : b[p * ldb + j];
        s += av * bv;
      }
      c[i * n + j] = alpha * s + (beta == 0 ? 0.0 : beta * c0[i * ldc + j]);
    }
  return c;
}

TEST(Gemm, AllTransposesWithPaddedLeadingDims) {
  Context ctx(Device::cpu());
  std::mt19937_64 rng(11);
  const int64_t m = 5, n = 7, k = 9;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb)
      for (float beta : {0.0f, 0.5f}) {
        const int64_t a_rows = ta ? k : m, a_cols = ta ? m : k, b_rows = tb ? n : k, b_cols = tb ? k : n;
        const int64_t lda = a_cols + 3, ldb = b_cols + 2, ldc = n + 1;
        Tensor a = ft::random_tensor(Shape{a_rows, lda}, rng);
        Tensor b = ft::random_tensor(Shape{b_rows, ldb}, rng);
        Tensor c = ft::random_tensor(Shape{m, ldc}, rng);
        if (beta == 0.0f) ft::poison(c);  // beta == 0 must overwrite NaN
        Tensor c0 = ft::clone(c);
        kernels::gemm(ctx, ta, tb, m, n, k, 0.7f, a.f32(), lda, b.f32(), ldb, beta, c.f32(), ldc);
        auto ref = naive_gemm(ta, tb, m, n, k, 0.7, a.f32(), lda, b.f32(), ldb, beta, c0.f32(), ldc);
        double norm = 0;
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t j = 0; j < n; ++j) {
            EXPECT_NEAR(c.f32()[i * ldc + j], ref[i * n + j], 1e-5) << ta << tb << " beta " << beta;
            norm += std::abs(c.f32()[i * ldc + j]);
          }
          // Padding columns past n are untouched.
          EXPECT_EQ(std::isnan(c.f32()[i * ldc + n]), std::isnan(c0.f32()[i * ldc + n]));
        }
        EXPECT_GT(norm, 0.0);
      }
}

TEST(Gemm, ZeroInnerDimensionScalesC) {
  Context ctx(Device::cpu());
  std::mt19937_64 rng(12);
  Tensor c = ft::random_tensor(Shape{3, 4}, rng);
  Tensor c0 = ft::clone(c);
  kernels::gemm(ctx, false, false, 3, 4, 0, 1.0f, nullptr, 1, nullptr, 4, 2.0f, c.f32(), 4);
  for (int i = 0; i < 12; ++i) EXPECT_FLOAT_EQ(c.f32()[i], 2.0f * c0.f32()[i]);
  ft::poison(c);
  kernels::gemm(ctx, false, false, 3, 4, 0, 1.0f, nullptr, 1, nullptr, 4, 0.0f, c.f32(), 4);
  for (int i = 0; i < 12; ++i) EXPECT_EQ(c.f32()[i], 0.0f);
}

TEST(Gemm, LargeEnoughForBlockedPath) {
  // Sizes that are not multiples of any block, large enough for OpenBLAS's packed kernels.
  Context ctx(Device::cpu());
  std::mt19937_64 rng(13);
  const int64_t m = 67, n = 131, k = 93;
  Tensor a = ft::random_tensor(Shape{k, m}, rng);  // transposed
  Tensor b = ft::random_tensor(Shape{k, n}, rng);
  Tensor c = Tensor::empty(Shape{m, n});
  ft::poison(c);
  kernels::gemm(ctx, true, false, m, n, k, 1.0f, a.f32(), m, b.f32(), n, 0.0f, c.f32(), n);
  auto ref = naive_gemm(true, false, m, n, k, 1.0, a.f32(), m, b.f32(), n, 0.0, nullptr, n);
  double worst = 0;
  for (int64_t i = 0; i < m * n; ++i) worst = std::max(worst, std::abs(c.f32()[i] - ref[i]));
  EXPECT_LT(worst, 1e-4);
  EXPECT_GT(ft::l2_norm(c), 0.0);
}

TEST(Gemm, BadArgumentsThrow) {
  Context ctx(Device::cpu());
  std::vector<float> a(64), b(64), c(64);
  // lda smaller than the stored row length K.
  EXPECT_THROW(kernels::gemm(ctx, false, false, 2, 2, 4, 1.0f, a.data(), 3, b.data(), 2, 0.0f, c.data(), 2), Error);
  // ldc smaller than N.
  EXPECT_THROW(kernels::gemm(ctx, false, false, 2, 4, 2, 1.0f, a.data(), 2, b.data(), 4, 0.0f, c.data(), 3), Error);
  // Negative size.
  EXPECT_THROW(kernels::gemm(ctx, false, false, -1, 2, 2, 1.0f, a.data(), 2, b.data(), 2, 0.0f, c.data(), 2), Error);
  // Transposed B stored (N, K): ldb must be >= K.
  EXPECT_THROW(kernels::gemm(ctx, false, true, 2, 2, 4, 1.0f, a.data(), 4, b.data(), 2, 0.0f, c.data(), 2), Error);
  EXPECT_THROW(kernels::set_cpu_blas_threads(0), Error);
  EXPECT_NO_THROW(kernels::set_cpu_blas_threads(1));
}

}  // namespace
}  // namespace fanout
