// CPU GEMM through OpenBLAS (row-major cblas_sgemm).
#include "kernels/gemm.h"

#include <cblas.h>

#include <algorithm>

namespace fanout::kernels::cpu {

void gemm(Context&, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0 || alpha == 0.0f) {
    // C = beta * C; beta == 0 writes zeros even over NaN (BLAS convention).
    for (int64_t i = 0; i < m; ++i) {
      float* row = c + i * ldc;
      if (beta == 0.0f) std::fill(row, row + n, 0.0f);
      else if (beta != 1.0f)
        for (int64_t j = 0; j < n; ++j) row[j] *= beta;
    }
    return;
  }
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha, a, static_cast<int>(lda), b,
              static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
}

void set_blas_threads(int n) { openblas_set_num_threads(n); }

}  // namespace fanout::kernels::cpu
