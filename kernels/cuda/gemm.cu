// CUDA GEMM through cuBLAS on the context's compute stream; CPU counterpart in
// kernels/cpu/gemm.cpp. Row-major C = alpha * op(A) op(B) + beta * C is the
// column-major product C^T = op(B)^T op(A)^T, so the operands swap places and
// each keeps its own transpose flag and leading dimension.
// TF32 tensor cores only when ctx.math.allow_tf32 (CUBLAS_COMPUTE_32F_FAST_TF32);
// otherwise CUBLAS_COMPUTE_32F, full float32 products. Under autocast A and B
// go to cuBLAS in the low type (tensor cores; exact, as the linear layers
// pass low-type values), accumulated in float32; C is float32 or the low
// type, rounded once (the handle disallows reduced-precision reductions).
#include "kernels/gemm.h"

#include <climits>

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

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::F32: return CUDA_R_32F;
    case DType::BF16: return CUDA_R_16BF;
    case DType::F16: return CUDA_R_16F;
    default: FANOUT_FAIL() << "cuBLAS takes no " << dtype_name(t) << " operands";
  }
}
}  // namespace

namespace detail {

void gemm_ex(Context& ctx, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
             const void* a, DType a_type, int64_t lda, const void* b, DType b_type, int64_t ldb, float beta, void* c,
             DType c_type, int64_t ldc) {
  if (m == 0 || n == 0) return;
  const bool low = low_precision(ctx);
  const DType ab = low ? ctx.math.autocast : DType::F32;
  FANOUT_CHECK((a_type == DType::F32 || a_type == ab) && (b_type == DType::F32 || b_type == ab) &&
               (c_type == DType::F32 || c_type == ab))
      << "gemm: operands " << dtype_name(a_type) << ", " << dtype_name(b_type) << " and " << dtype_name(c_type)
      << " under autocast to " << dtype_name(ctx.math.autocast);
  DeviceScope scope(ctx);
  if (k == 0 || alpha == 0.0f) {
    if (beta == 1.0f) return;
    if (beta == 0.0f) {  // zeros, even over NaN (the BLAS convention): all-zero bits in every type
      const size_t size = dtype_size(c_type);
      FANOUT_CUDA_CHECK(cudaMemset2DAsync(c, static_cast<size_t>(ldc) * size, 0, static_cast<size_t>(n) * size,
                                          static_cast<size_t>(m), stream_of(ctx)));
      return;
    }
    FANOUT_CHECK(c_type == DType::F32) << "gemm: an empty product scaling a " << dtype_name(c_type) << " C";
    scale_matrix_kernel<<<grid_for(ctx, m * n), kThreads, 0, stream_of(ctx)>>>(static_cast<float*>(c), m, n, ldc,
                                                                              beta);
    FANOUT_CUDA_CHECK_LAUNCH();
    return;
  }
  auto handle = static_cast<cublasHandle_t>(ctx.cublas());
  const cublasComputeType_t compute = ctx.math.allow_tf32 && !low ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  // Float32 operands under autocast: the rows op(A) and op(B) span, narrowed
  // into low-type buffers with the same strides; low-type ones as they are.
  if (low && a_type == DType::F32) {
    const int64_t span = ((trans_a ? k : m) - 1) * lda + (trans_a ? m : k);
    Tensor l = low_buffer(ctx, 0, Shape{span});
    narrow_into(ctx, static_cast<const float*>(a), l, span);
    a = l.raw();
  }
  if (low && b_type == DType::F32) {
    const int64_t span = ((trans_b ? n : k) - 1) * ldb + (trans_b ? k : n);
    Tensor l = low_buffer(ctx, 1, Shape{span});
    narrow_into(ctx, static_cast<const float*>(b), l, span);
    b = l.raw();
  }
  const cudaDataType_t abt = cuda_type(ab);
  // cuBLAS takes int sizes and strides (kernels::gemm checks them first; the linear layers reach here directly).
  FANOUT_CHECK(m <= INT_MAX && n <= INT_MAX && k <= INT_MAX && lda <= INT_MAX && ldb <= INT_MAX && ldc <= INT_MAX)
      << "gemm: " << m << " x " << n << " x " << k << " does not fit cuBLAS's int sizes";
  FANOUT_CUBLAS_CHECK(cublasGemmEx(handle, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                                   static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), &alpha, b, abt,
                                   static_cast<int>(ldb), a, abt, static_cast<int>(lda), &beta, c, cuda_type(c_type),
                                   static_cast<int>(ldc), compute, CUBLAS_GEMM_DEFAULT));
}

}  // namespace detail

void gemm(Context& ctx, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  detail::gemm_ex(ctx, trans_a, trans_b, m, n, k, alpha, a, DType::F32, lda, b, DType::F32, ldb, beta, c, DType::F32,
                  ldc);
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
