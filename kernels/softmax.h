// Softmax over the last dimension (torch.softmax(x, -1)), with an optional
// causal mask, and its backward: the probabilities of attention's scores.
// x is viewed as (rows, n), n = x's last size. Float32 in and out; each row's
// max is subtracted before exp (large logits are safe), its sums are in
// double. A row whose entries are all -inf gives zeros, never NaN.
#pragma once
#include "kernels/declare.h"
#include "runtime/core/context.h"
#include "runtime/core/tensor.h"

namespace fanout::kernels {

FANOUT_KERNEL_OPS(
// y (=) softmax of x's rows, x's shape; y may alias x. causal: x is
// (..., T, T) and row r is query i = r mod T, whose keys j > i are masked
// (-inf before the softmax: probability exactly 0).
void softmax_forward(Context& ctx, const Tensor& x, bool causal, Tensor& y);
// dx (=) y * (dy - sum(dy * y)) per row, y's shape; dx may alias dy. Masked
// positions have y = 0, so they get dx = 0 with no mask to pass.
void softmax_backward(Context& ctx, const Tensor& y, const Tensor& dy, Tensor& dx);
)

}  // namespace fanout::kernels
