// Fully connected layer: y = x W^T + b, through kernels/gemm.h (whose
// autocast precondition holds for x, w and dy here). x, y, dy and dx may be
// float32, bfloat16 or float16 (staged, kernels/staging.h).
#pragma once
#include "kernels/declare.h"
#include "runtime/core/context.h"
#include "runtime/core/tensor.h"

namespace fanout::kernels {

FANOUT_KERNEL_OPS(
// x (N, in), w (out, in), b (out) or null; y (N, out) is written (=).
void linear_forward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor* b, Tensor& y);
// dy (N, out). dx (N, in) is written (=) when non-null; dw += dy^T x; db += sum_n dy when non-null.
void linear_backward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dx, Tensor& dw,
                     Tensor* db);
)

}  // namespace fanout::kernels
