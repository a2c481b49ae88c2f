// Low-type GEMM on the CPU (kernels/cpu/gemm.cpp): A and B of one type
// (bfloat16 or float16), products accumulated in float32 by oneDNN's matmul,
// C float32 or that type (rounded once, to nearest even), an optional float32
// bias added to every row before the rounding: what cuBLAS does for the CUDA
// linear layers under autocast. Used where the CPU multiplies the type
// natively (kernels::linear_rounds_in_low_type).
#pragma once
#include <cstdint>

#include "runtime/core/context.h"
#include "runtime/core/tensor.h"

namespace fanout::kernels::cpu {

// Whether oneDNN's matmul multiplies t (BF16 or F16) with kernels generated
// for this CPU's instructions (bfloat16 dot products of AVX-512 BF16 or
// AMX, say) in each of the linear layers' three products, rather than its
// reference or gemm-based fallbacks or not at all. Asked once per type.
bool low_gemm_native(DType t);

// C (m, n) = op(A) op(B) [+ bias] [+ C when accumulate], row-major with row
// strides lda, ldb, ldc; A and B of type ab, C of type c_type (F32 or ab).
void gemm_low(Context& ctx, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, DType ab, const void* a,
              int64_t lda, const void* b, int64_t ldb, const float* bias, bool accumulate, void* c, DType c_type,
              int64_t ldc);

}  // namespace fanout::kernels::cpu
