// CUDA backend of kernels/gemm.h (cuBLAS on the context's compute stream).
// Declarations only; C++17, no CUDA headers, so .cu files and C++20 code both include it.
#pragma once
#include <cstdint>

#include "runtime/core/context.h"

namespace fanout::kernels::cuda {

// Row-major C = alpha * op(A) * op(B) + beta * C; see kernels/gemm.h.
void gemm(Context& ctx, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
          const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

}  // namespace fanout::kernels::cuda
