// Elementwise arithmetic over float32 tensors of equal numel.
#pragma once
#include "kernels/declare.h"
#include "runtime/core/context.h"
#include "runtime/core/tensor.h"

namespace fanout::kernels {

FANOUT_KERNEL_OPS(
// out = a + b (=), rounded to `round` when it is BF16 or F16 (autocast's
// residual add; F32 keeps the float32 sum). out may alias a or b.
void add(Context& ctx, const Tensor& a, const Tensor& b, Tensor& out, DType round = DType::F32);
// y += alpha * x.
void axpy(Context& ctx, float alpha, const Tensor& x, Tensor& y);
// x *= alpha.
void scale(Context& ctx, float alpha, Tensor& x);
)

}  // namespace fanout::kernels
