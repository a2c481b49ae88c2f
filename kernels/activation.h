// Elementwise activations.
#pragma once
#include "kernels/declare.h"
#include "runtime/core/context.h"
#include "runtime/core/tensor.h"

namespace fanout::kernels {

FANOUT_KERNEL_OPS(
// y = max(x, 0), written (=). y may alias x.
void relu_forward(Context& ctx, const Tensor& x, Tensor& y);
// dx = dy where y > 0 else 0, written (=). dx may alias dy.
void relu_backward(Context& ctx, const Tensor& y, const Tensor& dy, Tensor& dx);
)

}  // namespace fanout::kernels
