// Fully connected layer: y = x W^T + b. x, y, dy and dx may be float32,
// bfloat16 or float16 (staged, kernels/staging.h, where a backend does not
// read them); b, dw and db are float32, w float32 or, where the kernels
// round in the low type, stored in it.
//
// Under autocast, linear_rounds_in_low_type(ctx) says who rounds:
//   true (CUDA; a CPU whose oneDNN multiplies the low type natively, outside
//     split-invariant math): the kernels take x, w and dy as they are and
//     round them to the low type as they read them, multiply in it with
//     float32 accumulation, and return y (after its bias), dx and dW's term
//     rounded, dW's term then added to the float32 dw; b must hold values
//     of the low type (the layer rounds it) and db is summed from dy as
//     given (the layer rounds dy under a bias);
//   false: x, w and dy must hold low-type values (the layer rounds them), the
//     products and dW's sum are float32, and the layer rounds y, dx and dW.
#pragma once
#include "kernels/declare.h"
#include "runtime/core/context.h"
#include "runtime/core/tensor.h"

namespace fanout::kernels {

FANOUT_KERNEL_OPS(
bool linear_rounds_in_low_type(const Context& ctx);
// x (N, in), w (out, in), b (out) or null; y (N, out) is written (=).
void linear_forward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor* b, Tensor& y);
// dy (N, out). dx (N, in) is written (=) when non-null; dw += dy^T x; db += sum_n dy when non-null.
void linear_backward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dx, Tensor& dw,
                     Tensor* db);
)

}  // namespace fanout::kernels
