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
// `batch` independent GEMMs, as gemm's arguments: the i-th multiplies
// a + i * stride_a by b + i * stride_b into c + i * stride_c (element
// strides, >= 0; C's matrices must not overlap). Float32 only (no autocast
// narrowing); on CUDA TF32 when ctx.math.allow_tf32, as gemm. Memory between
// C's matrices (and C's padding columns) is left untouched.
void gemm_strided_batched(Context& ctx, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                          const float* a, int64_t lda, int64_t stride_a, const float* b, int64_t ldb,
                          int64_t stride_b, float beta, float* c, int64_t ldc, int64_t stride_c, int64_t batch);
)

}  // namespace fanout::kernels
