// CPU backend of kernels/gemm.h: OpenBLAS cblas_sgemm, row-major.
// Preconditions are checked by the public entry point before this is called.
#pragma once
#include <cstdint>

#include "runtime/core/context.h"

namespace fanout::kernels::cpu {

// Row-major C = alpha * op(A) * op(B) + beta * C; see kernels/gemm.h.
void gemm(Context& ctx, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
          const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// openblas_set_num_threads: OpenBLAS's thread count is process-wide.
void set_blas_threads(int n);

}  // namespace fanout::kernels::cpu
