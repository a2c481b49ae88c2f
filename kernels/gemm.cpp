// Public GEMM entry point: checks sizes and leading dimensions, then
// dispatches to oneDNN (CPU) or cuBLAS (CUDA).
#include "kernels/gemm.h"

#include <algorithm>
#include <climits>

#include "kernels/dispatch.h"

namespace fanout::kernels {

void gemm(Context& ctx, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  FANOUT_CHECK(m >= 0 && n >= 0 && k >= 0 && m <= INT_MAX && n <= INT_MAX && k <= INT_MAX)
      << "gemm: bad sizes m=" << m << " n=" << n << " k=" << k;
  // Stored shapes: A is (M, K) or, transposed, (K, M); B is (K, N) or (N, K).
  const int64_t a_cols = trans_a ? m : k, b_cols = trans_b ? k : n;
  FANOUT_CHECK(lda >= std::max<int64_t>(1, a_cols) && ldb >= std::max<int64_t>(1, b_cols) &&
               ldc >= std::max<int64_t>(1, n) && lda <= INT_MAX && ldb <= INT_MAX && ldc <= INT_MAX)
      << "gemm: bad leading dimensions lda=" << lda << " ldb=" << ldb << " ldc=" << ldc << " for m=" << m
      << " n=" << n << " k=" << k << " trans_a=" << trans_a << " trans_b=" << trans_b;
  FANOUT_CHECK((m == 0 || n == 0 || c != nullptr) && (m == 0 || n == 0 || k == 0 || (a != nullptr && b != nullptr)))
      << "gemm: null matrix pointer for m=" << m << " n=" << n << " k=" << k;
  FANOUT_DISPATCH(ctx, gemm, ctx, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void gemm_strided_batched(Context& ctx, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                          const float* a, int64_t lda, int64_t stride_a, const float* b, int64_t ldb,
                          int64_t stride_b, float beta, float* c, int64_t ldc, int64_t stride_c, int64_t batch) {
  const char* op = "gemm_strided_batched";
  FANOUT_CHECK(m >= 0 && n >= 0 && k >= 0 && batch >= 0 && m <= INT_MAX && n <= INT_MAX && k <= INT_MAX &&
               batch <= INT_MAX)
      << op << ": bad sizes m=" << m << " n=" << n << " k=" << k << " batch=" << batch;
  const int64_t a_cols = trans_a ? m : k, b_cols = trans_b ? k : n;
  FANOUT_CHECK(lda >= std::max<int64_t>(1, a_cols) && ldb >= std::max<int64_t>(1, b_cols) &&
               ldc >= std::max<int64_t>(1, n) && lda <= INT_MAX && ldb <= INT_MAX && ldc <= INT_MAX)
      << op << ": bad leading dimensions lda=" << lda << " ldb=" << ldb << " ldc=" << ldc << " for m=" << m
      << " n=" << n << " k=" << k << " trans_a=" << trans_a << " trans_b=" << trans_b;
  // C's matrices span (m - 1) * ldc + n elements each; the next must start past it.
  const int64_t c_span = m == 0 || n == 0 ? 0 : (m - 1) * ldc + n;
  FANOUT_CHECK(stride_a >= 0 && stride_b >= 0 && stride_c >= 0 && (batch <= 1 || stride_c >= c_span))
      << op << ": bad batch strides stride_a=" << stride_a << " stride_b=" << stride_b << " stride_c=" << stride_c
      << " for C matrices of " << c_span << " elements";
  FANOUT_CHECK((m == 0 || n == 0 || batch == 0 || c != nullptr) &&
               (m == 0 || n == 0 || k == 0 || batch == 0 || (a != nullptr && b != nullptr)))
      << op << ": null matrix pointer for m=" << m << " n=" << n << " k=" << k;
  if (m == 0 || n == 0 || batch == 0) return;
  FANOUT_DISPATCH(ctx, gemm_strided_batched, ctx, trans_a, trans_b, m, n, k, alpha, a, lda, stride_a, b, ldb,
                  stride_b, beta, c, ldc, stride_c, batch);
}

}  // namespace fanout::kernels
