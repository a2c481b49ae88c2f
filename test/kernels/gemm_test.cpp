// GEMM on every backend (oneDNN's matmul on CPU, cuBLAS on CUDA) against a naive
// double reference: all transposes, padded leading dimensions, alpha/beta,
// k == 0, large K, TF32; and argument errors.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "kernels/backend_test_util.h"
#include "kernels/gemm.h"
#include "runtime/core/error.h"
#include "runtime/core/half.h"

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

struct GemmCase {
  bool ta, tb;
  int64_t m, n, k;
  float alpha, beta;
};

class GemmOnBackend : public ft::BackendTest {
 protected:
  // One GEMM with padded leading dimensions against the float64 reference;
  // C's padding columns must be left alone, and with beta == 0 C is not read.
  void check(const GemmCase& g, const MathOptions& math, double cpu_tol, double cuda_rtol, std::mt19937_64& rng) {
    SCOPED_TRACE(::testing::Message() << "ta=" << g.ta << " tb=" << g.tb << " m=" << g.m << " n=" << g.n
                                      << " k=" << g.k << " alpha=" << g.alpha << " beta=" << g.beta);
    ctx().math = math;
    const int64_t a_rows = g.ta ? g.k : g.m, a_cols = g.ta ? g.m : g.k;
    const int64_t b_rows = g.tb ? g.n : g.k, b_cols = g.tb ? g.k : g.n;
    const int64_t lda = a_cols + 3, ldb = b_cols + 2, ldc = g.n + 1;
    Tensor a = ft::random_tensor(Shape{a_rows, lda}, rng);
    Tensor b = ft::random_tensor(Shape{b_rows, ldb}, rng);
    if (math.autocast != DType::F32)  // the operands the layers pass under autocast: low-type values
      for (Tensor* t : {&a, &b})
        for (int64_t i = 0; i < t->numel(); ++i)
          t->f32()[i] = math.autocast == DType::BF16 ? half::float_from_bf16(half::bf16_from_float(t->f32()[i]))
                                                     : half::float_from_f16(half::f16_from_float(t->f32()[i]));
    Tensor c0 = ft::random_tensor(Shape{g.m, ldc}, rng);
    if (g.beta == 0.0f) ft::poison(c0);  // beta == 0 must overwrite NaN
    Tensor ad = up(a), bd = up(b), cd = up(c0);
    kernels::gemm(ctx(), g.ta, g.tb, g.m, g.n, g.k, g.alpha, ad.f32(), lda, bd.f32(), ldb, g.beta, cd.f32(), ldc);
    const Tensor c = down(cd);
    const auto ref =
        naive_gemm(g.ta, g.tb, g.m, g.n, g.k, g.alpha, a.f32(), lda, b.f32(), ldb, g.beta, c0.f32(), ldc);
    Tensor got = Tensor::empty(Shape{g.m, g.n});
    for (int64_t i = 0; i < g.m; ++i) {
      for (int64_t j = 0; j < g.n; ++j) got.f32()[i * g.n + j] = c.f32()[i * ldc + j];
      const float before = c0.f32()[i * ldc + g.n], after = c.f32()[i * ldc + g.n];
      EXPECT_TRUE((std::isnan(before) && std::isnan(after)) || before == after) << "padding of C written, row " << i;
    }
    EXPECT_TRUE(matches(got, ref, cpu_tol, cuda_rtol));
    EXPECT_GT(ft::l2_norm(got), 0.0);
  }
};
FANOUT_ON_EVERY_BACKEND(GemmOnBackend);

TEST_P(GemmOnBackend, AllTransposesWithPaddedLeadingDims) {
  std::mt19937_64 rng(11);
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      for (float beta : {0.0f, 0.5f}) check({ta, tb, 5, 7, 9, 0.7f, beta}, {}, 1e-5, 1e-4, rng);
      check({ta, tb, 37, 29, 53, 0.7f, 0.0f}, {}, 1e-5, 1e-4, rng);
      check({ta, tb, 5, 67, 3, 1.0f, 0.5f}, {}, 1e-5, 1e-4, rng);
      check({ta, tb, 1, 1, 1, -2.0f, 1.0f}, {}, 1e-5, 1e-4, rng);
    }
}

TEST_P(GemmOnBackend, LargeSizes) {
  // Not multiples of any block; large enough for oneDNN's blocked (brgemm)
  // kernels and cuBLAS's split-K paths.
  std::mt19937_64 rng(13);
  check({true, false, 67, 131, 93, 1.0f, 0.0f}, {}, 1e-5, 1e-4, rng);
  check({false, true, 65, 47, 4099, 1.0f, 0.0f}, {}, 1e-5, 1e-3, rng);
  check({true, false, 33, 130, 2051, 0.5f, 1.0f}, {}, 1e-5, 1e-3, rng);
}

TEST_P(GemmOnBackend, Tf32WithinTf32Tolerance) {
  if (!on_cuda()) GTEST_SKIP() << "TF32 is a CUDA math mode; the CPU computes in float32";
  std::mt19937_64 rng(14);
  MathOptions m;
  m.allow_tf32 = true;
  // TF32 keeps 10 mantissa bits: ~1e-3 relative per product, growing with sqrt(K).
  check({false, false, 64, 64, 256, 1.0f, 0.0f}, m, 1e-5, 2e-2, rng);
}

// Under autocast CUDA hands cuBLAS A and B in the low type (tensor cores,
// float32 accumulation into float32 C); the CPU multiplies in float32. The
// operands hold low-type values, so both match the float64 product of the
// same values.
TEST_P(GemmOnBackend, LowPrecisionOperands) {
  std::mt19937_64 rng(15);
  for (DType t : {DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(t));
    MathOptions m;
    m.autocast = t;
    for (bool ta : {false, true})
      for (bool tb : {false, true}) check({ta, tb, 37, 29, 53, 0.7f, 0.5f}, m, 1e-5, 1e-4, rng);
    check({false, true, 65, 47, 2051, 1.0f, 1.0f}, m, 1e-5, 1e-3, rng);
  }
}

TEST_P(GemmOnBackend, ZeroInnerDimensionOrAlphaScalesC) {
  // k == 0: C = beta * C; with beta == 0, zeros even over NaN (BLAS convention).
  std::mt19937_64 rng(12);
  const int64_t m = 7, n = 9;
  Tensor c0 = ft::random_tensor(Shape{m, n}, rng);
  Tensor cd = up(c0);
  kernels::gemm(ctx(), false, false, m, n, 0, 1.0f, nullptr, 1, nullptr, n, 0.25f, cd.f32(), n);
  const Tensor c = down(cd);
  for (int64_t i = 0; i < m * n; ++i) EXPECT_FLOAT_EQ(c.f32()[i], 0.25f * c0.f32()[i]);
  Tensor pd = poisoned(Shape{m, n});
  kernels::gemm(ctx(), false, false, m, n, 0, 1.0f, nullptr, 1, nullptr, n, 0.0f, pd.f32(), n);
  const Tensor z = down(pd);
  for (int64_t i = 0; i < m * n; ++i) EXPECT_EQ(z.f32()[i], 0.0f) << "k == 0, beta == 0 at " << i;
  // alpha == 0 and beta == 0: zeros over NaN too.
  Tensor qd = poisoned(Shape{m, n});
  Tensor a = up(ft::random_tensor(Shape{m, 3}, rng)), b = up(ft::random_tensor(Shape{3, n}, rng));
  kernels::gemm(ctx(), false, false, m, n, 3, 0.0f, a.f32(), 3, b.f32(), n, 0.0f, qd.f32(), n);
  const Tensor q = down(qd);
  for (int64_t i = 0; i < m * n; ++i) EXPECT_EQ(q.f32()[i], 0.0f) << "alpha == 0 at " << i;
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
}

// Strided-batched GEMM: each matrix against the float64 reference; the gaps
// between C's matrices and C's padding columns are poisoned and must stay so.
TEST_P(GemmOnBackend, StridedBatchedAgainstFloat64) {
  std::mt19937_64 rng(21);
  struct Case {
    int64_t m, n, k;
  };
  for (const Case& s : {Case{5, 7, 9}, Case{13, 3, 17}, Case{64, 48, 32}})
    for (int64_t batch : {1, 5})
      for (bool ta : {false, true})
        for (bool tb : {false, true})
          for (float beta : {0.0f, 1.0f}) {
            SCOPED_TRACE(::testing::Message() << "ta=" << ta << " tb=" << tb << " m=" << s.m << " n=" << s.n
                                              << " k=" << s.k << " batch=" << batch << " beta=" << beta);
            const float alpha = 0.7f;
            const int64_t a_rows = ta ? s.k : s.m, a_cols = ta ? s.m : s.k;
            const int64_t b_rows = tb ? s.n : s.k, b_cols = tb ? s.k : s.n;
            const int64_t lda = a_cols + 3, ldb = b_cols + 2, ldc = s.n + 1;
            const int64_t sa = a_rows * lda + 5, sb = b_rows * ldb + 3, sc = s.m * ldc + 7;
            Tensor a = ft::random_tensor(Shape{batch * sa}, rng), b = ft::random_tensor(Shape{batch * sb}, rng);
            Tensor c0 = ft::random_tensor(Shape{batch * sc}, rng);
            // Everything outside the (m, n) matrices is poisoned; with beta == 0 all of C is.
            std::vector<bool> inside(static_cast<size_t>(batch * sc), false);
            for (int64_t t = 0; t < batch; ++t)
              for (int64_t i = 0; i < s.m; ++i)
                for (int64_t j = 0; j < s.n; ++j) inside[static_cast<size_t>(t * sc + i * ldc + j)] = true;
            for (int64_t i = 0; i < c0.numel(); ++i)
              if (beta == 0.0f || !inside[static_cast<size_t>(i)])
                c0.f32()[i] = std::numeric_limits<float>::quiet_NaN();
            Tensor ad = up(a), bd = up(b), cd = up(c0);
            kernels::gemm_strided_batched(ctx(), ta, tb, s.m, s.n, s.k, alpha, ad.f32(), lda, sa, bd.f32(), ldb, sb,
                                          beta, cd.f32(), ldc, sc, batch);
            const Tensor c = down(cd);
            for (int64_t i = 0; i < c.numel(); ++i)
              if (!inside[static_cast<size_t>(i)]) ASSERT_TRUE(std::isnan(c.f32()[i])) << "gap written at " << i;
            for (int64_t t = 0; t < batch; ++t) {
              const auto ref = naive_gemm(ta, tb, s.m, s.n, s.k, alpha, a.f32() + t * sa, lda, b.f32() + t * sb, ldb,
                                          beta, c0.f32() + t * sc, ldc);
              Tensor got = Tensor::empty(Shape{s.m, s.n});
              for (int64_t i = 0; i < s.m; ++i)
                for (int64_t j = 0; j < s.n; ++j) got.f32()[i * s.n + j] = c.f32()[t * sc + i * ldc + j];
              EXPECT_TRUE(matches(got, ref, 1e-5, 1e-4)) << "matrix " << t;
              EXPECT_GT(ft::l2_norm(got), 0.0);
            }
          }
}

// k == 0 scales every C matrix by beta (zeros over NaN with beta == 0).
TEST_P(GemmOnBackend, StridedBatchedZeroInnerDimension) {
  const int64_t m = 3, n = 4, batch = 3, sc = m * n + 2;
  Tensor cd = poisoned(Shape{batch * sc});
  kernels::gemm_strided_batched(ctx(), false, false, m, n, 0, 1.0f, nullptr, 1, 0, nullptr, n, 0, 0.0f, cd.f32(), n,
                                sc, batch);
  const Tensor c = down(cd);
  for (int64_t i = 0; i < c.numel(); ++i) {
    if (i % sc < m * n) EXPECT_EQ(c.f32()[i], 0.0f) << i;
    else EXPECT_TRUE(std::isnan(c.f32()[i])) << "gap written at " << i;
  }
}

TEST(Gemm, StridedBatchedBadArgumentsThrow) {
  Context ctx(Device::cpu());
  std::vector<float> a(256), b(256), c(256);
  // Overlapping C matrices.
  EXPECT_THROW(kernels::gemm_strided_batched(ctx, false, false, 2, 2, 2, 1.0f, a.data(), 2, 4, b.data(), 2, 4, 0.0f,
                                             c.data(), 2, 3, 2),
               Error);
  // Negative stride.
  EXPECT_THROW(kernels::gemm_strided_batched(ctx, false, false, 2, 2, 2, 1.0f, a.data(), 2, -4, b.data(), 2, 4, 0.0f,
                                             c.data(), 2, 4, 2),
               Error);
  // lda too small, negative batch.
  EXPECT_THROW(kernels::gemm_strided_batched(ctx, false, false, 2, 2, 4, 1.0f, a.data(), 3, 8, b.data(), 2, 8, 0.0f,
                                             c.data(), 2, 4, 2),
               Error);
  EXPECT_THROW(kernels::gemm_strided_batched(ctx, false, false, 2, 2, 2, 1.0f, a.data(), 2, 4, b.data(), 2, 4, 0.0f,
                                             c.data(), 2, 4, -1),
               Error);
}

}  // namespace
}  // namespace fanout
