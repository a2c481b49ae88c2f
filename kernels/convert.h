// Precision conversions on every backend: float32 to and from bfloat16 and
// float16 (round to nearest even, overflow to infinity, subnormals kept, NaN
// stays NaN; see runtime/core/half.h), and rounding float32 values to a
// lower precision in place (storing in that type and reading back), which is
// how CPU devices reproduce a GPU's low-precision tensors in float32.
#pragma once
#include "kernels/declare.h"
#include "runtime/core/context.h"
#include "runtime/core/tensor.h"

namespace fanout::kernels {

FANOUT_KERNEL_OPS(
// dst = src in dst's type: F32 -> BF16 or F16, or BF16 or F16 -> F32. Same numel.
void convert(Context& ctx, const Tensor& src, Tensor& dst);
// x (F32) = float(t(x)) for t BF16 or F16.
void round_to(Context& ctx, Tensor& x, DType t);
)

}  // namespace fanout::kernels
