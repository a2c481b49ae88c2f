// CUDA backend of kernels/activation.h. Declarations only; C++17, no CUDA headers.
// Preconditions are checked by the public entry points before these are called.
#pragma once
#include "runtime/core/context.h"
#include "runtime/core/tensor.h"

namespace fanout::kernels::cuda {

void relu_forward(Context& ctx, const Tensor& x, Tensor& y);
void relu_backward(Context& ctx, const Tensor& y, const Tensor& dy, Tensor& dx);

}  // namespace fanout::kernels::cuda
