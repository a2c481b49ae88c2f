// Elementwise arithmetic over tensors of equal numel (and format). add also
// takes bfloat16 or float16 operands (all of one type and format): float32
// sums, rounded as they are stored; and into a float32 contiguous out, a and
// b of any floating storage (widened first).
#pragma once
#include "kernels/declare.h"
#include "runtime/core/context.h"
#include "runtime/core/tensor.h"

namespace fanout::kernels {

FANOUT_KERNEL_OPS(
// out = a + b (=); float32 operands are rounded to `round` when it is BF16
// or F16 (the float32 storage of autocast's residual add; F32 keeps the
// sum; low-type operands round to their own type anyway). out may alias a
// or b.
void add(Context& ctx, const Tensor& a, const Tensor& b, Tensor& out, DType round = DType::F32);
// y += alpha * x.
void axpy(Context& ctx, float alpha, const Tensor& x, Tensor& y);
// x *= alpha.
void scale(Context& ctx, float alpha, Tensor& x);
)

}  // namespace fanout::kernels
