// CUDA GEMM through cuBLAS on the context's compute stream; CPU counterpart in
// kernels/cpu/gemm.cpp. Row-major C = alpha * op(A) op(B) + beta * C is the
// column-major product C^T = op(B)^T op(A)^T, so the operands swap places and
// each keeps its own transpose flag and leading dimension.
// TF32 tensor cores only when ctx.math.allow_tf32 (CUBLAS_COMPUTE_32F_FAST_TF32);
// otherwise CUBLAS_COMPUTE_32F, full float32 products. Under autocast A and B
// go to cuBLAS in the low type (tensor cores; exact, as the linear layers
// pass low-type values) and C stays float32, computed in float32.
#include "kernels/gemm.h"

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/low_precision.cuh"

namespace fanout::kernels::cuda {

namespace {
// C (m, n), row stride ldc: C = beta * C, or zeros when beta == 0 (even over
// NaN, the BLAS convention). Used when k == 0 or alpha == 0, as the CPU path.
__global__ void scale_matrix_kernel(float* c, int64_t m, int64_t n, int64_t ldc, float beta) {
  const int64_t total = m * n;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / n, col = i - r * n;
    float& v = c[r * ldc + col];
    v = beta == 0.0f ? 0.0f : v * beta;
  }
}
}  // namespace

void gemm(Context& ctx, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  detail::DeviceScope scope(ctx);
  if (k == 0 || alpha == 0.0f) {
    if (beta == 1.0f) return;
    scale_matrix_kernel<<<detail::grid_for(ctx, m * n), detail::kThreads, 0, detail::stream_of(ctx)>>>(c, m, n, ldc,
                                                                                                     beta);
    FANOUT_CUDA_CHECK_LAUNCH();
    return;
  }
  auto handle = static_cast<cublasHandle_t>(ctx.cublas());  // bound to ctx.compute() at creation
  const bool low = detail::low_precision(ctx);
  const cublasComputeType_t compute =
      ctx.math.allow_tf32 && !low ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  const void *ap = a, *bp = b;
  cudaDataType_t ab_type = CUDA_R_32F;
  if (low) {
    // The rows op(A) and op(B) span in memory, narrowed into low-type buffers with the same strides.
    const int64_t a_span = ((trans_a ? k : m) - 1) * lda + (trans_a ? m : k);
    const int64_t b_span = ((trans_b ? n : k) - 1) * ldb + (trans_b ? k : n);
    Tensor al = detail::low_buffer(ctx, 0, Shape{a_span}), bl = detail::low_buffer(ctx, 1, Shape{b_span});
    detail::narrow_into(ctx, a, al, a_span);
    detail::narrow_into(ctx, b, bl, b_span);
    ap = al.raw();
    bp = bl.raw();
    ab_type = ctx.math.autocast == DType::BF16 ? CUDA_R_16BF : CUDA_R_16F;
  }
  // Sizes and strides were checked to fit in int by the public entry point.
  FANOUT_CUBLAS_CHECK(cublasGemmEx(handle, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                                   static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), &alpha, bp, ab_type,
                                   static_cast<int>(ldb), ap, ab_type, static_cast<int>(lda), &beta, c, CUDA_R_32F,
                                   static_cast<int>(ldc), compute, CUBLAS_GEMM_DEFAULT));
}

// Float32 operands always (no autocast narrowing); TF32 only when
// ctx.math.allow_tf32, as gemm.
void gemm_strided_batched(Context& ctx, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                          const float* a, int64_t lda, int64_t stride_a, const float* b, int64_t ldb,
                          int64_t stride_b, float beta, float* c, int64_t ldc, int64_t stride_c, int64_t batch) {
  detail::DeviceScope scope(ctx);
  if (k == 0 || alpha == 0.0f) {
    if (beta == 1.0f) return;
    for (int64_t i = 0; i < batch; ++i) {
      scale_matrix_kernel<<<detail::grid_for(ctx, m * n), detail::kThreads, 0, detail::stream_of(ctx)>>>(
          c + i * stride_c, m, n, ldc, beta);
      FANOUT_CUDA_CHECK_LAUNCH();
    }
    return;
  }
  auto handle = static_cast<cublasHandle_t>(ctx.cublas());
  const cublasComputeType_t compute = ctx.math.allow_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  FANOUT_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      handle, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(n),
      static_cast<int>(m), static_cast<int>(k), &alpha, b, CUDA_R_32F, static_cast<int>(ldb), stride_b, a,
      CUDA_R_32F, static_cast<int>(lda), stride_a, &beta, c, CUDA_R_32F, static_cast<int>(ldc), stride_c,
      static_cast<int>(batch), compute, CUBLAS_GEMM_DEFAULT));
}

}  // namespace fanout::kernels::cuda
