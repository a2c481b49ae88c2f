// Precision and memory-format conversions on every backend: float32 to and
// from bfloat16 and float16 (round to nearest even, overflow to infinity,
// subnormals kept, NaN stays NaN; see runtime/core/half.h), contiguous to
// and from channels-last, and rounding float32 values to a
// lower precision in place (storing in that type and reading back), which is
// how CPU devices reproduce a GPU's low-precision tensors in float32.
#pragma once
#include "kernels/declare.h"
#include "runtime/core/context.h"
#include "runtime/core/tensor.h"

namespace fanout::kernels {

FANOUT_KERNEL_OPS(
// dst = src in dst's type and memory format: any of float32, bfloat16 and
// float16 to any, rounded to nearest even when narrowing; contiguous to
// channels-last or back moves dim 1 (same shape), contiguous to contiguous
// needs only the same numel. dst may not overlap src unless it is src.
void convert(Context& ctx, const Tensor& src, Tensor& dst);
// x (F32) = float(t(x)) for t BF16 or F16.
void round_to(Context& ctx, Tensor& x, DType t);
// Channels-last copies for kernels that read and write (N, spatial..., C),
// like cuDNN's tensor-core convolutions. src (d0, d1, d2, ..., dk) F32, k >= 2:
// dst (d0, d2, ..., dk, d1) in BF16 or F16 = src narrowed, dim 1 moved last.
void narrow_channels_last(Context& ctx, const Tensor& src, Tensor& dst);
// The way back: src (d0, d2, ..., dk, d1) in BF16 or F16, dst (d0, d1, ...,
// dk) F32 = widen(src) with its last dim moved to 1; dst += it when accumulate.
void widen_channels_first(Context& ctx, const Tensor& src, Tensor& dst, bool accumulate);
)

// (d0, d2, ..., dk, d1): the channels-last shape of s (s has 3 or more dims).
Shape channels_last_shape(const Shape& s);

}  // namespace fanout::kernels
