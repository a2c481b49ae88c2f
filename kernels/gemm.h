// Row-major GEMM on any device: C = alpha * op(A) * op(B) + beta * C.
// CPU: oneDNN's matmul (threads: Context::math.cpu_threads). CUDA: cuBLAS on the context's compute stream.
// Under autocast (ctx.math.autocast BF16 or F16) A and B must hold values of
// that type: CUDA hands them to cuBLAS in it (C stays float32); the CPU
// multiplies in float32. Callers under autocast are the linear layers only.
#pragma once
#include <cstdint>

#include "kernels/declare.h"
#include "runtime/core/context.h"

namespace fanout::kernels {

FANOUT_KERNEL_OPS(
// op(A) is (M, K), op(B) is (K, N), C is (M, N); lda/ldb/ldc are row strides.
void gemm(Context& ctx, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
          const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);
)

}  // namespace fanout::kernels
