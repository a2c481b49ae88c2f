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

}  // namespace fanout::kernels
